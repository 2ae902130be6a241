"""The rendered startup script on an emulated VM, run as the emulation runs it (the VM's
emulated systemd runs the script, which starts multislice-trainer.service), with a loopback
metadata server, a loopback GCS (fake-gcs-server) and fake interpreters: identity, supervision
by the unit (restart backoff, 78 never restarted, start limit), SIGTERM to the VM, re-runs.
The boot's faults (metadata, virtualenv build) are tests/startup/test_faults.py; the release
record is tests/startup/test_release.py."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from infra import startup, vm_contract as contract
from infra.emulated.units import parse_service
from infra.startup import boot
from infra.startup.bundle import MACHINE_ONLY_PACKAGES
from tests.fakes.startup_vm import (  # noqa: F401 (fixtures)
    BUCKET,
    RUN_DIR,
    TPU_ENV,
    Vm,
    dev_stack,
    gcs,
    prefixed,
    script,
    vm,
)

ROOT = Path(__file__).resolve().parents[2]


def test_runs_the_bundled_trainer(vm, dev_stack, script):
    result = vm.run()
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout)
    assert "fake trainer attempt 1 on stdout" in lines
    assert "fake trainer attempt 1 on stderr" in lines
    assert "trainer: exited with status 0: training is complete" in lines
    assert vm.attempts == 1

    release = vm.home / "releases" / script.release_id
    argv = vm.argv(1)
    assert argv[0] == str(vm.bin / "python")
    assert argv[1:] == [
        "-m", "training", "run",
        "--config", str(release / "config.json"),
        "--run-dir", RUN_DIR,
    ]  # fmt: skip
    assert (vm.fake_dir / "cwd.1").read_text().strip() == str(release)
    env = vm.environ(1)
    assert env["PYTHONPATH"] == str(release)
    assert env["PASS_THROUGH_CHECK"] == "kept as is"  # the VM's environment reaches the unit
    assert env["GCE_METADATA_IP"] == vm.metadata.address
    assert (env["MULTISLICE_SLICE"], env["MULTISLICE_WORKER"]) == ("1", "2")
    # The stack's compilation cache: a folder of the run directory's bucket, shared by every run.
    assert env[contract.COMPILATION_CACHE_ENV] == f"gs://{BUCKET}/{contract.COMPILATION_CACHE_FOLDER}"
    assert (release / "config.json").read_text() == dev_stack.training.model_dump_json() + "\n"
    bundled = sorted(p.relative_to(release).as_posix() for p in release.rglob("*.py"))
    assert bundled == sorted(
        f"training/{p.relative_to(ROOT / 'training').as_posix()}"
        for p in (ROOT / "training").rglob("*.py")
        if p.relative_to(ROOT / "training").parts[0] not in MACHINE_ONLY_PACKAGES
    )
    assert (release / ".complete").is_file()
    assert not (vm.home / "venvs").exists(), "MULTISLICE_PYTHON must skip the venv step"
    assert not (vm.fake_dir / "calls").exists(), "nothing may be installed with MULTISLICE_PYTHON"
    paths = [p.split("?")[0].rsplit("/", 1)[-1] for p in vm.metadata.requests]
    assert {"agent-worker-number", "tpu-env", "multislice-run-dir", "token"} <= set(paths)
    # One line per boot phase, each with the slice and worker.
    for phase in ("boot: stack dev", "release: ", "venv: ", "trainer: (re)starting multislice-trainer.service"):
        assert any(line.startswith(phase) for line in lines), (phase, lines)


def test_the_unit_is_what_systemd_reads(vm, script):
    """The unit file the script writes: the directives docs/vm-boot.md describes, accepted by
    systemd-analyze verify where systemd is installed."""
    assert vm.run().returncode == 0
    unit_file = vm.unit_dir / startup.TRAINER_UNIT
    unit = parse_service(unit_file.read_text(), startup.TRAINER_UNIT)
    release = vm.home / "releases" / script.release_id
    assert unit.exec_start == (
        "/bin/bash",
        f"{release}/trainer.sh",
        "run",
        str(vm.bin / "python"),
        f"{release}/config.json",
        RUN_DIR,
    )
    assert unit.restart == "on-failure" and unit.restart_prevent_exit_status == {
        startup.CONFIG_ERROR_STATUS,
        startup.RELEASE_SUPERSEDED_STATUS,
    }
    assert unit.success_exit_status == unit.restart_force_exit_status == {boot.PLANNED_STOP_STATUS}
    assert unit.kill_signal == signal.SIGTERM and unit.kill_mode == "control-group"
    assert unit.timeout_stop_sec == startup.STOP_TIMEOUT_S >= 30  # covers a Spot VM's whole notice
    assert (unit.start_limit_burst, unit.start_limit_interval_sec) == (
        startup.MAX_RESTARTS + 1,
        startup.START_LIMIT_INTERVAL_S,
    )
    assert unit.exec_stop_post == (("/bin/bash", f"{release}/trainer.sh", "stopped", str(vm.bin / "python"), RUN_DIR),)
    analyze = shutil.which("systemd-analyze")
    if analyze:
        result = subprocess.run([analyze, "verify", str(unit_file)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Unknown key" not in result.stderr and "Unknown section" not in result.stderr


def test_rebooting_on_the_same_disk_reuses_everything(vm, script):
    first = vm.run()
    assert first.returncode == 0, first.stdout
    release = vm.home / "releases" / script.release_id
    marker = (release / ".complete").stat().st_mtime_ns
    unit = (vm.unit_dir / startup.TRAINER_UNIT).stat().st_mtime_ns
    time.sleep(0.02)
    second = vm.run()
    assert second.returncode == 0, second.stdout
    lines = prefixed(second.stdout)
    assert "trainer: starting multislice-trainer.service (logs: journalctl -u multislice-trainer.service)" in lines
    assert (release / ".complete").stat().st_mtime_ns == marker
    assert (vm.unit_dir / startup.TRAINER_UNIT).stat().st_mtime_ns == unit
    assert sorted(p.name for p in (vm.home / "releases").iterdir() if not p.name.startswith(".")) == [script.release_id]
    assert vm.attempts == 2  # the trainer itself runs again (it resumes from its checkpoint)


def test_single_slice_without_tpu_env(tmp_path, script, gcs):
    machine = Vm(tmp_path, script.text, {"agent-worker-number": "0", "multislice-run-dir": "runs/r1"}, gcs)
    with machine.metadata:
        result = machine.run()
    assert result.returncode == 0, result.stdout
    prefixed(result.stdout, "[slice 0 worker 0] ")
    # A relative local run dir is taken relative to where the script was started.
    assert machine.argv(1)[-1] == str(machine.home / "runs" / "r1")
    # No bucket: the trainer keeps its compilation cache in the run directory.
    assert contract.COMPILATION_CACHE_ENV not in machine.environ(1)


def test_a_compilation_cache_the_environment_names_is_kept(vm):
    result = vm.run(**{contract.COMPILATION_CACHE_ENV: "/var/cache/multislice-tests"})
    assert result.returncode == 0, result.stdout
    assert vm.environ(1)[contract.COMPILATION_CACHE_ENV] == "/var/cache/multislice-tests"


def test_restarts_with_capped_backoff(vm):
    result = vm.run(FAKE_MODE="fail-twice", MULTISLICE_RESTART_BACKOFF_S="0.2", MULTISLICE_RESTART_BACKOFF_MAX_S="0.3")
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout)
    assert vm.attempts == 3
    assert lines.count("trainer: exited with status 3 (exit-code)") == 2
    assert "trainer: restart 1, after 0.2s of backoff" in lines
    assert "trainer: restart 2, after 0.3s of backoff" in lines  # 0.4 capped at 0.3
    assert "trainer: exited with status 0: training is complete" in lines
    # The delays were really waited.
    started = [(vm.fake_dir / f"cwd.{n}").stat().st_mtime for n in (1, 2, 3)]
    assert started[1] - started[0] >= 0.19 and started[2] - started[1] >= 0.29


def test_a_planned_stop_restarts_without_the_failure_backoff(vm):
    """Status 75 (an elastic resize, a stop notice honoured: a checkpoint saved to resume from)
    restarts at once; a failure after it still waits its backoff."""
    result = vm.run(
        FAKE_MODE="resize-then-fail", MULTISLICE_RESTART_BACKOFF_S="0.2", MULTISLICE_RESTART_BACKOFF_MAX_S="0.3"
    )
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout)
    assert vm.attempts == 3
    assert "trainer: restart 1, at once: the last run saved a checkpoint and stopped as planned (status 75)" in lines
    assert "trainer: restart 2, after 0.3s of backoff" in lines  # 0.2 × 2 capped at 0.3
    assert [line for line in lines if "of backoff" in line] == ["trainer: restart 2, after 0.3s of backoff"]
    # A planned stop is a success to systemd (SuccessExitStatus=75) that is restarted all the same
    # (RestartForceExitStatus=75): no failure line for it, one for the failure after it.
    unit_lines = [line for line in result.stdout.splitlines() if "systemd[1]: multislice-trainer.service" in line]
    assert not [line for line in unit_lines if "status=75" in line]
    assert len([line for line in unit_lines if "Scheduled restart job" in line]) == 2


def test_gives_up_at_the_start_limit(vm):
    result = vm.run(
        FAKE_MODE="always-fail", MULTISLICE_RESTART_BACKOFF_S="0.01", MULTISLICE_RESTART_BACKOFF_MAX_S="0.02"
    )
    assert result.returncode == 1, result.stdout
    lines = prefixed(result.stdout)
    assert vm.attempts == startup.MAX_RESTARTS + 1 == 11
    delays = [re.search(r"after ([0-9.]+)s of backoff$", line).group(1) for line in lines if "of backoff" in line]
    assert delays == ["0.01"] + ["0.02"] * 9
    assert "systemd[1]: multislice-trainer.service: Start request repeated too quickly." in result.stdout
    # The trainer's unit failed last; the warm standby is then stopped with the VM (no work of its own).
    trainer_lines = [line for line in result.stdout.splitlines() if contract.STANDBY_UNIT not in line]
    assert trainer_lines[-1].endswith("Failed with result 'start-limit-hit'.")


def test_config_error_status_is_not_restarted(vm):
    from training.train import EXIT_CONFIG, EXIT_PREEMPTED

    assert startup.CONFIG_ERROR_STATUS == EXIT_CONFIG == 78
    assert boot.PLANNED_STOP_STATUS == EXIT_PREEMPTED == 75
    result = vm.run(FAKE_MODE="config-error")
    assert result.returncode == 78
    assert vm.attempts == 1
    assert "trainer: exited with status 78: its configuration cannot work here; it is not restarted" in prefixed(
        result.stdout
    )


def test_default_backoff_doubles_to_sixty(vm):
    """The defaults (1 s doubling, capped at 60 s), read from the restart lines of a run whose
    sleeps are skipped by a fake ``sleep`` on PATH."""
    fake_sleep = vm.bin / "sleep"
    fake_sleep.write_text("#!/bin/bash\nexit 0\n")
    fake_sleep.chmod(0o755)
    env = vm.env(FAKE_MODE="always-fail")
    del env["MULTISLICE_RESTART_BACKOFF_S"]
    env["PATH"] = f"{vm.bin}:{env['PATH']}"
    result = vm.run_with(env)
    assert result.returncode == 1
    delays = [line.rsplit("after ", 1)[1] for line in prefixed(result.stdout) if "of backoff" in line]
    assert delays == [f"{d}s of backoff" for d in (1, 2, 4, 8, 16, 32, 60, 60, 60, 60)]


def test_sigterm_to_the_vm_stops_the_trainer_after_it_saves(vm):
    """A preemption notice: the VM's systemd stops the unit with SIGTERM; the trainer saves
    (here: a file, written half a second after the signal) and exits 75 within the stop
    timeout; nothing restarts it."""
    proc = vm.popen(FAKE_MODE="save-on-term")
    try:
        vm.wait_for_file("ready.1", proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        vm.kill_all(proc)
    output = proc.stdout.read()
    lines = prefixed(output)
    assert (vm.fake_dir / "saved.1").read_text() == "checkpoint\n"
    assert "fake trainer saved its checkpoint" in lines
    assert (
        "trainer: exited with status 75: it saved a checkpoint after a stop notice "
        "(a preemption, a maintenance event, a stop)"
        " or to change its slice count (elastic)" in lines
    )
    assert "State 'stop-sigterm' timed out" not in output
    assert vm.attempts == 1 and not any("of backoff" in line for line in lines)


def test_sigterm_during_the_restart_backoff(vm):
    proc = vm.popen(FAKE_MODE="always-fail", MULTISLICE_RESTART_BACKOFF_S="30")
    try:
        vm.wait_for_output(proc, "trainer: restart 1, after 30s of backoff")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        vm.kill_all(proc)
    assert vm.attempts == 1
    assert "ended by signal TERM" in proc.stdout.read()


def test_running_the_script_again_leaves_the_running_trainer_alone(vm):
    """A second run of the startup script on a VM whose trainer runs (same release): one
    trainer service, no second process, nothing rebuilt or restarted."""
    proc = vm.popen(FAKE_MODE="wait-term")
    try:
        vm.wait_for_file("ready.1", proc)
        again = vm.run_inside(1)  # in the VM, next to the running trainer
        assert again.returncode == 0, again.stdout + again.stderr
        lines = prefixed(again.stdout + again.stderr)
        assert f"trainer: {startup.TRAINER_UNIT} already runs release {vm.release_id[:12]}; left alone" in lines
        assert vm.attempts == 1
        assert len(vm.trainer_processes()) == 1
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        vm.kill_all(proc)


@pytest.mark.parametrize("stray", ["A", '"'], ids=["in-alphabet", "outside-base85"])
def test_a_corrupt_embedded_release_is_refused(tmp_path, script, gcs, stray):
    """One character of the payload changed: to another base85 digit (decodes to other bytes,
    which xz or the sha256 check refuses) or to one outside the alphabet (the decoder refuses)."""
    text = script.text
    body_start = text.index("<<'MULTISLICE_RELEASE'")
    payload_start = text.index("\n", body_start) + 1  # the payload: one line of base85
    middle = (payload_start + text.index("\n", payload_start)) // 2
    corrupt = text[:middle] + (stray if text[middle] != stray else "B") + text[middle + 1 :]
    machine = Vm(tmp_path, corrupt, {"agent-worker-number": "0", "multislice-run-dir": "/tmp/x"}, gcs)
    with machine.metadata:
        result = machine.run()
    assert result.returncode == contract.RELEASE_UNVERIFIED_STATUS == 65  # no retry mends it (EX_DATAERR)
    assert re.search(r"error: the embedded release (is corrupt|does not decode)", result.stdout), result.stdout
    assert machine.attempts == 0 and not (machine.home / "releases" / script.release_id).exists()


def test_the_standby_unit_shares_the_trainers_environment_and_never_signals_its_attempts(vm, script):
    """multislice:warmStandby (the default): the standby's unit (docs/vm-boot.md, "The warm standby")
    runs ``trainer.sh standby`` with the trainer unit's environment (the standby takes only an attempt
    whose environment is its own), restarts always, and a stop signals its main process alone."""
    result = vm.run()
    assert result.returncode == 0, result.stdout
    release = vm.home / "releases" / script.release_id
    standby = parse_service((vm.unit_dir / contract.STANDBY_UNIT).read_text(), contract.STANDBY_UNIT)
    trainer = parse_service((vm.unit_dir / startup.TRAINER_UNIT).read_text(), startup.TRAINER_UNIT)
    assert standby.exec_start == ("/bin/bash", f"{release}/trainer.sh", "standby", str(vm.bin / "python"), RUN_DIR)
    assert standby.restart == "always" and standby.kill_mode == "process"
    assert standby.working_directory == trainer.working_directory == str(release)
    assert standby.environment == trainer.environment
    assert trainer.environment[contract.STANDBY_DIR_ENV] == str(vm.home / "standby")
    assert vm.environ(1)[contract.STANDBY_DIR_ENV] == str(vm.home / "standby")  # the attempt's handoff reads it
    assert "standby: (re)starting multislice-standby.service" in "\n".join(prefixed(result.stdout))


def test_a_stack_without_the_warm_standby_starts_every_attempt_cold(tmp_path, dev_stack, gcs):
    text = startup.render(dev_stack.model_copy(update={"warm_standby": False}), project_root=ROOT).text
    attributes = {"agent-worker-number": "2", "tpu-env": TPU_ENV, "multislice-run-dir": RUN_DIR}
    machine = Vm(tmp_path, text, attributes, gcs)
    with machine.metadata:
        result = machine.run()
    assert result.returncode == 0, result.stdout
    assert not (machine.unit_dir / contract.STANDBY_UNIT).exists()
    assert contract.STANDBY_DIR_ENV not in machine.environ(1)
    assert machine.argv(1)[1:4] == ["-m", "training", "run"]
    assert "standby" not in result.stdout

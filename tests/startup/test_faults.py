"""The rendered startup script against the faults a VM meets at boot (run on the emulated VM
as the emulation runs it): a metadata server that answers 503 with a body or a garbled value
before the right one, values that stay wrong, a package index that fails once or always. A
boot ends with exactly the right values or stops with one clear line naming the cause; it
never starts the trainer on a guessed or partial value."""

from __future__ import annotations

import os
import shutil
import socket

from infra import startup
from infra.startup import lockfile
from infra.startup.install_target import read_python_version
from tests.fakes.startup_vm import ROOT, RUN_DIR, Vm, dev_stack, gcs, prefixed, script, vm  # noqa: F401 (fixtures)


def retries(lines: list[str], key: str) -> list[str]:
    return [line for line in lines if line.startswith(f"metadata key {key}: ") and " retry " in line]


def assert_nothing_started(machine: Vm) -> None:
    assert machine.attempts == 0
    assert not (machine.unit_dir / startup.TRAINER_UNIT).exists()


def test_503_with_a_body_twice_then_the_run_dir(vm):
    """Today's fault: the body of each 503 must not end up in the value."""
    vm.metadata.fail("attributes/multislice-run-dir", 2, code=503, body="<html>503 Service Unavailable</html>\n")
    result = vm.run()
    assert result.returncode == 0, result.stdout
    assert vm.argv(1)[-2:] == ["--run-dir", RUN_DIR]
    lines = prefixed(result.stdout)
    assert retries(lines, "multislice-run-dir") == [
        "metadata key multislice-run-dir: HTTP 503 '<html>503 Service Unavailable</html>'; retry 1/5 in 0.01s",
        "metadata key multislice-run-dir: HTTP 503 '<html>503 Service Unavailable</html>'; retry 2/5 in 0.02s",
    ]
    assert (
        f"boot: stack dev (v4-8 x 2), release {vm.release_id[:12]} (unpacked by this boot), run dir {RUN_DIR}" in lines
    )


def test_a_garbled_value_is_read_again_not_used(vm):
    vm.metadata.fail("attributes/agent-worker-number", 1, code=200, body="2\n2")
    vm.metadata.fail("attributes/tpu-env", 1, code=200, body="MEGASCALE_SLICE_ID: '1x'\n")
    result = vm.run()
    assert result.returncode == 0, result.stdout
    # Before the identity is known, lines say so; every later one has it (from the second answers).
    first, second, rest = result.stdout.split("\n", 2)
    assert first == "[slice ? worker ?] metadata key agent-worker-number: malformed value '2 2'; retry 1/5 in 0.01s"
    assert (
        second
        == "[slice ? worker ?] metadata key tpu-env: malformed value 'MEGASCALE_SLICE_ID: '1x''; retry 1/5 in 0.01s"
    )
    prefixed(rest)
    assert vm.environ(1)["MULTISLICE_WORKER"] == "2" and vm.environ(1)["MULTISLICE_SLICE"] == "1"


def test_a_worker_number_that_stays_wrong_stops_the_boot(tmp_path, script, gcs):
    machine = Vm(tmp_path, script.text, {"agent-worker-number": "two", "multislice-run-dir": RUN_DIR}, gcs)
    with machine.metadata:
        result = machine.run()
    assert result.returncode == 1
    last = result.stdout.splitlines()[-2:]
    assert (
        f"[slice ? worker ?] error: metadata key agent-worker-number: "
        f"malformed value 'two' after {startup.ATTEMPTS} attempts" in last
    )
    assert len([r for r in machine.metadata.requests if r.endswith("agent-worker-number")]) == startup.ATTEMPTS
    assert_nothing_started(machine)


def test_a_run_dir_that_is_not_a_run_dir_stops_the_boot(tmp_path, script, gcs):
    machine = Vm(tmp_path, script.text, {"agent-worker-number": "0", "multislice-run-dir": "gs://Not A Bucket/x"}, gcs)
    with machine.metadata:
        result = machine.run()
    assert result.returncode == 1
    assert (
        "error: metadata key multislice-run-dir: malformed value 'gs://Not A Bucket/x' after 6 attempts"
        in result.stdout
    )
    assert_nothing_started(machine)


def test_a_slice_id_that_is_not_a_number_stops_the_boot(tmp_path, script, gcs):
    machine = Vm(
        tmp_path,
        script.text,
        {"agent-worker-number": "0", "tpu-env": "MEGASCALE_SLICE_ID: 'one'\n", "multislice-run-dir": RUN_DIR},
        gcs,
    )
    with machine.metadata:
        result = machine.run()
    assert result.returncode == 1
    assert "error: metadata key tpu-env: malformed value 'MEGASCALE_SLICE_ID: 'one'' after 6 attempts" in result.stdout
    assert_nothing_started(machine)


def test_no_metadata_server_is_a_bounded_clear_error(vm):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"
    result = vm.run(GCE_METADATA_IP=closed)
    assert result.returncode == 1
    assert "error: metadata key agent-worker-number: no answer (curl status 7) after 6 attempts" in result.stdout
    assert_nothing_started(vm)


def test_missing_run_dir_is_a_clear_error(tmp_path, script, gcs):
    machine = Vm(tmp_path, script.text, {"agent-worker-number": "3", "tpu-env": "MEGASCALE_SLICE_ID: '1'\n"}, gcs)
    with machine.metadata:
        result = machine.run()
    assert result.returncode == 1
    lines = prefixed(result.stdout, "[slice 1 worker 3] ")
    assert any("metadata key multislice-run-dir is missing" in line for line in lines), lines
    assert_nothing_started(machine)


def test_the_venv_builds_once_and_is_reused(vm, script):
    """Without MULTISLICE_PYTHON: pinned uv via pip, uv python/venv/pip install into a
    temporary directory renamed to venvs/<requirements sha256>; a re-run installs nothing; a
    different requirements hash builds anew and removes the old virtualenv (and envs/, where
    virtualenvs were kept before venvs/)."""
    result = vm.run(use_fake_python=False)
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout)
    sha = script.requirements_sha256
    env_dir = vm.home / "venvs" / sha
    assert (env_dir / ".complete").read_text().strip() == sha
    assert (vm.fake_dir / "requirements.txt").read_text() == lockfile.pinned_requirements(ROOT).text
    assert (vm.fake_dir / "uv-requirements.txt").read_text() == lockfile.pinned_uv(ROOT).requirement_text
    calls = (vm.fake_dir / "calls").read_text().splitlines()
    assert len(calls) == 4, calls
    assert calls[0].startswith("python3 -m pip install") and "--require-hashes" in calls[0]
    assert calls[1].startswith(f"uv --no-config python install {read_python_version(ROOT)} ")
    assert f"install-dir={vm.home / 'python'}" in calls[1]
    assert calls[2].startswith("uv --no-config venv") and "--relocatable" in calls[2]
    assert calls[3].startswith("uv --no-config pip install") and "--require-hashes" in calls[3]
    assert "--compile-bytecode" in calls[3]  # the bytecode at the build, not in the first trainer start
    assert vm.argv(1)[0] == str(env_dir / "bin" / "python")
    env = vm.environ(1)
    assert "UV_PYTHON_INSTALL_DIR" not in env and "UV_CACHE_DIR" not in env
    assert [p.name for p in (vm.home / "venvs").iterdir()] == [sha]
    assert (
        f"venv: building venvs/{sha[:12]} (Python {read_python_version(ROOT)}, "
        f"uv {lockfile.pinned_uv(ROOT).version}), attempt 1/4" in lines
    )

    again = vm.run(use_fake_python=False)
    assert again.returncode == 0, again.stdout
    assert f"venv: reusing venvs/{sha[:12]} (requirements unchanged)" in prefixed(again.stdout)
    assert len((vm.fake_dir / "calls").read_text().splitlines()) == 4

    # A virtualenv for other requirements (an older release) is not used, and goes; so does a
    # virtualenv where an earlier boot script kept them (envs/).
    old = vm.home / "venvs" / ("0" * 64)
    env_dir.rename(old)
    (vm.home / "envs" / ("1" * 64) / "bin").mkdir(parents=True)
    third = vm.run(use_fake_python=False)
    assert third.returncode == 0, third.stdout
    assert len((vm.fake_dir / "calls").read_text().splitlines()) == 8
    assert [p.name for p in (vm.home / "venvs").iterdir()] == [sha]
    assert not (vm.home / "envs").exists()


def test_an_install_that_fails_once_is_retried(vm, script):
    result = vm.run(use_fake_python=False, FAKE_PIP_FAILURES="1")
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout)
    assert "venv: attempt 1/4 failed (status 1); retrying in 0.01s" in lines
    assert any(line.startswith("venv: building") and line.endswith("attempt 2/4") for line in lines)
    assert f"venv: ready: venvs/{script.requirements_sha256[:12]}" in lines
    assert (vm.fake_dir / "pip-runs").read_text().strip() == "2"
    assert vm.attempts == 1
    assert [p.name for p in (vm.home / "venvs").iterdir()] == [script.requirements_sha256]  # no half-built leftovers


def test_an_install_that_always_fails_is_bounded(vm):
    result = vm.run(use_fake_python=False, FAKE_PIP_FAILURES="always")
    assert result.returncode == 1
    lines = prefixed(result.stdout)
    assert (vm.fake_dir / "pip-runs").read_text().strip() == str(startup.BUILD_ATTEMPTS)
    assert (
        lines[-1]
        == f"error: venv: the build failed {startup.BUILD_ATTEMPTS} times (last status 1); see the lines above"
    )
    assert_nothing_started(vm)
    assert os.listdir(vm.home / "venvs") == []  # nothing half-written is left to be used


def test_a_half_written_venv_is_rebuilt_not_used(vm, script):
    """A virtualenv directory without its completion mark (a build cut off by power loss
    before the mark was written) is never used: it is rebuilt in place."""
    sha = script.requirements_sha256
    half = vm.home / "venvs" / sha / "bin"
    half.mkdir(parents=True)
    shutil.copy(vm.bin / "python", half / "python")
    result = vm.run(use_fake_python=False)
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout)
    assert any(line.startswith(f"venv: building venvs/{sha[:12]}") for line in lines), lines
    assert len((vm.fake_dir / "calls").read_text().splitlines()) == 4
    assert (vm.home / "venvs" / sha / ".complete").read_text().strip() == sha

"""training.bench.shardings and ``multislice bench shardings`` / ``python -m training bench shardings``:
tiny CPU runs (in-process on the test's 8 CPU devices, and 2 emulated slices), and that no
child process outlives a failure. The spec, its formulas, bad options and the shared option
declaration: tests/training/test_bench_spec.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from typer.testing import CliRunner

from infra.cli import app as multislice_app
from infra.local import bench_slices
from training.__main__ import app as training_app
from training.bench import reference, shardings as bench
from training.bench.spec import spec_from_options

TINY = {"batch_size": 16, "embedding_dimension": 64, "layers": 2, "steps": 2, "warmup": 1}
runner = CliRunner()


def check_result(result: dict, devices: int) -> None:
    assert result["tflops_per_device"] > 0
    assert result["efficiency"] > 0
    assert result["devices"] == devices
    assert result["aggregate_tflops"] == pytest.approx(result["tflops_per_device"] * devices)
    assert result["efficiency"] == pytest.approx(result["aggregate_tflops"] / result["reference_tflops"])
    assert len(result["step_times"]) == result["spec"]["steps"]
    assert len(result["reference"]["tflops_before_after"]) == 2
    assert (
        len(result["reference"]["times"]) == 2 and len(result["reference"]["times"][0]) == reference.REFERENCE_SAMPLES
    )


def test_tiny_cpu_run_in_process_reports_positive_tflops():
    spec = spec_from_options(ici_data=2, ici_fsdp=2, ici_tensor=2, **TINY)
    result = bench.run(spec)
    check_result(result, 8)
    assert result["platform"] == "cpu" and result["dtype"] == "float32"
    assert result["processes"] == 1 and not result["emulated_slices"]
    assert result["reference"]["matmul_shape"] == [16 * 8, 64, 256]  # global rows on CPU
    assert "efficiency:" in bench.summary(result)


def test_mesh_that_does_not_match_the_devices_is_a_config_error():
    spec = spec_from_options(ici_fsdp=4, **TINY)  # the test process has 8 CPU devices
    with pytest.raises(bench.BenchConfigError, match="parallelism.ici"):
        bench.run(spec)


def test_two_emulated_slices_on_cpu():
    spec = spec_from_options(ici_fsdp=2, dcn_data=2, **TINY)
    lines: list[str] = []
    result = bench_slices.run(spec, timeout_s=120, report=lines.append)
    check_result(result, 4)
    assert result["emulated_slices"] and result["processes"] == 2 and result["slices"] == 2
    assert any("2 emulated slices × 2 CPU devices" in line for line in lines)


def test_trainer_bench_refuses_slices_it_cannot_span():
    # The bundle's bench (python -m training) runs in the job it is in; slices are emulated
    # only by the local launcher (infra.local.bench_slices), which is not shipped to the VMs.
    spec = spec_from_options(dcn_data=2, **TINY)
    assert bench.needs_emulated_slices(spec) and not bench.needs_emulated_slices(spec_from_options(**TINY))
    with pytest.raises(
        bench.BenchConfigError, match=r"--dcn-\*: 2 slices.*--from-metadata.*multislice bench shardings"
    ):
        bench.run(spec)
    result = runner.invoke(training_app, ["bench", "shardings", "--dcn-data", "2", *options()])
    assert result.exit_code == 2 and "--from-metadata" in result.output


def collect_children(monkeypatch) -> list[subprocess.Popen]:
    """The processes run_emulated starts (each child's group leader), as it starts them."""
    started = []
    original = bench_slices._start_child

    def start(name, task, env, workdir):
        group = original(name, task, env, workdir)
        started.append(group.proc)
        return group

    monkeypatch.setattr(bench_slices, "_start_child", start)
    return started


def test_timeout_kills_every_child(monkeypatch):
    started = collect_children(monkeypatch)
    spec = spec_from_options(dcn_data=2, **TINY)
    with pytest.raises(bench.BenchError, match="timed out"):
        bench_slices.run_emulated(spec, timeout_s=0.5)
    assert len(started) == 2
    assert all(proc.poll() is not None for proc in started)


def test_ctrl_c_kills_every_child(monkeypatch):
    started = collect_children(monkeypatch)

    def interrupted(children, deadline, what):
        raise KeyboardInterrupt

    monkeypatch.setattr(bench_slices, "_wait_children", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bench_slices.run_emulated(spec_from_options(dcn_data=2, **TINY))
    assert len(started) == 2 and all(proc.poll() is not None for proc in started)


def test_a_stop_as_a_child_starts_still_kills_it(monkeypatch):
    # SIGTERM lands between a child's fork and its entry in the list killed on exit (what the
    # subprocess test below can hit by chance): the stop is raised only after the entry.
    started = []
    original = bench_slices._start_child

    def start_then_signal(name, task, env, workdir):
        group = original(name, task, env, workdir)
        started.append(group.proc)
        os.kill(os.getpid(), signal.SIGTERM)  # Python runs the handler at the next bytecode
        return group

    monkeypatch.setattr(bench_slices, "_start_child", start_then_signal)
    try:
        with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
            bench_slices.run_emulated(spec_from_options(dcn_data=2, **TINY), timeout_s=60)
        assert len(started) == 1 and started[0].poll() is not None
    finally:
        for proc in started:
            proc.kill()


def _children_of(pid: int) -> list[int]:
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def test_sigterm_to_the_launcher_kills_every_child_and_cleans_up(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    for key in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "XLA_FLAGS"):
        env.pop(key, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", "bench", "shardings", "--dcn-data", "2", *options(steps=1000)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not list(tmp_path.glob("multislice-bench-*/slice-1.log")) or len(_children_of(proc.pid)) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=10)
            time.sleep(0.1)
        children = _children_of(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "every benchmark process was stopped" in err
    assert not [pid for pid in children if psutil.pid_exists(pid)]
    assert not list(tmp_path.glob("multislice-bench-*"))


def test_a_child_whose_launcher_is_gone_does_not_run():
    # The launcher was SIGKILLed before the child armed PR_SET_PDEATHSIG: the child's parent
    # is then not the launcher recorded in its task.
    task = {"parent_pid": os.getpid() + 10**7}
    result = subprocess.run(
        [sys.executable, "-m", "infra.local.bench_slices", json.dumps(task)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1 and result.stdout == "", result.stderr
    assert "Traceback" not in result.stderr  # it stopped before doing anything, not by failing


def test_a_failing_child_is_reported_with_its_log(monkeypatch):
    monkeypatch.setattr(bench_slices, "CHILD_INIT_TIMEOUT_S", 2)
    env = bench_slices._child_env
    # Slice 1 gets the wrong device count: its mesh cannot be built and it exits non-zero.
    monkeypatch.setattr(bench_slices, "_child_env", lambda devices, cpus: env(devices + (cpus == [1]), cpus))
    monkeypatch.setattr(bench_slices, "_cpu_shares", lambda n: [[0], [1]])
    with pytest.raises(bench.BenchError, match=r"slice-\d exited with code 1; its log ends"):
        bench_slices.run_emulated(spec_from_options(dcn_data=2, **TINY), timeout_s=60)


def options(**extra) -> list[str]:
    args = []
    for key, value in {**TINY, **extra}.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def test_multislice_bench_shardings_json():
    result = runner.invoke(multislice_app, ["bench", "shardings", "--ici-fsdp", "8", "--json", *options()])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["tflops_per_device"] > 0 and data["efficiency"] > 0


def test_multislice_bench_shardings_bad_option_is_exit_2():
    result = runner.invoke(multislice_app, ["bench", "shardings", "--dcn-tensor", "2", "--dcn-data", "1"])
    assert result.exit_code == 2
    assert "error:" in result.output and "--dcn-tensor" in result.output


def test_python_m_training_bench_shardings_keeps_run():
    result = runner.invoke(training_app, ["bench", "shardings", "--ici-fsdp", "8", *options()])
    assert result.exit_code == 0, result.output
    assert "TFLOP/s per device" in result.stdout and "efficiency:" in result.stdout
    help_text = runner.invoke(training_app, ["--help"]).output
    assert "run" in help_text and "bench" in help_text

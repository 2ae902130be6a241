"""infra/startup.sh.in, rendered: the startup script behaves as its runtime contract says
(infra/startup.py) when run against a loopback metadata server, with fake interpreters."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import lockfile, startup
from infra.config import StackConfig, load_stack
from infra.local.metadata import MetadataServer
from infra.target_environment import read_python_version
from training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dev_stack() -> StackConfig:
    return load_stack("dev", ROOT / "stacks")


@pytest.fixture(scope="module")
def script(dev_stack) -> startup.RenderedScript:
    return startup.render(dev_stack, project_root=ROOT)


FAKE_PYTHON = r"""#!/bin/bash
# Stands in for "python -m training run ...": records argv/cwd/env, then acts per FAKE_MODE.
n=$(( $(cat "$FAKE_DIR/count" 2>/dev/null || echo 0) + 1 ))
echo "$n" >"$FAKE_DIR/count"
printf '%s\n' "$0" "$@" >"$FAKE_DIR/argv.$n"
pwd >"$FAKE_DIR/cwd.$n"
env -0 >"$FAKE_DIR/env.$n"
echo "fake trainer attempt $n on stdout"
echo "fake trainer attempt $n on stderr" >&2
case ${FAKE_MODE:-ok} in
  ok) exit 0 ;;
  fail-twice) if ((n <= 2)); then exit 3; fi; exit 0 ;;
  always-fail) exit 5 ;;
  config-error) exit 78 ;;
  wait-term)
    trap 'echo "fake trainer got SIGTERM"; exit 7' TERM
    touch "$FAKE_DIR/ready.$n"
    while true; do sleep 0.05; done ;;
esac
"""

# pip (python3 -m pip install --target DIR -r FILE) and uv, faked for the environment step.
FAKE_PYTHON3 = r"""#!/bin/bash
echo "python3 $*" >>"$FAKE_DIR/calls"
args=("$@"); target=''; req=''
for ((i = 0; i < ${#args[@]}; i++)); do
  case ${args[i]} in --target) target=${args[i + 1]} ;; -r) req=${args[i + 1]} ;; esac
done
cp "$req" "$FAKE_DIR/uv-requirements.txt"
mkdir -p "$target/bin"
cp "$FAKE_BIN/uv" "$target/bin/uv"
"""

FAKE_UV = r"""#!/bin/bash
echo "uv $* [install-dir=$UV_PYTHON_INSTALL_DIR cache=$UV_CACHE_DIR]" >>"$FAKE_DIR/calls"
args=("$@")
case $2 in
  python) mkdir -p "$UV_PYTHON_INSTALL_DIR/cpython-$4" ;;
  venv) dir=${args[-1]}; mkdir -p "$dir/bin"; cp "$FAKE_BIN/python" "$dir/bin/python" ;;
  pip)
    for ((i = 0; i < ${#args[@]}; i++)); do
      if [[ ${args[i]} == -r ]]; then cp "${args[i + 1]}" "$FAKE_DIR/requirements.txt"; fi
    done ;;
esac
"""


class Vm:
    """One emulated VM: its state dir, fake interpreters and metadata."""

    def __init__(self, tmp: Path, script_text: str, attributes: dict[str, str]):
        self.tmp = tmp
        self.script = tmp / "startup.sh"
        self.script.write_text(script_text)
        self.home = tmp / "home"
        self.fake_dir = tmp / "records"
        self.fake_dir.mkdir()
        self.bin = tmp / "fakebin"
        self.bin.mkdir()
        for name, text in (("python", FAKE_PYTHON), ("python3", FAKE_PYTHON3), ("uv", FAKE_UV)):
            path = self.bin / name
            path.write_text(text)
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.metadata = MetadataServer(attributes)
        self.workdir = tmp / "cwd"
        self.workdir.mkdir()

    def env(self, *, use_fake_python: bool = True, **extra: str) -> dict[str, str]:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.tmp),
            "LANG": "C.UTF-8",
            "GCE_METADATA_IP": self.metadata.address,
            "MULTISLICE_HOME": str(self.home),
            "MULTISLICE_RESTART_BACKOFF_S": "0.01",
            "FAKE_DIR": str(self.fake_dir),
            "FAKE_BIN": str(self.bin),
            "PASS_THROUGH_CHECK": "kept as is",
        }
        if use_fake_python:
            env["MULTISLICE_PYTHON"] = str(self.bin / "python")
        else:
            env["PATH"] = f"{self.bin}:{env['PATH']}"
        env.update(extra)
        return env

    def run(self, timeout: float = 60, **env) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", str(self.script)],
            env=self.env(**env),
            cwd=self.workdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def popen(self, **env) -> subprocess.Popen:
        return subprocess.Popen(
            ["bash", str(self.script)],
            env=self.env(**env),
            cwd=self.workdir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: kill_all() reaches the fake trainer too
        )

    @staticmethod
    def kill_all(proc: subprocess.Popen) -> None:
        """SIGKILL the script and every process it started (a failed test leaves nothing)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    @property
    def attempts(self) -> int:
        path = self.fake_dir / "count"
        return int(path.read_text()) if path.exists() else 0

    def argv(self, n: int) -> list[str]:
        return (self.fake_dir / f"argv.{n}").read_text().splitlines()

    def environ(self, n: int) -> dict[str, str]:
        items = (self.fake_dir / f"env.{n}").read_bytes().split(b"\0")
        return dict(item.decode().split("=", 1) for item in items if item)


PREFIX = "[slice 1 worker 2] "
TPU_ENV = (
    "ACCELERATOR_TYPE: 'v4-16'\n"
    "MEGASCALE_COORDINATOR_ADDRESS: '10.0.0.2:8080'\n"
    "MEGASCALE_NUM_SLICES: '2'\n"
    "MEGASCALE_SLICE_ID: '1'\n"
    "WORKER_ID: '2'\n"
)


@pytest.fixture
def vm(tmp_path, script) -> Iterator[Vm]:
    attributes = {
        "agent-worker-number": "2",
        "tpu-env": TPU_ENV,
        "multislice-run-dir": "gs://acme-ml-dev-checkpoints/runs/dev",
    }
    machine = Vm(tmp_path, script.text, attributes)
    with machine.metadata:
        yield machine


def _assert_prefixed(output: str, prefix: str = PREFIX) -> list[str]:
    lines = output.splitlines()
    assert lines, "no output"
    bad = [line for line in lines if not line.startswith(prefix)]
    assert not bad, bad
    return [line[len(prefix) :] for line in lines]


def test_runs_the_bundled_trainer(vm, dev_stack, script):
    result = vm.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    lines = _assert_prefixed(result.stdout)
    assert "fake trainer attempt 1 on stdout" in lines
    assert "fake trainer attempt 1 on stderr" in lines
    assert "trainer completed" in lines
    assert vm.attempts == 1

    app = vm.home / "app" / script.bundle_sha256
    argv = vm.argv(1)
    assert argv[0] == str(vm.bin / "python")
    assert argv[1:] == [
        "-m", "training", "run",
        "--config", str(app / "config.json"),
        "--run-dir", "gs://acme-ml-dev-checkpoints/runs/dev",
    ]  # fmt: skip
    assert (vm.fake_dir / "cwd.1").read_text().strip() == str(app)
    env = vm.environ(1)
    assert env["PYTHONPATH"] == str(app)
    assert env["PASS_THROUGH_CHECK"] == "kept as is"
    assert env["GCE_METADATA_IP"] == vm.metadata.address
    assert env["MULTISLICE_PYTHON"] == str(vm.bin / "python")

    config = TrainConfig.model_validate_json((app / "config.json").read_text())
    assert config == dev_stack.training
    assert json.loads((app / "config.json").read_text()) == json.loads(dev_stack.training.model_dump_json())
    bundled = sorted(p.relative_to(app).as_posix() for p in app.rglob("*.py"))
    assert bundled == sorted(f"training/{p.name}" for p in (ROOT / "training").glob("*.py"))
    assert (app / ".complete").is_file()
    assert not (vm.home / "venv").exists(), "MULTISLICE_PYTHON must skip the environment step"
    assert not (vm.fake_dir / "calls").exists(), "nothing may be installed with MULTISLICE_PYTHON"
    paths = [p.rsplit("/", 1)[-1] for p in vm.metadata.requests]
    assert {"agent-worker-number", "tpu-env", "multislice-run-dir"} <= set(paths)


def test_rerun_does_no_repeated_work(vm, script):
    first = vm.run()
    assert first.returncode == 0, first.stdout
    app = vm.home / "app" / script.bundle_sha256
    marker = (app / ".complete").stat().st_mtime_ns
    config = (app / "config.json").stat().st_mtime_ns
    time.sleep(0.02)
    second = vm.run()
    assert second.returncode == 0, second.stdout
    lines = _assert_prefixed(second.stdout)
    assert any("already unpacked" in line for line in lines)
    assert not any("unpacked into" in line for line in lines)
    assert (app / ".complete").stat().st_mtime_ns == marker
    assert (app / "config.json").stat().st_mtime_ns == config
    assert sorted(p.name for p in (vm.home / "app").iterdir()) == [script.bundle_sha256]
    assert vm.attempts == 2  # the trainer itself runs again (it resumes from its checkpoint)


def test_single_slice_without_tpu_env(tmp_path, script):
    machine = Vm(tmp_path, script.text, {"agent-worker-number": "0", "multislice-run-dir": "runs/r1"})
    with machine.metadata:
        result = machine.run()
    assert result.returncode == 0, result.stdout
    _assert_prefixed(result.stdout, "[slice 0 worker 0] ")
    # A relative local run dir is taken relative to where the script was started.
    assert machine.argv(1)[-1] == str(machine.workdir / "runs" / "r1")


def test_missing_run_dir_is_a_clear_error(tmp_path, script):
    machine = Vm(tmp_path, script.text, {"agent-worker-number": "3", "tpu-env": TPU_ENV})
    with machine.metadata:
        result = machine.run()
    assert result.returncode == 1
    lines = _assert_prefixed(result.stdout, "[slice 1 worker 3] ")
    assert any("multislice-run-dir is missing" in line for line in lines), lines
    assert machine.attempts == 0


def test_restarts_with_capped_backoff(vm):
    result = vm.run(FAKE_MODE="fail-twice", MULTISLICE_RESTART_BACKOFF_S="0.2", MULTISLICE_RESTART_BACKOFF_MAX_S="0.3")
    assert result.returncode == 0, result.stdout
    lines = _assert_prefixed(result.stdout)
    assert vm.attempts == 3
    assert "trainer exited with status 3; restart 1/10 in 0.2s" in lines
    assert "trainer exited with status 3; restart 2/10 in 0.3s" in lines  # 0.4 capped at 0.3
    assert "trainer completed" in lines
    # The delays were really waited.
    started = [(vm.fake_dir / f"cwd.{n}").stat().st_mtime for n in (1, 2, 3)]
    assert started[1] - started[0] >= 0.19 and started[2] - started[1] >= 0.29


def test_gives_up_after_ten_restarts(vm):
    result = vm.run(FAKE_MODE="always-fail", MULTISLICE_RESTART_BACKOFF_S="0.01", MULTISLICE_RESTART_BACKOFF_MAX_S="0.02")
    assert result.returncode == 1
    lines = _assert_prefixed(result.stdout)
    assert vm.attempts == startup.MAX_RESTARTS + 1 == 11
    delays = [re.search(r"in ([0-9.]+)s$", line).group(1) for line in lines if "restart " in line and " in " in line]
    assert delays == ["0.01"] + ["0.02"] * 9
    assert lines[-1] == "error: trainer exited with status 5; giving up after 10 restarts"


def test_config_error_status_is_not_restarted(vm):
    from training.train import EXIT_CONFIG

    assert startup.CONFIG_ERROR_STATUS == EXIT_CONFIG == 78
    result = vm.run(FAKE_MODE="config-error")
    assert result.returncode == 78
    lines = _assert_prefixed(result.stdout)
    assert vm.attempts == 1
    assert lines[-1] == "error: the trainer's configuration cannot work here (status 78); not restarting"


def test_default_backoff_doubles_to_sixty(vm):
    """The defaults (1 s doubling, capped at 60 s), read from the restart log lines of a run
    whose sleeps are skipped by a fake ``sleep`` on PATH."""
    fake_sleep = vm.bin / "sleep"
    fake_sleep.write_text("#!/bin/bash\nexit 0\n")
    fake_sleep.chmod(0o755)
    env = vm.env(FAKE_MODE="always-fail")
    del env["MULTISLICE_RESTART_BACKOFF_S"]
    env["PATH"] = f"{vm.bin}:{env['PATH']}"
    result = subprocess.run(["bash", str(vm.script)], env=env, cwd=vm.workdir, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    delays = [line.rsplit(" in ", 1)[1] for line in _assert_prefixed(result.stdout) if "restart " in line and " in " in line]
    assert delays == ["1s", "2s", "4s", "8s", "16s", "32s", "60s", "60s", "60s", "60s"]


class _Reader:
    """Collects a process's output lines in a thread."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(needle in line for line in list(self.lines)):
                return
            time.sleep(0.02)
        raise AssertionError(f"{needle!r} not seen in {self.lines}")


def test_sigterm_is_forwarded_and_not_restarted(vm):
    proc = vm.popen(FAKE_MODE="wait-term")
    reader = _Reader(proc)
    try:
        deadline = time.monotonic() + 20
        while not (vm.fake_dir / "ready.1").exists():
            assert time.monotonic() < deadline and proc.poll() is None, reader.lines
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 7  # the trainer's own exit status
    finally:
        vm.kill_all(proc)
    reader.thread.join(timeout=10)
    lines = _assert_prefixed("\n".join(reader.lines))
    assert "fake trainer got SIGTERM" in lines
    assert "trainer exited with status 7 after SIGTERM; exiting without restart" in lines
    assert vm.attempts == 1
    assert not any("restart 1/" in line for line in lines)


def test_sigterm_during_restart_delay(vm):
    proc = vm.popen(FAKE_MODE="always-fail", MULTISLICE_RESTART_BACKOFF_S="30")
    reader = _Reader(proc)
    try:
        reader.wait_for("restart 1/10 in 30s")
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 143
        assert time.monotonic() - started < 5
    finally:
        vm.kill_all(proc)
    reader.thread.join(timeout=10)
    assert vm.attempts == 1
    assert "stopping during the restart delay (SIGTERM)" in _assert_prefixed("\n".join(reader.lines))


def test_environment_step_builds_once(vm, script):
    """Without MULTISLICE_PYTHON: pinned uv via pip, uv python/venv/pip install, atomic swap;
    a re-run with the same requirements installs nothing."""
    result = vm.run(use_fake_python=False)
    assert result.returncode == 0, result.stdout
    lines = _assert_prefixed(result.stdout)
    sha = script.requirements_sha256
    venv = vm.home / "venv"
    assert venv.is_symlink() and os.readlink(venv) == f"envs/{sha}"
    assert (venv / "requirements.sha256").read_text().strip() == sha
    assert (vm.fake_dir / "requirements.txt").read_text() == lockfile.pinned_requirements(ROOT).text
    assert (vm.fake_dir / "uv-requirements.txt").read_text() == lockfile.pinned_uv(ROOT).requirement_text
    calls = (vm.fake_dir / "calls").read_text().splitlines()
    assert len(calls) == 4, calls
    assert calls[0].startswith("python3 -m pip install") and "--require-hashes" in calls[0]
    assert calls[1].startswith(f"uv --no-config python install {read_python_version(ROOT)} ")
    assert f"install-dir={vm.home / 'python'}" in calls[1]
    assert calls[2].startswith("uv --no-config venv") and "--relocatable" in calls[2]
    assert calls[3].startswith("uv --no-config pip install") and "--require-hashes" in calls[3]
    assert vm.argv(1)[0] == str(venv / "bin" / "python")
    env = vm.environ(1)
    assert "UV_PYTHON_INSTALL_DIR" not in env and "UV_CACHE_DIR" not in env
    assert "PATH" in env and env["PATH"].startswith(str(vm.bin))
    assert [p.name for p in (vm.home / "envs").iterdir()] == [sha]
    assert any("building the environment" in line for line in lines)

    again = vm.run(use_fake_python=False)
    assert again.returncode == 0, again.stdout
    assert any("is up to date" in line for line in _assert_prefixed(again.stdout))
    assert len((vm.fake_dir / "calls").read_text().splitlines()) == 4

    # A different stored requirements hash (an older environment) triggers a rebuild that
    # replaces it and removes the old one.
    old = vm.home / "envs" / ("0" * 64)
    (vm.home / "envs" / sha).rename(old)
    (old / "requirements.sha256").write_text("0" * 64 + "\n")
    venv.unlink()
    venv.symlink_to(f"envs/{'0' * 64}")
    third = vm.run(use_fake_python=False)
    assert third.returncode == 0, third.stdout
    assert len((vm.fake_dir / "calls").read_text().splitlines()) == 8
    assert os.readlink(venv) == f"envs/{sha}"
    assert [p.name for p in (vm.home / "envs").iterdir()] == [sha]

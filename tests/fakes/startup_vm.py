"""An emulated TPU VM for the startup-script tests: the rendered script booted by the VM's
emulated systemd (``infra.emulated.vm.boot_command``, as the emulator boots it), with a loopback
metadata server, a loopback GCS, and fake interpreters that record what they were run with.

Fixtures (import them by name): ``dev_stack``, ``script`` (the dev stack's rendered script),
``gcs`` (fake-gcs-server with the dev stack's bucket), ``vm`` (slice 1, worker 2, run dir
:data:`RUN_DIR`). :func:`compute_engine_vm` is a VM of the compute-engine backend instead: the
program's metadata keys, and a loopback Compute API (``infra.backends.compute_engine.emulated_api``) that lists its
slice's managed instance group.
"""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infra import startup
from infra.config import StackConfig, load_stack
from infra.emulated.metadata import MetadataServer
from infra.emulated.service_manager import session_pids
from infra.emulated.vm import boot_command
from tests.fakes.gcs_server import FakeGcs

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "acme-ml-dev-checkpoints"
RUN_DIR = f"gs://{BUCKET}/runs/dev"
PREFIX = "[slice 1 worker 2] "
TPU_ENV = (
    "ACCELERATOR_TYPE: 'v4-16'\n"
    "MEGASCALE_COORDINATOR_ADDRESS: '10.0.0.2:8080'\n"
    "MEGASCALE_NUM_SLICES: '2'\n"
    "MEGASCALE_SLICE_ID: '1'\n"
    "WORKER_ID: '2'\n"
)

FAKE_PYTHON = r"""#!/bin/bash
# The log shipper that trainer.sh pipes the trainer through is the real one (this machine's Python).
if [[ ${1:-} == -m && ${2:-} == training.log_shipping ]]; then exec "$FAKE_REAL_PYTHON" "$@"; fi
# So is trainer.sh's question after an exit 0: which slice wrote the completion marker.
if [[ ${1:-} == -m && ${2:-} == training && ${3:-} == completed-by ]]; then exec "$FAKE_REAL_PYTHON" "$@"; fi
# The warm standby (multislice-standby.service) is a process that waits; the handoff finds none ready
# and starts the attempt cold, as training.standby_handoff does: here at once, as "-m training run".
if [[ ${1:-} == -m && ${2:-} == training.standby ]]; then exec sleep 3600; fi
if [[ ${1:-} == -m && ${2:-} == training.standby_handoff ]]; then shift 2; exec "$0" -m training run "$@"; fi
# The boot's check that an unpacked virtualenv runs here (`python -I -S -c ''`) is no trainer attempt.
if [[ "${1:-} ${2:-} ${3:-}" == "-I -S -c" ]]; then exec "$FAKE_REAL_PYTHON" "$@"; fi
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
  resize-then-fail) if ((n == 1)); then exit 75; fi; if ((n == 2)); then exit 3; fi; exit 0 ;;
  always-fail) exit 5 ;;
  config-error) exit 78 ;;
  wait-term)
    # No foreground child once the test may signal: bash ignores a SIGINT that lands as its
    # foreground child exits 0 (a `touch`, a loop's `sleep`), so the file is written by bash itself
    # and the wait is on a background sleep.
    trap 'echo "fake trainer got SIGTERM"; exit 7' TERM
    : >"$FAKE_DIR/ready.$n"
    sleep 3600 </dev/null >/dev/null 2>&1 &
    wait "$!" ;;
  group-term)  # a command's own child saves on SIGTERM; the launcher itself ignores it
    bash -c 'trap "echo saved >\"$FAKE_DIR/child-saved.$0\"; exit 0" TERM; : >"$FAKE_DIR/ready.$0"
      while true; do sleep 0.05; done' "$n" &
    trap '' TERM
    wait; exit 75 ;;
  save-on-term)
    trap 'sleep 0.5; echo checkpoint >"$FAKE_DIR/saved.$n"; echo "fake trainer saved its checkpoint"; exit 75' TERM
    : >"$FAKE_DIR/ready.$n"
    while true; do sleep 0.05; done ;;
esac
"""

# pip (python3 -m pip install --target DIR -r FILE) and uv, faked for the environment step.
# FAKE_PIP_FAILURES=N: the first N pip runs fail (a flaky index); "always": every run does.
# ``python3 [-I -S] -c CODE`` (the bootstrap's base85 decoder) runs the real Python (the tests' own interpreter).
FAKE_PYTHON3 = r"""#!/bin/bash
if [[ ${1:-} == -c || "${1:-} ${2:-} ${3:-}" == "-I -S -c" ]]; then exec @@REAL_PYTHON@@ "$@"; fi
echo "python3 $*" >>"$FAKE_DIR/calls"
runs=$(( $(cat "$FAKE_DIR/pip-runs" 2>/dev/null || echo 0) + 1 ))
echo "$runs" >"$FAKE_DIR/pip-runs"
if [[ ${FAKE_PIP_FAILURES:-0} == always ]] || ((runs <= ${FAKE_PIP_FAILURES:-0})); then
  echo "ERROR: Could not install packages due to an OSError: connection reset (fake)" >&2
  exit 1
fi
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
    """One emulated VM: its disk, fake interpreters and metadata server (see the module docstring)."""

    def __init__(
        self,
        tmp: Path,
        script_text: str,
        attributes: dict[str, str],
        gcs: FakeGcs | None = None,
        values: dict[str, str] | None = None,
    ):
        self.tmp = tmp
        self.script = tmp / "startup-script"
        self.script.write_text(script_text)
        self.release_id = startup.release_id_of(script_text) or ""
        self.home = tmp / "home"
        self.home.mkdir()
        self.unit_dir = self.home / "systemd"
        self.fake_dir = tmp / "records"
        self.fake_dir.mkdir()
        self.bin = tmp / "fakebin"
        self.bin.mkdir()
        python3 = FAKE_PYTHON3.replace("@@REAL_PYTHON@@", shlex.quote(sys.executable))
        for name, text in (("python", FAKE_PYTHON), ("python3", python3), ("uv", FAKE_UV)):
            path = self.bin / name
            path.write_text(text)
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.metadata = MetadataServer(attributes, values)
        self.gcs = gcs
        self.console = tmp / "console.log"
        self.boots = 0

    def env(self, *, use_fake_python: bool = True, **extra: str) -> dict[str, str]:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(self.tmp),
            "LANG": "C.UTF-8",
            "GCE_METADATA_IP": self.metadata.address,
            "MULTISLICE_HOME": str(self.home),
            "MULTISLICE_RETRY_DELAY_S": "0.01",
            "MULTISLICE_RESTART_BACKOFF_S": "0.01",
            # The compute-engine backend's release watch: a VM whose trainer is done ends soon.
            "MULTISLICE_RELEASE_POLL_S": "0.2",
            "FAKE_DIR": str(self.fake_dir),
            "FAKE_BIN": str(self.bin),
            "FAKE_REAL_PYTHON": sys.executable,
            "PASS_THROUGH_CHECK": "kept as is",
        }
        if self.gcs is not None:
            env["STORAGE_EMULATOR_HOST"] = self.gcs.endpoint
        if use_fake_python:
            env["MULTISLICE_PYTHON"] = str(self.bin / "python")
        else:
            env["PATH"] = f"{self.bin}:{env['PATH']}"
        env.update(extra)
        return env

    def popen_with(self, env: dict[str, str]) -> subprocess.Popen:
        """Boot the VM (its systemd in a new session, output to a fresh console log)."""
        self.boots += 1
        log = open(self.console, "w")  # noqa: SIM115 (the child holds it)
        with log:
            return subprocess.Popen(
                boot_command(self.script, self.unit_dir, self.home / "run"),
                env=env,
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def popen(self, **env) -> subprocess.Popen:
        proc = self.popen_with(self.env(**env))
        proc.stdout = _Console(self.console)  # type: ignore[assignment]
        return proc

    def run_with(self, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
        """Boot and wait until the VM has nothing left to do; its console output is ``stdout``."""
        proc = self.popen_with(env)
        try:
            code = proc.wait(timeout=timeout)
        finally:
            self.kill_all(proc)
        return subprocess.CompletedProcess(proc.args, code, stdout=self.console.read_text(), stderr="")

    def run(self, timeout: float = 180, **env) -> subprocess.CompletedProcess:
        return self.run_with(self.env(**env), timeout)

    def run_inside(self, attempt: int, timeout: float = 120) -> subprocess.CompletedProcess:
        """Run the startup script again inside the running VM (with the environment its
        trainer attempt ``attempt`` got: the VM's systemctl, metadata and disk)."""
        env = self.environ(attempt)
        return subprocess.run(
            ["bash", str(self.script)], env=env, cwd=self.home, capture_output=True, text=True, timeout=timeout
        )

    @staticmethod
    def kill_all(proc: subprocess.Popen) -> None:
        """SIGKILL every process of the VM's session (power off: a failed test leaves nothing)."""
        for pid in session_pids(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while session_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def wait_for_file(self, name: str, proc: subprocess.Popen, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not (self.fake_dir / name).exists():
            assert time.monotonic() < deadline and proc.poll() is None, self.console.read_text()
            time.sleep(0.02)

    def wait_for_output(self, proc: subprocess.Popen, needle: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.console.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, self.console.read_text()
            time.sleep(0.02)

    def trainer_processes(self) -> list[int]:
        """Live fake-trainer processes of this VM. A fork of the fake trainer's bash loop
        carries its command line until it becomes ``sleep``: those (a parent among the found)
        are not trainers."""
        fake = str(self.bin / "python")
        found: dict[int, int] = {}
        for process in psutil.process_iter(["cmdline", "status", "ppid"]):
            cmdline = process.info["cmdline"] or []
            if fake in cmdline[:2] and "training" in cmdline and process.info["status"] != psutil.STATUS_ZOMBIE:
                found[process.pid] = process.info["ppid"]
        return [pid for pid, ppid in found.items() if ppid not in found]

    @property
    def attempts(self) -> int:
        path = self.fake_dir / "count"
        return int(path.read_text()) if path.exists() else 0

    def argv(self, n: int) -> list[str]:
        return (self.fake_dir / f"argv.{n}").read_text().splitlines()

    def environ(self, n: int) -> dict[str, str]:
        items = (self.fake_dir / f"env.{n}").read_bytes().split(b"\0")
        return dict(item.decode().split("=", 1) for item in items if item)


class _Console:
    """``proc.stdout`` of a booted VM: its console log, read once it is needed."""

    def __init__(self, path: Path):
        self.path = path

    def read(self) -> str:
        return self.path.read_text()


def run_delete_on_complete(
    tpu_api_endpoint: str, queued_resource: str, slice_id: int = 0
) -> subprocess.CompletedProcess[str]:
    """The release's ``delete-on-complete.sh`` as worker 0 of slice ``slice_id`` runs it after its
    trainer exited 0, having written the completion marker: the metadata names ``queued_resource``
    (a loopback metadata server), the TPU API is ``tpu_api_endpoint``. Its output is returned, not
    checked."""
    from infra.vm_contract import DELETE_QUEUED_RESOURCE_KEY

    with MetadataServer({DELETE_QUEUED_RESOURCE_KEY: queued_resource}) as metadata:
        env = {
            "PATH": os.environ["PATH"],
            "GCE_METADATA_IP": metadata.address,
            "MULTISLICE_TPU_API_ENDPOINT": tpu_api_endpoint,
            "MULTISLICE_SLICE": str(slice_id),
            "MULTISLICE_WORKER": "0",
            "MULTISLICE_COMPLETION_SLICE": str(slice_id),
        }
        return subprocess.run(
            ["bash", str(ROOT / "infra" / "startup" / startup.DELETE_ON_COMPLETE_RESOURCE)],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )


def prefixed(output: str, prefix: str = PREFIX) -> list[str]:
    """The VM's lines without their ``[slice S worker W]`` prefix; systemd's own lines
    (``systemd[1]: ...``) are left out; every other line must carry the prefix."""
    lines = [line for line in output.splitlines() if not line.startswith("systemd[1]: ")]
    assert lines, f"no output: {output!r}"
    bad = [line for line in lines if not line.startswith(prefix)]
    assert not bad, bad
    return [line[len(prefix) :] for line in lines]


@pytest.fixture(scope="module")
def dev_stack() -> StackConfig:
    return load_stack("dev", ROOT / "stacks")


@pytest.fixture(scope="module")
def script(dev_stack) -> startup.RenderedScript:
    return startup.render(dev_stack, project_root=ROOT)


@pytest.fixture(scope="module")
def ce_stack() -> StackConfig:
    """The dev stack on the compute-engine backend (2 × v5p-16 in us-east5-a): its release boots
    as a Compute Engine TPU VM does (:func:`compute_engine_vm`)."""
    from infra.config import validate_stack
    from tests.helpers.compute_engine import ce_map

    return validate_stack("dev", ce_map("v5p-16"), "tests")


@pytest.fixture(scope="module")
def ce_script(ce_stack) -> startup.RenderedScript:
    return startup.render(ce_stack, project_root=ROOT)


@pytest.fixture(scope="module")
def gcs() -> Iterator[FakeGcs]:
    with FakeGcs() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def vm(tmp_path, script, gcs) -> Iterator[Vm]:
    attributes = {"agent-worker-number": "2", "tpu-env": TPU_ENV, "multislice-run-dir": RUN_DIR}
    machine = Vm(tmp_path, script.text, attributes, gcs)
    with machine.metadata:
        yield machine


#: The compute-engine backend's VMs (:func:`compute_engine_vm`): project, zone and groups.
CE_PROJECT = "acme-ml-dev"
CE_ZONE = "us-central2-b"
CE_GROUPS = ("multislice-dev-0", "multislice-dev-1")
#: The instance template's TPU environment for v5p-16 (2 VMs of 4 chips, topology 2x2x2), written
#: out from tpu-operator's sample for the same shape (its README; docs/compute-engine.md, section 4b).
V5P_16_TPU_ENV = (
    "TPU_TOPOLOGY=2x2x2 TPU_HOST_BOUNDS=1,1,2 TPU_CHIPS_PER_HOST_BOUNDS=2,2,1 TPU_PROCESS_PORT=8470 "
    "TPU_RUNTIME_METRICS_PORTS=8431,8432,8433,8434"
)


def compute_engine_vm(
    tmp: Path,
    script_text: str,
    gcs: FakeGcs | None,
    *,
    name: str,
    slice_id: int,
    workers_per_slice: int,
    accelerator: str = "v5p-16",
    tpu_env: str | None = V5P_16_TPU_ENV,
) -> Vm:
    """A Compute Engine TPU VM named ``name`` of slice ``slice_id`` (group :data:`CE_GROUPS`
    [slice_id]): the metadata the program sets in the instance template and the group
    (docs/compute-engine.md; ``tpu_env`` None: a template from before the TPU environment), and
    the VM's own name, zone and project. Its boot asks the Compute API that :meth:`Vm.env` names
    with ``MULTISLICE_COMPUTE_API_ENDPOINT``."""
    from infra import vm_contract as contract

    attributes = {
        contract.BACKEND_KEY: contract.COMPUTE_ENGINE_BACKEND,
        contract.INSTANCE_GROUPS_KEY: ",".join(CE_GROUPS),
        contract.SLICE_ID_KEY: str(slice_id),
        contract.WORKERS_PER_SLICE_KEY: str(workers_per_slice),
        contract.COMPUTE_ENGINE_ACCELERATOR_KEY: accelerator,
        contract.RUN_DIR_KEY: RUN_DIR,
    }
    if tpu_env is not None:
        attributes[contract.COMPUTE_ENGINE_TPU_ENV_KEY] = tpu_env
    values = {
        "instance/name": name,
        "instance/zone": f"projects/123456789/zones/{CE_ZONE}",
        "project/project-id": CE_PROJECT,
    }
    return Vm(tmp, script_text, attributes, gcs, values)

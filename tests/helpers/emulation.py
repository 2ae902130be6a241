"""``multislice`` run as the user runs it (a subprocess) against the emu stack, and the
processes and records of the local emulations it starts."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from infra.config import load_stack_file
from infra.emulated import gcs_clients
from tests import compilation_cache
from training.metrics.run_log import read_records
from training.run_dir import RunDir

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"
#: The emu stack with a user's own JAX program as its workload (tests/fakes/workload).
COMMAND_STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu-command.yaml"
RUN_DIR = load_stack_file(STACK).run_dir  # gs://<the stack's bucket>/runs/emu
CLI = [sys.executable, "-m", "infra.cli"]
#: How the CLI started as :data:`CLI` names itself in the commands it prints (infra/invocation.py).
PRINTED_CLI = f"{shlex.quote(sys.executable)} -m infra.cli"


def cli_env(state_dir: Path) -> dict[str, str]:
    """The CLI's environment: state under ``state_dir``, JAX left to the emulator, the VMs
    sharing the session's compilation cache (tests/compilation_cache.py)."""
    env = {**os.environ, "MULTISLICE_STATE_DIR": str(state_dir), "COLUMNS": "200", **compilation_cache.env()}
    for key in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES"):
        env.pop(key, None)
    return env


def run_cli(args: list[str], state_dir: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``multislice ARGS`` to its end, its output captured.

    Raises:
      AssertionError: it ran past ``timeout`` seconds (within the slow tests' pytest timeout,
        tests/conftest.py): it is stopped as Ctrl-C stops it (the emulator stops its VMs), and the
        message names the command and its last output lines.
    """
    proc = subprocess.Popen(
        CLI + args, env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        tail = "\n".join((out + err).splitlines()[-40:])
        raise AssertionError(
            f"`multislice {' '.join(args)}` did not finish within {timeout:.0f} s; stopped. Its last lines:\n{tail}"
        ) from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def stop_if_running(proc: subprocess.Popen) -> None:
    """Test cleanup: SIGINT makes the emulator stop its VMs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)


class BackgroundCli:
    """``multislice ARGS`` started in the background (a context manager: leaving it stops a
    command still running, :func:`stop_if_running`); its stdout lines collected as they come."""

    def __init__(self, args: list[str], state_dir: Path, *, env: dict[str, str] | None = None) -> None:
        """``args``: ``multislice``'s arguments; with ``env``, a whole command line run with that
        environment (a README line through ``bash -c``)."""
        command, environment = (CLI + args, cli_env(state_dir)) if env is None else (args, env)
        self.proc = subprocess.Popen(
            command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[str] = []
        stdout = self.proc.stdout
        assert stdout is not None
        self._reader = threading.Thread(target=lambda: self.lines.extend(iter(stdout.readline, "")), daemon=True)
        self._reader.start()

    def __enter__(self) -> BackgroundCli:
        return self

    def __exit__(self, *exc: object) -> None:
        stop_if_running(self.proc)

    def reached(self, step: int, total: int) -> bool:
        """Whether a progress line ``step N/total`` with N ≥ ``step`` came out."""
        return any(int(m[1]) >= step for line in self.lines if (m := re.search(rf"step (\d+)/{total}", line)))

    def wait_until(self, condition: Callable[[], bool], timeout: float, what: str = "") -> None:
        """Poll ``condition`` until true; fail the test if the command ends or ``timeout``
        seconds pass first, saying what it waited for (``what``, else the condition's name) and
        showing the command's last lines."""
        deadline = time.monotonic() + timeout
        while not condition():
            code = self.proc.poll()
            if code is not None or time.monotonic() >= deadline:
                ended = f"the command ended with status {code}" if code is not None else f"{timeout:.0f} s passed"
                waited = what or getattr(condition, "__name__", "the condition")
                raise AssertionError(f"waited for {waited}, but {ended}; its last lines:\n{self.last_lines()}")
            time.sleep(0.1)

    def last_lines(self, count: int = 40) -> str:
        """The last ``count`` lines of the command's output (and of its stderr, once it ended)."""
        lines = (self.output() + self.stderr()).splitlines()
        return "\n".join(lines[-count:])

    def finish(self, timeout: float) -> int:
        """Wait for the command to end; its exit status."""
        self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return self.proc.returncode

    def output(self) -> str:
        return "".join(self.lines)

    def stderr(self) -> str:
        assert self.proc.stderr is not None
        return self.proc.stderr.read() if self.proc.poll() is not None else ""


def processes_under(root: Path) -> list[int]:
    """Live processes of the emulations whose state lies under ``root``: the emulated VMs
    (their MULTISLICE_HOME) and the emulated Cloud Storage (started by the CLI, with its
    MULTISLICE_STATE_DIR); the CLI itself, once exited, is not one."""
    found = []
    for process in psutil.process_iter(["environ"], ad_value=None):
        environ = process.info["environ"] or {}
        if process.pid == os.getpid() or "MULTISLICE_EMULATION_ID" not in environ:
            continue
        home = environ.get("MULTISLICE_HOME") or environ.get("MULTISLICE_STATE_DIR")
        if home and Path(home).is_relative_to(root):
            found.append(process.pid)
    return found


def run_records(state_dir: Path, name: str, stack: Path = STACK) -> list[dict]:
    """Every record of log ``name`` of the run of ``stack`` (a stack file; the emu stack by
    default) under ``state_dir``, read as ``local status`` reads it: through a temporary
    emulated Cloud Storage over the stack's backend (the emulator stopped its own)."""
    config = load_stack_file(stack)
    with gcs_clients.clients_pointed_at(state_dir / config.stack / "gcs", state_dir / "reader.log") as stored:
        assert stored
        return read_records(RunDir(config.run_dir), name)


def long_stack(tmp_path: Path) -> Path:
    """The emu stack with so many steps that it cannot finish while a test interrupts it."""
    path = tmp_path / "long" / "Pulumi.emu.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(STACK.read_text().replace("    steps: 24", "    steps: 100000"))
    return path


#: A workload that only waits.
WAIT = "while :; do sleep 1; done"

#: A workload that only reports progress: process 0 writes a metrics record (docs/workloads.md,
#: "Metrics") every 0.2 s, a new object of the run's metrics log uploaded with curl to the emulated
#: Cloud Storage (``STORAGE_EMULATOR_HOST``, which the emulated VMs have); the others wait.
REPORT = (
    f"""[ "$MULTISLICE_PROCESS_ID" = 0 ] || exec sh -c '{WAIT}'\n"""
    + r"""d=${MULTISLICE_METRICS_DIR#gs://}; i=0
upload="$STORAGE_EMULATOR_HOST/upload/storage/v1/b/${d%%/*}/o?uploadType=media"
while :; do
  i=$((i + 1)); name=$(printf '%s/%08d.jsonl' "${d#*/}" "$i")
  printf '{"step": %d, "loss": 1.5, "time": %s}\n' "$i" "$(date +%s)" |
    curl -sSf -X POST --data-binary @- "$upload&name=$name" >/dev/null
  sleep 0.2
done"""
)


def waiting_stack(tmp_path: Path, command: str = WAIT) -> Path:
    """The emu stack whose workload is a shell ``command`` (:data:`WAIT`, or :data:`REPORT`), no
    JAX: for tests of stopping ``local up`` while its VMs run, which need the emulated VMs up (and
    with :data:`REPORT`, ``local up``'s progress lines), not a trainer's start-up."""
    import yaml

    path = tmp_path / "waiting" / "Pulumi.emu.yaml"
    path.parent.mkdir(exist_ok=True)
    document = yaml.safe_load(STACK.read_text())
    del document["config"]["multislice:training"]
    document["config"]["multislice:workload"] = {"command": ["bash", "-c", command], "steps": 100000}
    path.write_text(yaml.safe_dump(document))
    return path


#: The emu stacks' v4-8 is offered by the Cloud TPU API only; on Compute Engine the same shape
#: (1 VM × 4 chips a slice) is a v5p-8 (ct5p-hightpu-4t), in a zone Compute Engine offers v5p in
#: (docs/compute-engine.md section 1). The emulation runs on CPU either way.
ON_COMPUTE_ENGINE = (
    ("  multislice:acceleratorType: v4-8\n", "  multislice:acceleratorType: v5p-8\n"),
    ("  gcp:zone: us-central2-b\n", "  gcp:zone: us-east5-a\n"),
)
#: A multi-host slice instead: v5p-16, 2 VMs × 4 chips (Google's v5p table), fsdp over its 8 chips.
MULTI_HOST = (
    ("  multislice:acceleratorType: v5p-8\n", "  multislice:acceleratorType: v5p-16\n"),
    ("ici: {data: 1, fsdp: 4, tensor: 1}", "ici: {data: 1, fsdp: 8, tensor: 1}"),
    ("global_batch_size: 8", "global_batch_size: 16"),
)


def _steps(steps: int | None) -> list[tuple[str, str]]:
    """The edit of the emu stack's ``steps: 24`` to ``steps``, if given."""
    return [] if steps is None else [("    steps: 24\n", f"    steps: {steps}\n")]


def compute_engine_stack(tmp_path: Path, steps: int | None = None) -> Path:
    """The emu stack on the compute-engine backend, 2 slices × 2 VMs (:data:`MULTI_HOST`), with a
    synchronous checkpoint every 4 steps (its name, bucket and run directory are the emu stack's,
    which the helpers here read), and ``steps`` steps instead of the emu stack's, if given."""
    path = tmp_path / "stack" / STACK.name
    path.parent.mkdir()
    text = STACK.read_text()
    for old, new in (
        ("  multislice:capacity: spot\n", "  multislice:capacity: spot\n  multislice:backend: compute-engine\n"),
        *ON_COMPUTE_ENGINE,
        *MULTI_HOST,
        # Synchronous saves: step 4's checkpoint is finalized before step 5 starts, so the kill
        # (at a step ≥ 6) always finds it (tests/local/test_emulation.py, synchronous_saves).
        ("checkpoint: {interval_steps: 6, keep: 2}", "checkpoint: {interval_steps: 4, keep: 2, async_save: false}"),
        *_steps(steps),
    ):
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    return path


#: The emu stack on the gke backend: v4-16, 2 VMs × 4 chips a slice (GKE takes multi-host slice node
#: pools only), fsdp over its 8 chips.
ON_GKE = (
    ("  multislice:capacity: spot\n", "  multislice:capacity: spot\n  multislice:backend: gke\n"),
    ("  multislice:acceleratorType: v4-8\n", "  multislice:acceleratorType: v4-16\n"),
    ("ici: {data: 1, fsdp: 4, tensor: 1}", "ici: {data: 1, fsdp: 8, tensor: 1}"),
    ("global_batch_size: 8", "global_batch_size: 16"),
)


def gke_stack(tmp_path: Path, steps: int | None = None) -> Path:
    """The emu stack on the gke backend, 2 slices × 2 Pods (:data:`ON_GKE`; its name, bucket and run
    directory are the emu stack's), with ``steps`` steps instead of the emu stack's, if given."""
    path = tmp_path / "stack" / STACK.name
    path.parent.mkdir()
    text = STACK.read_text()
    for old, new in (*ON_GKE, *_steps(steps)):
        assert old in text
        text = text.replace(old, new)
    path.write_text(text)
    return path

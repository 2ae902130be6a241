"""Run the trainer as one process of a ``jax.distributed`` job on this machine, for the
multi-process tests (tests/training/test_agreement*.py); and the helpers those tests share.

    python -m tests.trainer_process CONFIG RUN_DIR PROCESS_ID NUM_PROCESSES PORT

Each process is one single-worker slice (``ClusterIdentity(slice_id=PROCESS_ID,
num_slices=NUM_PROCESSES)``) with the coordinator on ``127.0.0.1:PORT``, and calls
``training.train.main`` exactly as ``python -m training run`` does after reading the TPU
metadata; it exits with main's code.

Test-only fault injection (this module never ships to a VM):
``TEST_UNREADABLE_STEPS=12,8`` makes this process's reads of those checkpoint steps fail
(a per-host read failure: the other processes read the same files fine);
``TEST_RESTORE_DELAY_S=600`` blocks this process's first checkpoint read that long (a
restore stuck on slow storage); ``TEST_STEP_DELAY_S=0.3`` slows every training step by that much (so that a signal lands
mid-run); ``TEST_COMPILE_DELAY_S=45`` delays this process's compilation of the train step that
long (a peer that loaded it from the persistent compilation cache is that far ahead).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: Generous bound for any one trainer process of these tiny runs (the "hang" detector).
PROCESS_TIMEOUT_S = 240


def free_port() -> int:
    """A loopback port for a coordinator (outside the kernel's ephemeral range: infra.emulated.ports)."""
    from infra.emulated.ports import free_port as pick

    return pick()


def environment(devices: int = 2, **extra: str) -> dict[str, str]:
    from tests import compilation_cache, compile_flags  # here: the trainer subprocesses import this module too

    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "MULTISLICE_", "TEST_"))}
    env.update(
        {
            "JAX_PLATFORMS": "cpu",
            "JAX_NUM_CPU_DEVICES": str(devices),
            "PYTHONUNBUFFERED": "1",
            "XLA_FLAGS": compile_flags.with_fast_compile(None),
            # One compilation cache for the session's runs (tests/compilation_cache.py): process 0
            # loads what an earlier test compiled while its peer compiles, and is waited for
            # (test_a_peer_that_compiles_much_longer_is_waited_for).
            **compilation_cache.env(),
            "MULTISLICE_INIT_TIMEOUT_S": "120",
            "MULTISLICE_HEARTBEAT_TIMEOUT_S": "10",
            "MULTISLICE_AGREEMENT_TIMEOUT_S": "120",
            "MULTISLICE_PREEMPTION_GRACE_S": "30",
        }
    )
    env.update(extra)
    return env


class Job:
    """``num_processes`` trainer processes, each in its own process group, logging to
    ``<log_dir>/p<i>.log``."""

    def __init__(
        self,
        config_path: Path,
        run_dir: Path,
        log_dir: Path,
        num_processes: int = 2,
        *,
        start: bool = True,
        env: dict[int, dict[str, str]] | None = None,
    ):
        self.port = free_port()
        self.logs = [log_dir / f"p{i}.log" for i in range(num_processes)]
        self.procs: list[subprocess.Popen] = []
        for i in range(num_processes if start else 0):
            self.start(i, config_path, run_dir, num_processes, (env or {}).get(i, {}))

    def start(self, i: int, config_path: Path, run_dir: Path, num_processes: int, extra: dict[str, str]) -> None:
        with open(self.logs[i], "ab") as log:
            self.procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.trainer_process",
                        str(config_path),
                        str(run_dir),
                        str(i),
                        str(num_processes),
                        str(self.port),
                    ],
                    cwd=REPO,
                    env=environment(**extra),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def log(self, i: int) -> str:
        return self.logs[i].read_text(errors="replace")

    def wait_for(self, i: int, pattern: str, timeout_s: float = PROCESS_TIMEOUT_S) -> re.Match:
        """Wait until process ``i``'s log matches ``pattern`` (fails if it ends first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = re.search(pattern, self.log(i), re.MULTILINE)
            if match:
                return match
            if self.procs[i].poll() is not None:
                raise AssertionError(
                    f"process {i} exited {self.procs[i].returncode} before {pattern!r}:\n{self.log(i)[-3000:]}"
                )
            time.sleep(0.2)
        raise AssertionError(f"process {i} never logged {pattern!r}:\n{self.log(i)[-3000:]}")

    def signal(self, i: int, signum: int = signal.SIGTERM) -> None:
        self.procs[i].send_signal(signum)

    def wait(self, timeout_s: float = PROCESS_TIMEOUT_S) -> list[int]:
        """Every process's exit code; a process still running after ``timeout_s`` is a hang
        (killed, and the test fails with its log)."""
        deadline = time.monotonic() + timeout_s
        codes = []
        for i, proc in enumerate(self.procs):
            try:
                codes.append(proc.wait(timeout=max(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(
                    f"process {i} hung (still running after {timeout_s:.0f} s):\n{self.log(i)[-3000:]}"
                ) from None
        return codes

    def kill(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _inject_unreadable_steps(steps: set[int]) -> None:
    """This process's array reads of checkpoint ``steps`` fail, as a read error of that
    host's storage path would: inside Orbax's restore, after its collective set-up, where
    the array data is read (the other processes read the same files fine)."""
    import json as json_lib

    from orbax.checkpoint._src.serialization import serialization

    real_deserialize = serialization.async_deserialize
    markers = [f"/checkpoints/{step}/" for step in steps]

    async def async_deserialize(user_sharding, tensorstore_spec, *args, **kwargs):
        spec = tensorstore_spec.to_json() if hasattr(tensorstore_spec, "to_json") else tensorstore_spec
        text = json_lib.dumps(spec, default=str)
        for marker in markers:
            if marker in text:
                raise OSError(f"injected read failure of checkpoint step {marker.split('/')[2]} on this host")
        return await real_deserialize(user_sharding, tensorstore_spec, *args, **kwargs)

    serialization.async_deserialize = async_deserialize


def _block_restore(delay_s: float) -> None:
    import orbax.checkpoint as ocp

    real_restore = ocp.CheckpointManager.restore

    def restore(self, step, *args, **kwargs):
        print(f"TEST: restore of step {step} blocked for {delay_s:.0f} s", flush=True)
        time.sleep(delay_s)
        return real_restore(self, step, *args, **kwargs)

    ocp.CheckpointManager.restore = restore


def _slow_steps(delay_s: float) -> None:
    from training.data.text import TextDataset

    real_rows = TextDataset.train_rows

    def train_rows(self, *args, **kwargs):
        time.sleep(delay_s)
        return real_rows(self, *args, **kwargs)

    TextDataset.train_rows = train_rows


def _slow_compile(delay_s: float) -> None:
    """The train step this process builds takes ``delay_s`` longer to compile, once (its first
    lowering, or its first call when the trainer does not compile ahead of time)."""
    from training import step

    real_make = step.make_train_step

    compiling = threading.Lock()
    compiled = threading.Event()

    def first_compile() -> None:
        # Once a process, however many times (and from however many threads) the step is
        # lowered: the trainer lowers it in its warm-up thread and again before the first step.
        # After that, each call only reads the event: no lock on the step's path.
        if compiled.is_set():
            return
        with compiling:
            if not compiled.is_set():
                time.sleep(delay_s)
                compiled.set()

    def make_train_step(*args, **kwargs):
        jitted = real_make(*args, **kwargs)

        class SlowToCompile:
            def lower(self, *a, **k):
                first_compile()
                return jitted.lower(*a, **k)

            def __call__(self, *a, **k):
                first_compile()
                return jitted(*a, **k)

        return SlowToCompile()

    step.make_train_step = make_train_step


def main(argv: list[str]) -> int:
    config_path, run_dir, process_id, num_processes, port = argv
    from training import train
    from training.__main__ import _setup_logging
    from training.cluster import ClusterIdentity
    from training.config import load_train_config

    unreadable = os.environ.get("TEST_UNREADABLE_STEPS")
    if unreadable:
        _inject_unreadable_steps({int(s) for s in unreadable.split(",")})
    if os.environ.get("TEST_RESTORE_DELAY_S"):
        _block_restore(float(os.environ["TEST_RESTORE_DELAY_S"]))
    if os.environ.get("TEST_STEP_DELAY_S"):
        _slow_steps(float(os.environ["TEST_STEP_DELAY_S"]))
    if os.environ.get("TEST_COMPILE_DELAY_S"):
        _slow_compile(float(os.environ["TEST_COMPILE_DELAY_S"]))
    identity = ClusterIdentity(
        worker=0,
        workers_per_slice=1,
        slice_id=int(process_id),
        num_slices=int(num_processes),
        coordinator_address=f"127.0.0.1:{port}",
    )
    _setup_logging(f"p{identity.process_id}")
    return train.main(load_train_config(Path(config_path).read_bytes()), run_dir, identity)


if __name__ == "__main__":
    from training import train

    train.exit_process(main(sys.argv[1:]))  # as the trainer's command line ends


def write_config(path: Path, config) -> Path:
    path.write_text(json.dumps(json.loads(config.model_dump_json())))
    return path

"""The local emulation of a stack's multislice queued resource.

``LocalQueuedResource(config, paths, script).up(...)`` runs, on this machine, what the stack
runs on Cloud TPU:

* one process group per TPU VM (slices × workers per slice), each booting the stack's
  startup script exactly as rendered for GCP (infra.startup), with its own loopback
  metadata server (infra.local.metadata) answering the keys a real TPU VM has;
* ``chips per host`` CPU devices per VM (``JAX_NUM_CPU_DEVICES``), ``JAX_PLATFORMS=cpu``;
* only the environment step differs: ``MULTISLICE_PYTHON`` points the script at this
  machine's virtualenv instead of building one;
* the checkpoint bucket is a directory; the run directory is ``<bucket>/runs/<run name>``.

It injects faults (infra.local.faults) when training reports the given step, then repairs
like Cloud TPU auto-repair: the failed slice is recreated (its VMs get fresh disks), every
other slice is restarted, and the trainer resumes from the newest finalized checkpoint.

Nothing is left behind: Ctrl-C / SIGTERM / errors stop every VM (SIGTERM, grace, SIGKILL)
and every metadata server; ``emulator.json`` in the stack's state directory records the
process groups so ``multislice local down`` can stop a run whose emulator died.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.config import StackConfig
from infra.local import summary as summary_lib
from infra.local.faults import Fault
from infra.local.metadata import MetadataServer
from infra.local.vm import EmulatedVM

#: Environment variable every emulated VM process carries, with this run's id: lets tests
#: and ``local down`` find stray processes.
EMULATION_ID_ENV = "MULTISLICE_EMULATION_ID"
MEGASCALE_PORT = 8080  # port part of MEGASCALE_COORDINATOR_ADDRESS as a QR sets it (JAX replaces it)


class EmulationError(RuntimeError):
    """The emulated run cannot go on; the message says why and where the logs are."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached the emulator."""


@dataclasses.dataclass(frozen=True)
class LocalPaths:
    """Where a stack's emulation keeps its state (``<state root>/<stack>/``)."""

    root: Path
    run_name: str

    @property
    def bucket(self) -> Path:
        return self.root / "bucket"

    @property
    def run_dir(self) -> Path:
        return self.bucket / "runs" / self.run_name

    @property
    def state_file(self) -> Path:
        return self.root / "emulator.json"

    def vm_home(self, slice_id: int, worker: int) -> Path:
        return self.root / "vms" / f"slice-{slice_id}-worker-{worker}"

    def vm_log(self, slice_id: int, worker: int) -> Path:
        return self.root / "logs" / f"slice-{slice_id}-worker-{worker}.log"


@dataclasses.dataclass
class Options:
    """Emulation knobs (CLI flags of ``multislice local up``)."""

    faults: list[Fault] = dataclasses.field(default_factory=list)
    coordinator_port: int | None = None  # None: a free port per boot
    heartbeat_timeout_s: int = 10
    init_timeout_s: int = 300
    preempt_grace_s: float = 30.0  # GCE's preemption notice period
    reboot_grace_s: float = 5.0
    timeout_s: float = 3600.0
    stall_timeout_s: float = 600.0
    poll_s: float = 0.25


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_port_free(port: int) -> None:
    """Raise EmulationError if 127.0.0.1:``port`` cannot be bound."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as err:
            raise EmulationError(
                f"--coordinator-port {port} is already in use ({err.strerror}); choose another port or omit "
                "the option to use a free one"
            ) from None


def acquire_lock(paths: LocalPaths):
    """Hold ``<state>/lock`` (flock) for this process's lifetime; None if another holds it.

    The kernel releases the lock when the process exits, however it exits.
    """
    import fcntl

    paths.root.mkdir(parents=True, exist_ok=True)
    handle = open(paths.root / "lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def process_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def emulator_alive(state: dict[str, Any]) -> bool:
    """True if the emulator recorded in ``state`` still runs: same pid AND same start time
    (a reused pid belongs to another process and is never signalled)."""
    pid = int(state.get("pid", 0) or 0)
    if not pid or not pid_alive(pid):
        return False
    recorded = state.get("pid_start")
    current = process_start_time(pid)
    return recorded is None or current is None or recorded == current


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class JsonlTail:
    """Complete new records of a JSON-lines file, as the trainer appends them."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def poll(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        records = []
        for line in data[: end + 1].splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records


class MetricsTail(JsonlTail):
    """Follows ``metrics.jsonl``: the newest step and loss, and when it last advanced."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.last_step = 0
        self.last_loss: float | None = None
        self.last_change = time.monotonic()

    def poll(self) -> list[dict[str, Any]]:
        records = super().poll()
        for record in records:
            if "loss" in record:
                self.last_step = int(record["step"])
                self.last_loss = float(record["loss"])
                self.last_change = time.monotonic()
        return records


class LocalQueuedResource:
    """Run a stack's queued resource as local processes (see module docstring).

    Args:
      config: the validated stack.
      paths: state directories.
      startup_script: the rendered startup script text.
      report: ``(message) -> None`` for progress and events.
    """

    def __init__(
        self,
        config: StackConfig,
        paths: LocalPaths,
        startup_script: str,
        report: Callable[[str], None] = print,
    ):
        self.config = config
        self.paths = paths
        self.startup_script = startup_script
        self.report = report
        self.emulation_id = uuid.uuid4().hex
        self.vms: list[EmulatedVM] = []
        self.servers: list[MetadataServer] = []
        self.repairs = 0
        self.faults_fired: list[str] = []

    # Topology -------------------------------------------------------------------------------

    def _attributes(self, slice_id: int, worker: int, port: int) -> dict[str, str]:
        acc = self.config.accelerator
        node = f"{self.config.stack}-{slice_id}" if self.config.slices > 1 else self.config.stack
        endpoints = ",".join(f"{node}-w-{i}:{i}:127.0.0.1" for i in range(acc.hosts))
        tpu_env = [
            f"ACCELERATOR_TYPE: '{acc.name}'",
            f"WORKER_ID: '{worker}'",
            f"NODE_ID: '{node}'",
        ]
        if self.config.slices > 1:
            tpu_env += [
                f"MEGASCALE_COORDINATOR_ADDRESS: '127.0.0.1:{MEGASCALE_PORT}'",
                f"MEGASCALE_NUM_SLICES: '{self.config.slices}'",
                f"MEGASCALE_SLICE_ID: '{slice_id}'",
                f"MEGASCALE_PORT: '{MEGASCALE_PORT}'",
            ]
        return {
            "agent-worker-number": str(worker),
            "worker-network-endpoints": endpoints,
            "tpu-env": "\n".join(tpu_env) + "\n",
            "accelerator-type": acc.name,
            "startup-script": self.startup_script,
            "multislice-run-dir": str(self.paths.run_dir.resolve()),
        }

    def _vm_env(self, coordinator_port: int, options: Options) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("JAX_", "XLA_", "MULTISLICE_", "GCE_METADATA", "TPU_", "MEGASCALE_"))
        }
        env.update(
            {
                EMULATION_ID_ENV: self.emulation_id,
                "MULTISLICE_PYTHON": sys.executable,
                "MULTISLICE_COORDINATOR_PORT": str(coordinator_port),
                "MULTISLICE_HEARTBEAT_TIMEOUT_S": str(options.heartbeat_timeout_s),
                "MULTISLICE_INIT_TIMEOUT_S": str(options.init_timeout_s),
                "JAX_PLATFORMS": "cpu",
                "JAX_NUM_CPU_DEVICES": str(self.config.accelerator.chips_per_host),
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def _create(self) -> None:
        for slice_id in range(self.config.slices):
            for worker in range(self.config.accelerator.hosts):
                server = MetadataServer({})
                self.servers.append(server)
                self.vms.append(
                    EmulatedVM(
                        slice_id,
                        worker,
                        self.paths.vm_home(slice_id, worker),
                        self.paths.vm_log(slice_id, worker),
                        server,
                    )
                )

    def _boot_all(self, options: Options) -> None:
        port = options.coordinator_port or free_port()
        env = self._vm_env(port, options)
        for vm in self.vms:
            vm.metadata.update(self._attributes(vm.slice_id, vm.worker, port))
        for vm in self.vms:
            vm.boot(env)
        self._write_state()

    def _write_state(self) -> None:
        state = {
            "pid": os.getpid(),
            "pid_start": process_start_time(os.getpid()),
            "stack": self.config.stack,
            "emulation_id": self.emulation_id,
            "vms": [{"slice": vm.slice_id, "worker": vm.worker, "pgid": vm.pgid} for vm in self.vms],
        }
        tmp = self.paths.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.paths.state_file)

    # Faults and repair ----------------------------------------------------------------------

    def _inject(self, fault: Fault, options: Options, observed_step: int) -> None:
        # The emulator polls metrics.jsonl, so training may already be past the fault's step
        # (a fast step, a loaded machine); the report says where training actually was.
        targets = [vm for vm in self.vms if vm.slice_id == fault.slice_id]
        how = "SIGTERM, then SIGKILL after grace" if fault.kind == "preempt" else "SIGKILL"
        self.report(f"fault: {fault} ({how}; training had reported step {observed_step})")
        self.faults_fired.append(str(fault))
        if fault.kind == "preempt":
            for vm in targets:
                vm.signal(signal.SIGTERM)
            deadline = time.monotonic() + options.preempt_grace_s
            while time.monotonic() < deadline and any(vm.group_alive() for vm in targets):
                time.sleep(0.1)
        for vm in targets:
            vm.kill()
        self._repair(fault.slice_id, options)

    def _repair(self, failed_slice: int, options: Options) -> None:
        """Cloud TPU auto-repair: recreate the failed slice, restart every other slice."""
        others = sorted({vm.slice_id for vm in self.vms if vm.slice_id != failed_slice})
        self.report(
            f"repair: recreating slice {failed_slice}"
            + (f", restarting slice(s) {', '.join(map(str, others))}" if others else "")
        )
        for vm in self.vms:
            if vm.slice_id == failed_slice:
                vm.wipe_disk()
            else:
                vm.stop(options.reboot_grace_s)
        self.repairs += 1
        self._boot_all(options)

    # Main loop ------------------------------------------------------------------------------

    def up(self, options: Options) -> dict[str, Any]:
        """Boot every VM, supervise until the run completes, return the run summary.

        Raises:
          EmulationError: a VM gave up, no progress for ``stall_timeout_s``, or the run
            exceeded ``timeout_s``; every process is stopped first.
          Interrupted: Ctrl-C / SIGTERM; every process is stopped first.
        """
        start = time.monotonic()
        self.paths.root.mkdir(parents=True, exist_ok=True)
        self.paths.run_dir.mkdir(parents=True, exist_ok=True)
        pending = sorted(options.faults, key=lambda f: f.step)
        tail = MetricsTail(self.paths.run_dir / "metrics.jsonl")
        tail.poll()
        events = JsonlTail(self.paths.run_dir / "events.jsonl")
        events.poll()
        total = self.config.training.steps
        for fault in list(pending):
            if fault.step <= tail.last_step:
                self.report(f"note: {fault} will not fire: the run is already at step {tail.last_step}")
                pending.remove(fault)
        previous_handlers = self._install_signal_handlers()
        try:
            self._create()
            self.report(
                f"booting {len(self.vms)} VM(s): {self.config.slices} slice(s) × {self.config.accelerator.hosts} "
                f"worker(s) of {self.config.accelerator_type}, {self.config.accelerator.chips_per_host} CPU devices each"
            )
            self._boot_all(options)
            last_report_step = tail.last_step
            while True:
                time.sleep(options.poll_s)
                tail.poll()
                for event in events.poll():
                    self._report_event(event)
                if tail.last_step != last_report_step:
                    self._progress(tail, total)
                    last_report_step = tail.last_step
                if pending and tail.last_step >= pending[0].step:
                    self._inject(pending.pop(0), options, tail.last_step)
                    tail.last_change = time.monotonic()
                    continue
                codes = [vm.poll() for vm in self.vms]
                failed = [(vm, code) for vm, code in zip(self.vms, codes) if code not in (None, 0)]
                if failed:
                    vm, code = failed[0]
                    raise EmulationError(
                        f"{vm.name} stopped with exit status {code}; its log: {vm.log_path}\n"
                        + _tail_text(vm.log_path)
                    )
                if all(code == 0 for code in codes):
                    break
                now = time.monotonic()
                if now - start > options.timeout_s:
                    raise EmulationError(f"the run exceeded --timeout {options.timeout_s:.0f} s; logs: {self.paths.root / 'logs'}")
                if now - tail.last_change > options.stall_timeout_s:
                    first = self.vms[0]
                    raise EmulationError(
                        f"no training progress for {options.stall_timeout_s:.0f} s (last step {tail.last_step}); "
                        f"logs: {self.paths.root / 'logs'}; the end of {first.name}'s log:\n" + _tail_text(first.log_path)
                    )
        finally:
            self.shutdown()
            self._restore_signal_handlers(previous_handlers)
        result = summary_lib.summarize(self.paths.run_dir, total)
        result.update(
            {
                "wall_seconds": round(time.monotonic() - start, 3),
                "repairs": self.repairs,
                "faults": self.faults_fired,
                "logs_dir": str(self.paths.root / "logs"),
            }
        )
        return result

    def _report_event(self, event: dict[str, Any]) -> None:
        kind, step = event.get("event"), event.get("step")
        if kind == "start":
            how = "resumed from the checkpoint of step" if event.get("restored") else "started at step"
            self.report(f"training {how} {step} ({event.get('processes')} processes, {event.get('devices')} devices)")
        elif kind == "checkpoint" and event.get("preemption"):
            self.report(f"preemption checkpoint saved at step {step}")
        elif kind == "preempted":
            self.report(f"training stopped after the preemption checkpoint of step {step}")

    def _progress(self, tail: MetricsTail, total: int) -> None:
        every = max(1, total // 10)
        if tail.last_step % every == 0 or tail.last_step == total:
            self.report(f"step {tail.last_step}/{total}  loss {tail.last_loss:.4f}")

    def shutdown(self) -> None:
        """Stop every VM (SIGTERM, short grace, SIGKILL) and metadata server; forget the state file."""
        alive = [vm for vm in self.vms if vm.group_alive()]
        for vm in alive:
            vm.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(vm.group_alive() for vm in alive):
            time.sleep(0.1)
        for vm in self.vms:
            vm.kill()
        for server in self.servers:
            server.stop()
        self.servers.clear()
        self.paths.state_file.unlink(missing_ok=True)

    def _install_signal_handlers(self) -> dict[int, Any]:
        def interrupt(signum, frame):
            raise Interrupted(signal.Signals(signum).name)

        previous = {}
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            try:
                previous[sig] = signal.signal(sig, interrupt)
            except ValueError:  # not the main thread
                pass
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _tail_text(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return ""
    return "\n".join("    " + line for line in text)


def read_state(paths: LocalPaths) -> dict[str, Any] | None:
    try:
        return json.loads(paths.state_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def stop_recorded(paths: LocalPaths, wait_s: float = 15.0, signal_emulator: bool = True) -> list[str]:
    """Stop a run recorded in the state file (``multislice local down``).

    Asks the emulator to shut down (SIGTERM; only if the recorded pid is still that
    emulator) and waits; then SIGKILLs every process that carries the run's emulation id.
    Returns what it did, one line per action.
    """
    state = read_state(paths)
    if state is None:
        return []
    actions = []
    pid = int(state.get("pid", 0) or 0)
    if signal_emulator and pid != os.getpid() and emulator_alive(state):
        os.kill(pid, signal.SIGTERM)
        actions.append(f"asked emulator pid {pid} to stop")
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and pid_alive(pid):
            time.sleep(0.1)
    emulation_id = state.get("emulation_id")
    strays = find_processes(emulation_id) if emulation_id else []
    for pid in strays:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    if strays:
        actions.append(f"killed {len(strays)} emulated VM process(es): {' '.join(map(str, strays))}")
    paths.state_file.unlink(missing_ok=True)
    return actions


def find_processes(emulation_id: str) -> list[int]:
    """PIDs of live processes whose environment carries this emulation id (Linux /proc)."""
    marker = f"{EMULATION_ID_ENV}={emulation_id}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def discard_run(paths: LocalPaths) -> bool:
    """``--fresh``: delete the run directory and the VMs' disks and logs; True if a run existed."""
    existed = paths.run_dir.exists()
    for path in (paths.run_dir, paths.root / "vms", paths.root / "logs"):
        shutil.rmtree(path, ignore_errors=True)
    return existed

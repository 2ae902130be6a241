"""How a recorded local run is stopped (``multislice local down``), and what ``local up --fresh``
discards: the VMs' disks and logs, and the objects of the run directory. The records they act on:
:mod:`infra.emulated.state`.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from typing import TYPE_CHECKING

from infra import invocation
from infra.emulated import supervisor
from infra.emulated.state import LocalPaths, emulator_alive, find_processes, forget_state, read_state, say_in_logs

if TYPE_CHECKING:  # imported by the functions that need it: `local down` stays light
    from training.run_dir import RunDir


def stop_recorded(paths: LocalPaths, wait_s: float = 30.0, signal_emulator: bool = True) -> list[str]:
    """Stop a run recorded in the state file (``multislice local down``) and wait until every
    one of its processes is gone.

    Sends SIGTERM to the emulator (only if the recorded pid is still that emulator), which
    stops its VMs and its storage server, and at once to each recorded VM's systemd (only to
    processes that carry the run's emulation id), so that the VMs stop even while the
    emulator is busy; waits up to ``wait_s`` seconds for the emulator to exit; then SIGKILLs
    every process that still carries the emulation id, waits (up to ``wait_s``) until they are
    gone, and forgets the state. Returns what it did, one line per action; a recorded emulator
    that outlives ``wait_s`` is reported and its state kept.
    """
    state = read_state(paths)
    if state is None:
        return []
    actions = []
    pid = int(state.get("pid", 0) or 0)
    emulation_id = str(state.get("emulation_id") or "")
    if signal_emulator and pid != os.getpid() and emulator_alive(state):
        try:
            paths.down_request.write_text(f"{os.getpid()}\n")
        except OSError:
            pass  # the emulator then reports a plain SIGTERM: still stopped
        _say_in_vm_logs(paths, state.get("vms", []))
        os.kill(pid, signal.SIGTERM)
        actions.append(f"asked emulator pid {pid} to stop")
        members = set(find_processes(emulation_id)) if emulation_id else set()
        systemds = [vm["pgid"] for vm in state.get("vms", []) if vm.get("pgid") in members]
        if supervisor.kill_pids(systemds, signal.SIGTERM):
            actions.append(f"sent SIGTERM to {len(systemds)} emulated VM(s)")
        if not _wait_gone_repeating(pid, signal.SIGTERM, wait_s):
            actions.append(
                f"emulator pid {pid} is still running after {wait_s:.0f} s; "
                f"run `{invocation.command('local down', paths.root.name)}` again"
            )
            return actions
    killed = supervisor.kill_pids(find_processes(emulation_id)) if emulation_id else []
    if killed:
        actions.append(f"killed {len(killed)} emulated VM process(es): {' '.join(map(str, killed))}")
        deadline = time.monotonic() + wait_s
        while find_processes(emulation_id) and time.monotonic() < deadline:
            time.sleep(0.05)
    forget_state(paths)
    return actions


#: The line ``local down`` appends to each VM's log before its SIGTERM: on a TPU VM a stop notice may be a
#: preemption, a maintenance event or a stop, and the trainer cannot tell which (training/preemption.py);
#: here the emulator knows, and says so where the trainer's own line follows.
DOWN_LINE = "local down: a stop you asked for (multislice local down); the trainer's stop notice below is this stop\n"


def _say_in_vm_logs(paths: LocalPaths, vms: list) -> None:
    """Append :data:`DOWN_LINE` to each recorded VM's log (a record that names no VM is skipped; the
    stop goes on whatever cannot be written)."""
    logs = []
    for vm in vms:
        try:
            logs.append(paths.vm_log(int(vm["slice"]), int(vm["worker"])))
        except (KeyError, TypeError, ValueError):
            continue
    say_in_logs(logs, DOWN_LINE)


def _wait_gone_repeating(pid: int, sig: signal.Signals, timeout_s: float, every_s: float = 3.0) -> bool:
    """Wait up to ``timeout_s`` for ``pid`` to exit, sending ``sig`` again every ``every_s``
    seconds (Python may drop the exception its handler raised: ``stop_signals.signals_raise``);
    True if it exited."""
    deadline = time.monotonic() + timeout_s
    while not supervisor.wait_gone(pid, min(every_s, max(0.0, deadline - time.monotonic()))):
        if time.monotonic() >= deadline:
            return False
        supervisor.kill_pids([pid], sig)
    return True


def discard_machines(paths: LocalPaths) -> None:
    """``--fresh``, before the storage server starts: delete the VMs' disks and the logs."""
    for path in (paths.root / "vms", paths.logs_dir):
        shutil.rmtree(path, ignore_errors=True)


def discard_run(run_dir: RunDir) -> bool:
    """``--fresh``: delete every object of the run directory (through the storage API);
    True if there was any."""
    if not run_dir.list("*"):
        return False
    run_dir.path.rmtree()
    return True

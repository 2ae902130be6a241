"""``multislice local exec``: the command in each emulated VM of a running ``local up``.

An emulated TPU VM (``infra.emulated.vm``) is a process session led by its emulated systemd,
started in the VM's local disk (``<state>/vms/slice-S-worker-W``, ``MULTISLICE_HOME``) with the
environment the emulator gives every VM: its own metadata server (``GCE_METADATA_IP``), the
emulated Cloud Storage, the CPU devices, the emulation id (``infra.local.topology``). A command
runs there as a login on the VM would: ``bash -c <line>`` in the VM's directory with that
environment, read from the VM's systemd process at the time of the call (``psutil``,
https://psutil.readthedocs.io/en/latest/#psutil.Process.environ), so it sees the VM as booted
now (after a repair, the new metadata server). The VMs are found through the running
emulator's state file (``infra.emulated.state``); a VM that is not running at that moment (being
restarted or repaired) is refused, with nothing started.

A command started with ``--background`` carries the run's emulation id, so ``multislice local
down`` stops it with the rest; a VM reset or repair does not (it is not one of the VM's units).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from infra import invocation
from infra.emulated import state as local_state
from infra.emulated.state import EMULATION_ID_ENV, LocalPaths
from infra.remote.fanout import Target
from infra.remote.selection import RemoteError, Worker


def running_state(config, paths: LocalPaths) -> dict:
    """The running emulator's recorded state.

    Raises:
      RemoteError: no ``local up`` of the stack runs (its queued resource deleted once the run
        completed, or never started), naming what to run first.
    """
    stack = config.stack
    state = local_state.read_state(paths)
    if state is not None and local_state.emulator_alive(state):
        return state
    if local_state.read_deletion(paths) is not None:
        raise RemoteError(
            f"stack {stack}'s emulated queued resource was deleted once its run completed (deleteOnComplete): "
            f"nothing runs; start a new run with `{invocation.command('local up', stack, after='--fresh')}` first"
        )
    raise RemoteError(
        f"stack {stack} has no local run: start one with `{invocation.command('local up', stack)}` first "
        "(in another terminal)"
    )


def vm_environment(pid: int, emulation_id: str) -> dict[str, str] | None:
    """The environment of process ``pid`` if it is a VM of emulation ``emulation_id``, else
    None (gone, or the pid now belongs to another process)."""
    import psutil

    try:
        env = psutil.Process(pid).environ()
    except (psutil.Error, OSError):
        return None
    return env if env.get(EMULATION_ID_ENV) == emulation_id else None


def targets(config, paths: LocalPaths, workers: Sequence[Worker], line: str) -> list[Target]:
    """One :class:`~infra.remote.fanout.Target` per worker: ``bash -c <line>`` in its VM's
    directory with its VM's environment.

    Raises:
      RemoteError: no local run (:func:`running_state`), or a selected VM not running now.
    """
    state = running_state(config, paths)
    emulation_id = str(state.get("emulation_id") or "")
    booted = {(int(vm["slice"]), int(vm["worker"])): vm.get("pgid") for vm in state.get("vms") or []}
    found, missing = [], []
    for worker in workers:
        pid = booted.get((worker.slice_id, worker.worker))
        env = vm_environment(int(pid), emulation_id) if pid else None
        if env is None:
            missing.append(worker.name)
            continue
        found.append(
            Target(
                worker.slice_id,
                worker.worker,
                ["bash", "-c", line],
                env=env,
                cwd=paths.vm_home(worker.slice_id, worker.worker),
            )
        )
    if missing:
        raise RemoteError(
            f"{', '.join(missing)} of stack {config.stack}'s local run "
            f"{'is' if len(missing) == 1 else 'are'} not running now (booting, or restarted by a reset or repair); "
            f"nothing was run; try again in a moment ({invocation.command('local status', config.stack)})",
            1,
        )
    return found


def booted_groups(state: dict) -> dict[tuple[int, int], int]:
    """(slice, worker) → the process group of that VM's current boot, from the emulator's state."""
    return {(int(vm["slice"]), int(vm["worker"])): int(vm["pgid"]) for vm in state.get("vms") or [] if vm.get("pgid")}


def await_reboots(
    config,
    paths: LocalPaths,
    before: dict[tuple[int, int], int],
    *,
    say: Callable[[str], None],
    deadline: float,
    poll_s: float = 0.2,
) -> None:
    """Wait until every VM of the running emulation runs a boot newer than ``before``'s (a new
    process group recorded in the state file, and alive), saying each as it comes back.

    Raises:
      RemoteError: the emulator ended, or ``deadline`` (``time.monotonic()``) passed, first (exit 1).
    """
    import psutil

    vms = config.slices * config.workers_per_slice
    back: set[tuple[int, int]] = set()
    while True:
        current = local_state.read_state(paths)
        if current is None or not local_state.emulator_alive(current):
            raise RemoteError(f"stack {config.stack}'s local run ended before every VM was back", 1)
        for key, pgid in sorted(booted_groups(current).items()):
            if key not in back and pgid != before.get(key) and psutil.pid_exists(pgid):
                back.add(key)
                say(f"slice {key[0]} worker {key[1]}: booted again")
        if len(back) == vms:
            return
        if time.monotonic() >= deadline:
            raise RemoteError(
                f"{vms - len(back)} of {vms} VM(s) not booted again in time; "
                f"see `{invocation.command('local status', config.stack)}` "
                f"and the VMs' logs in {paths.logs_dir}",
                1,
            )
        time.sleep(poll_s)

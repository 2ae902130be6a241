"""The capacity of a stack's local emulation, as ``multislice status`` reads it: the emulator's
state file (``infra.emulated.state``) into the types every backend reports in
(:mod:`infra.backends.capacity`): ACTIVE while the emulator runs; a slice is READY while every
process group of its emulated VMs lives.
"""

from __future__ import annotations

import os
from typing import Any

from infra import invocation
from infra.backends.capacity import CapacityStatus, SliceStatus, deleted


def read_local(paths: Any, qr_id: str, node_ids: list[str], workers_per_slice: int) -> CapacityStatus:
    """The emulated queued resource of a stack whose emulation keeps its state in ``paths``
    (``infra.emulated.state.LocalPaths``): ACTIVE while the emulator runs, else DELETED when its
    VMs deleted it once the run completed, else NOT_RUNNING."""
    from infra.emulated import state as local_state

    state = local_state.read_state(paths)
    running = bool(state and local_state.emulator_alive(state))
    if not running:
        orphans = local_state.find_processes(state["emulation_id"]) if state and state.get("emulation_id") else []
        record = local_state.read_deletion(paths)
        if record is not None and not orphans:
            from infra.clock import clock

            when = record.get("deleted_at")
            at = f" at {clock(when)}" if isinstance(when, (int, float)) else ""
            return deleted(
                qr_id,
                f"deleted by worker 0 of slice 0{at} once the run was complete (deleteOnComplete)",
                emulated=True,
            )
        detail = None
        if orphans:
            assert state is not None  # the orphans carry its emulation id
            detail = (
                f"the emulator is gone but {len(orphans)} emulated process(es) still run; "
                f"stop them with: {invocation.command('local down', str(state.get('stack')))}"
            )
        return CapacityStatus(qr_id, "NOT_RUNNING", emulated=True, detail=detail)
    assert state is not None  # running
    vms = state.get("vms") or []
    slices = []
    for index, node_id in enumerate(node_ids):
        groups = [int(vm["pgid"]) for vm in vms if vm.get("slice") == index and vm.get("pgid")]
        alive = sum(_group_alive(pgid) for pgid in groups)
        slices.append(
            SliceStatus(
                index,
                node_id,
                "READY" if groups and alive == workers_per_slice else "REPAIRING",
                None,
                alive,
                workers_per_slice,
            )
        )
    return CapacityStatus(qr_id, "ACTIVE", emulated=True, detail=f"emulator pid {state['pid']}", slices=slices)


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a process (signal 0: nothing is sent)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

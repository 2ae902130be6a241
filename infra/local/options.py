"""The options of an emulation (the flags of ``multislice local up``) and how it ends when it
cannot go on (:class:`EmulationError`) or is stopped (:class:`Interrupted`); used by
:mod:`infra.local.emulated_stack` and :mod:`infra.local.lifecycle`."""

from __future__ import annotations

import dataclasses
from typing import Any

from infra.local.boot_watch import default_boot_timeout
from infra.local.faults import Fault, FaultSpecError, parse_fault
from infra.local.withholds import Withhold, parse_withholds
from infra.startup import STOP_TIMEOUT_S

#: Seconds the VMs get to end on their own after their capacity was deleted on completion (worker
#: 0 of slice 0 writes its last ``capacity:`` line, the others are done too); then those left are
#: stopped (``--node-delete-delay``; the queued resource's emulation,
#: :class:`infra.backends.queued_resource.emulated_api.DeleteOnComplete`).
NODE_DELETE_DELAY_S = 30.0


class EmulationError(RuntimeError):
    """The emulated run cannot go on; the message says why and where the logs are."""


class Interrupted(Exception):
    """Ctrl-C or SIGTERM reached the emulator."""


@dataclasses.dataclass
class Options:
    """Emulation knobs (CLI flags of ``multislice local up``)."""

    faults: list[Fault] = dataclasses.field(default_factory=list)
    #: Slice → how long its capacity is withheld after the first fault that strikes it (``--withhold``).
    withhold: dict[int, Withhold] = dataclasses.field(default_factory=dict)
    #: Steps the emulated trainers wait after until released (``--hold-at``; FaultGates).
    holds: list[int] = dataclasses.field(default_factory=list)
    coordinator_port: int | None = None  # None: a free port per boot
    heartbeat_timeout_s: int = 10
    init_timeout_s: int = 300
    preempt_grace_s: float = 30.0  # GCE's preemption notice period
    reboot_grace_s: float = 5.0  # the slices a repair restarts: their job already lost a peer
    #: A reset's SIGTERM to SIGKILL: the trainer unit's ``TimeoutStopSec=``, what each VM's own
    #: shutdown gives it (the trainer saves the step its processes agree on, as on a notice).
    reset_grace_s: float = float(STOP_TIMEOUT_S)
    timeout_s: float = 3600.0
    stall_timeout_s: float = 600.0
    boot_timeout_s: float = dataclasses.field(default_factory=default_boot_timeout)  # each VM, to its trainer
    poll_s: float = 0.25
    node_delete_delay_s: float = (
        NODE_DELETE_DELAY_S  # after the queued resource is deleted on complete, running VMs are stopped
    )


def fault_options(
    config: Any, *, kill: list[str], preempt: list[str], crash: list[str], withhold: list[str]
) -> tuple[list[Fault], dict[int, Withhold]]:
    """The faults and withholds of ``local up``'s ``--kill``, ``--preempt``, ``--crash`` and
    ``--withhold`` values for the stack ``config`` (a ``StackConfig``).

    Raises:
      FaultSpecError: one line naming the option: a value :func:`infra.local.faults.parse_fault` or
        :func:`infra.local.withholds.parse_withholds` refuses, or a ``--crash`` where no bundled trainer
        runs on a VM (a backend whose containers run it: gke's Pods; a stack's own command:
        ``multislice:workload``).
    """
    slices, total = config.slices, config.total_steps
    faults = [parse_fault("kill", spec, slices=slices, total_steps=total) for spec in kill]
    faults += [parse_fault("preempt", spec, slices=slices, total_steps=total) for spec in preempt]
    faults += [parse_fault("crash", spec, slices=slices, total_steps=total) for spec in crash]
    on_a_vm = config.backend_spec.supervisor == "systemd"  # not a Pod's container (the gke backend)
    if crash and (not on_a_vm or config.workload is not None):
        where = (
            f"its {config.backend_spec.worker_noun}' containers run it"
            if not on_a_vm
            else "the stack runs its own command"
        )
        raise FaultSpecError(f"--crash {crash[0]}: it strikes the bundled trainer on a VM, and {where}: use --kill")
    return faults, parse_withholds(withhold, slices=slices, faults=faults, stack=config)

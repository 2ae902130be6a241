"""A struck slice that the platform does not recreate by itself, in ``multislice local up``.

On the compute-engine backend a group without per-VM repair (a multi-host slice, flex-start)
leaves a lost VM down (docs/compute-engine.md, section 5); a VM of the stack asks the Compute API
to recreate the whole group (``slice-watch.sh``). :func:`await_recreation` is the emulator's side:
the struck slice stays down, listed as lost by the backend's emulated API, until that request
arrived; the emulator then repairs it as on any backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from infra.backends.interface import Emulation
from infra.config import StackConfig
from infra.local import stop_signals
from infra.local.options import EmulationError, Options
from infra.local.vm import EmulatedVM


def await_recreation(
    capacity: Emulation,
    config: StackConfig,
    lost_slice: int,
    vms: Sequence[EmulatedVM],
    options: Options,
    report: Callable[[str], None],
) -> None:
    """Mark slice ``lost_slice`` lost (:meth:`Emulation.lost`) and wait, polling every
    ``options.poll_s`` for at most ``options.stall_timeout_s``, until a VM asked to recreate it
    (:meth:`Emulation.take_recreated`).

    Raises:
      EmulationError: no VM of another slice is left to ask (a one-slice stack: the message says
        how to recreate the group on Compute Engine), or none asked in time.
      Interrupted: Ctrl-C, SIGTERM or SIGHUP meanwhile.
    """
    group = config.node_ids[lost_slice]
    capacity.lost(lost_slice)
    if all(vm.slice_id == lost_slice for vm in vms):
        raise EmulationError(
            f"slice {lost_slice} lost its VMs, and its group {group} does not recreate a VM by itself "
            "(per-VM repair is off: docs/compute-engine.md, section 5); no other slice is left whose slice "
            "watch could recreate it. On Compute Engine: gcloud compute instance-groups managed "
            f"recreate-instances {group} --instances=<every VM of the group> --zone={config.zone}"
        )
    report(
        f"repair: slice {lost_slice}'s VMs are down and its group does not recreate a VM by itself; "
        "waiting for a VM's slice watch to recreate the whole group"
    )
    deadline = time.monotonic() + options.stall_timeout_s
    while lost_slice not in capacity.take_recreated():
        stop_signals.raise_if_signalled()
        if time.monotonic() > deadline:
            raise EmulationError(
                f"no VM asked to recreate group {group} within {options.stall_timeout_s:.0f} s "
                "(--stall-timeout; the slice watch: slice-watch.sh)"
            )
        time.sleep(options.poll_s)
    report(f"repair: a VM asked to recreate group {group} (instanceGroupManagers.recreateInstances)")

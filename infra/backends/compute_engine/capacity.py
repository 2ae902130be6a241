"""The capacity of a ``multislice:backend: compute-engine`` stack: each slice's managed instance
group and its VMs, as ``gcloud compute instance-groups managed list-instances`` lists them
(:func:`infra.backends.compute_engine.instance_groups.list_group`, which cites the command and its fields; the
command line passes it in, since :mod:`infra.remote` reads this package and not the other way
round). The Cloud TPU API is never called for such a stack (it knows nothing of Compute Engine
TPU VMs: docs/compute-engine.md section 1).

A slice is ``READY`` when its group lists exactly the slice's VMs and every one is ``RUNNING``
with no action scheduled by the group (``currentAction`` ``NONE``), ``MISSING`` when the group
does not exist, else ``NOT_READY`` (VMs being created, recreated, stopped, …). The stack is
``READY`` when every slice is. When no group exists the stack is not deployed
(:class:`~infra.backends.capacity.QueuedResourceNotFound`, which the reader words per backend).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from infra.backends.capacity import CapacityStatus, InstanceStatus, QueuedResourceNotFound, SliceStatus
from infra.backends.compute_engine.spec import SPEC

#: Lists one group: its instances sorted by name (each with ``name``, ``status``, ``action`` and
#: ``up``), or None when the group does not exist.
GroupLister = Callable[[str], Sequence[Any] | None]

READY, NOT_READY, MISSING = "READY", "NOT_READY", "MISSING"


def read(config, list_group: GroupLister) -> CapacityStatus:
    """Every slice's group of ``config``'s stack, listed with ``list_group``.

    Raises:
      QueuedResourceNotFound: none of the groups exists.
      whatever ``list_group`` raises.
    """
    slices = []
    for index, group in enumerate(config.node_ids):
        listed = list_group(group)
        if listed is None:
            slices.append(SliceStatus(index, group, MISSING, vms_running=0, vms=config.workers_per_slice))
            continue
        up = sum(instance.up for instance in listed)
        whole = len(listed) == config.workers_per_slice and up == len(listed)
        slices.append(
            SliceStatus(
                index,
                group,
                READY if whole else NOT_READY,
                vms_running=up,
                vms=config.workers_per_slice,
                instances=[InstanceStatus(i.name, i.status, i.action) for i in listed],
            )
        )
    if all(item.state == MISSING for item in slices):
        raise QueuedResourceNotFound(
            f"instance groups {', '.join(config.node_ids)} not found in projects/{config.project}/zones/{config.zone}"
        )
    state = READY if all(item.state == READY for item in slices) else NOT_READY
    return CapacityStatus(config.resource_prefix, state, slices=slices, backend=SPEC.name)

"""The capacity of a ``multislice:backend: gke`` stack, as ``multislice status`` shows it: the run's
Pods, listed by kubectl (:func:`~infra.backends.gke.operate.pods_command`, read by
:func:`~infra.backends.gke.operate.pods_of`) and grouped by slice; each slice is named by its node
pool (``config.node_ids``).

A slice is ``READY`` when it has one Pod per VM and every one is ``Running``, ``SUCCEEDED`` when
every Pod ended 0, ``MISSING`` when it has no Pod (the JobSet is being recreated, suspended, or
gone), else ``NOT_READY`` (Pods pending, failed, or being replaced). The stack's state is the
slices' common state, else ``NOT_READY``. No Pod at all is a stack without a run
(:class:`~infra.backends.capacity.QueuedResourceNotFound`).
"""

from __future__ import annotations

from collections.abc import Callable

from infra.backends.capacity import CapacityStatus, InstanceStatus, QueuedResourceNotFound, SliceStatus
from infra.backends.gke import names
from infra.backends.gke.operate import PodPlace, pods_of
from infra.backends.gke.spec import SPEC

READY, SUCCEEDED, NOT_READY, MISSING = "READY", "SUCCEEDED", "NOT_READY", "MISSING"


def slice_state(pods: list[PodPlace], vms: int) -> str:
    """One slice's state from its Pods (see the module docstring)."""
    if not pods:
        return MISSING
    phases = {pod.phase for pod in pods}
    if len(pods) == vms and phases == {"Running"}:
        return READY
    if len(pods) == vms and phases == {"Succeeded"}:
        return SUCCEEDED
    return NOT_READY


def read(config, list_pods: Callable[[], str]) -> CapacityStatus:
    """The run's Pods of ``config``'s stack; ``list_pods`` answers kubectl's JSON listing.

    Raises:
      QueuedResourceNotFound: the JobSet has no Pod.
      infra.backends.gke.operate.PodListingError: the listing is not one of the run's Pods.
      whatever ``list_pods`` raises.
    """
    jobset = names.jobset_name(config)
    pods = [pod for pod in pods_of(list_pods(), jobset) if pod.slice_id < config.slices]
    if not pods:
        raise QueuedResourceNotFound(
            f"no Pods of JobSet {jobset} in namespace {config.gke.namespace} of cluster {names.cluster_name(config)}"
        )
    slices = []
    for index, pool in enumerate(config.node_ids):
        own = [pod for pod in pods if pod.slice_id == index]
        slices.append(
            SliceStatus(
                index,
                pool,
                slice_state(own, config.workers_per_slice),
                vms_running=sum(pod.phase == "Running" for pod in own),
                vms=config.workers_per_slice,
                instances=[InstanceStatus(pod.name, pod.phase, "NONE") for pod in own],
            )
        )
    states = {item.state for item in slices}
    state = states.pop() if len(states) == 1 and MISSING not in states else NOT_READY
    return CapacityStatus(jobset, state, slices=slices, backend=SPEC.name)

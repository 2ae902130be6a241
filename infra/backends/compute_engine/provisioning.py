"""How a compute-engine slice's group obtains its VMs and what it does when one fails (pure).

Per ``multislice:capacity``, reservation and slice size (docs/compute-engine.md, section 3; each
rule's source is named there and below, Google's or third-party):

* **provisioning model** (:func:`provisioning_model`): ``spot`` SPOT, ``on-demand`` STANDARD,
  ``flex-start`` FLEX_START; ``reserved`` RESERVATION_BOUND when a reservation is named, else
  STANDARD with any matching reservation. Google's gke-labs/tpu-operator defaults the same way
  (``internal/controllers/tpunodegroup/controller.go``: RESERVATION_BOUND "if a reservation is
  set", otherwise STANDARD), and its validator and the third-party vllm-project/ci-infra module
  for TPU7x both pair RESERVATION_BOUND with termination action DELETE.
* **target size policy** (:func:`target_size_policy_mode`): ``BULK`` – "the MIG creates VMs all
  at once … if the MIG is unable to create even one VM, the MIG waits until all VMs can be
  created at the same time" (Compute API ``InstanceGroupManager.targetSizePolicy.mode``) – for a
  multi-host slice of reservation-bound VMs, else ``INDIVIDUAL`` (the API's default). Google's
  "About bulk mode" page
  (https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode): bulk mode "is only
  supported with instance templates that specify either a reservation-bound or flex-start
  provisioning model", the mode cannot be changed on an existing group, and it supports no resize
  requests; tpu-operator's CRD: "targetSizePolicyMode must be INDIVIDUAL when nodeCount is 1 or
  less". Flex-start slices are requested by a resize request instead (next item), so they stay
  INDIVIDUAL.
* **resize request** (:func:`requested_by_resize_request`): a flex-start group is created with
  target size 0 and one resize request for the slice's VMs with the run duration – "You can use
  MIG resize requests with the flex-start or reservation-bound provisioning models …
  ``requestedRunDuration`` … between 10 minutes and seven days. After the run duration ends, the
  MIG automatically deletes the VMs" (Google, "About resize requests in a MIG",
  https://cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig). A resize
  request is all-or-nothing: it adds every VM it asks for at once, or none.
* **per-VM repair** (:func:`repairs_vms`): off (``DO_NOTHING``) for a multi-host slice and for
  flex-start, on (the API's default ``REPAIR``) otherwise. A VM recreated alone cannot rejoin its
  slice's ICI domain ("Multi-host slices require all instances in the slice to be recovered or
  rescheduled together", Google's "Failure recovery of TPU instances"), bulk mode adds VMs only
  to an empty group, and "About bulk mode" requires ``DO_NOTHING`` with a flex-start template;
  tpu-operator (Google) and the vllm module (third-party) set ``DO_NOTHING`` on every TPU group.

Errors: none; the config refuses the combinations these functions do not cover
(:meth:`infra.backends.compute_engine.spec.ComputeEngineSpec.check_capacity`).
"""

from __future__ import annotations

BULK, INDIVIDUAL = "BULK", "INDIVIDUAL"
#: ``instance_lifecycle_policy.default_action_on_failure`` with per-VM repair off.
DO_NOTHING = "DO_NOTHING"
#: The termination action of a reservation-bound or flex-start VM: the VM is deleted, not stopped.
DELETE = "DELETE"

_MODELS = {"spot": "SPOT", "on-demand": "STANDARD", "flex-start": "FLEX_START"}


def reservation_short_name(reservation_name: str | None) -> str | None:
    """The reservation's name: ``reservation_name`` is a short name, or a path whose last segment
    is the name (the queued-resource backend's ``projects/P/locations/Z/reservations/R`` form);
    None when it names none (absent, or a path ending in ``-`` or ``/``)."""
    if reservation_name is None:
        return None
    name = reservation_name.rsplit("/", 1)[-1]
    return None if name in ("", "-") else name


def reservation_bound(capacity: str, reservation_name: str | None) -> bool:
    """Whether the VMs are reservation-bound: ``reserved`` with a named reservation."""
    return capacity == "reserved" and reservation_short_name(reservation_name) is not None


def provisioning_model(capacity: str, reservation_name: str | None) -> str:
    """The instance template's ``scheduling.provisioning_model`` (see the module docstring).

    Raises:
      ValueError: an unknown capacity (the config refuses it first).
    """
    if capacity == "reserved":
        return "RESERVATION_BOUND" if reservation_bound(capacity, reservation_name) else "STANDARD"
    if capacity not in _MODELS:
        raise ValueError(f"capacity {capacity!r}; allowed: {', '.join([*_MODELS, 'reserved'])}")
    return _MODELS[capacity]


def bulk_allowed(capacity: str, reservation_name: str | None, vms_per_slice: int) -> bool:
    """Whether a slice's group may be in bulk mode: reservation-bound VMs, more than one per slice
    (flex-start could be bulk too, but is requested by a resize request, which bulk mode lacks)."""
    return reservation_bound(capacity, reservation_name) and vms_per_slice > 1


def target_size_policy_mode(
    capacity: str, reservation_name: str | None, vms_per_slice: int, requested: str | None = None
) -> str:
    """``BULK`` or ``INDIVIDUAL`` for each group: ``requested``
    (``multislice:computeEngine.targetSizePolicyMode``) when given, else BULK where
    :func:`bulk_allowed`."""
    if requested is not None:
        return requested
    return BULK if bulk_allowed(capacity, reservation_name, vms_per_slice) else INDIVIDUAL


def requested_by_resize_request(capacity: str) -> bool:
    """Whether each group starts at target size 0 and gets its VMs from a resize request."""
    return capacity == "flex-start"


def repairs_vms(capacity: str, vms_per_slice: int) -> bool:
    """Whether the group recreates a failed VM by itself (per-VM repair, the API's default)."""
    return vms_per_slice == 1 and capacity != "flex-start"


def describe(
    capacity: str,
    reservation_name: str | None,
    vms_per_slice: int,
    requested_mode: str | None = None,
    run_duration: str | None = None,
) -> str:
    """One sentence on how each group gets and keeps its VMs, and until when they are billed
    (``multislice plan`` and ``status`` print it; flex-start VMs: "About resize requests in a MIG",
    docs/compute-engine.md section 3b)."""
    model = provisioning_model(capacity, reservation_name)
    vms = f"{vms_per_slice} VM{'s' if vms_per_slice != 1 else ''}"
    if requested_by_resize_request(capacity):
        how = (
            f"each group is created empty (target size 0) and given one resize request for its {vms}, "
            f"all at once, for a run of {run_duration}; Compute Engine deletes them when it ends"
        )
    elif target_size_policy_mode(capacity, reservation_name, vms_per_slice, requested_mode) == BULK:
        how = f"each group in bulk mode: its {vms} are created all at once or not at all"
    else:
        how = f"each group creates its {vms} one by one"
    if reservation_bound(capacity, reservation_name):
        how += f", from reservation {reservation_short_name(reservation_name)}"
    repair = (
        "the group recreates a failed VM"
        if repairs_vms(capacity, vms_per_slice)
        else "per-VM repair off (a VM recreated alone cannot rejoin its slice)"
    )
    if requested_by_resize_request(capacity):
        billed = "billed until their run duration ends"
    elif capacity == "reserved":
        billed = "the reservation is paid for either way; the VMs stay until pulumi destroy"
    else:
        billed = "billed until pulumi destroy (deleteOnComplete is not built for this backend)"
    return f"capacity: {capacity} ({model} VMs): {how}; {repair}; {billed}"

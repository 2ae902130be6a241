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
  created at the same time" (Compute API ``InstanceGroupManager.targetSizePolicy.mode``) – for
  every multi-host slice, whatever the capacity; ``INDIVIDUAL`` (the API's default) for a one-VM
  slice. Google's gke-labs/tpu-operator README: for multi-host slices "users must explicitly
  configure ``targetSizePolicyMode: "BULK"``", and its CRD: "targetSizePolicyMode must be
  INDIVIDUAL when nodeCount is 1 or less". Google's "About bulk mode" page
  (https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode) in its current version:
  bulk mode "supports only TPU machine types", is enabled by setting the mode to ``BULK`` and
  "specifying a target size", cannot change on an existing group, adds VMs (a larger target size
  or ``createInstances``) only while the target size is 0, removes them only by a target size of
  0, supports no resize requests, and needs repair off (``DO_NOTHING``) with a flex-start
  template. Its older version named reservation-bound and flex-start templates only
  (docs/compute-engine.md, section 3b, keeps both).
* **resize request** (:func:`requested_by_resize_request`): a one-VM flex-start slice's group is
  created with target size 0 and one resize request for the VM with the run duration – "You can
  use MIG resize requests with the flex-start or reservation-bound provisioning models …
  ``requestedRunDuration`` … between 10 minutes and seven days. After the run duration ends, the
  MIG automatically deletes the VMs" (Google, "About resize requests in a MIG",
  https://cloud.google.com/compute/docs/instance-groups/about-resize-requests-mig), as Cluster
  Toolkit's ``mig_flex.py`` (v1.95.0) requests flex-start VMs. A multi-host flex-start slice is in
  bulk mode instead, which takes no resize request: its group is created with the slice's VMs as
  its target size, and the template's run duration bounds them.
* **per-VM repair** (:func:`repairs_vms`): off (``DO_NOTHING``) for a multi-host slice and for
  flex-start, on (``REPAIR``, sent explicitly) otherwise. A VM recreated alone cannot rejoin its
  slice's ICI domain ("Multi-host slices require all instances in the slice to be recovered or
  rescheduled together", Google's "Failure recovery of TPU instances"), bulk mode adds VMs only
  to an empty group, and "About bulk mode" requires ``DO_NOTHING`` with a flex-start template;
  tpu-operator (Google) and the vllm module (third-party) set ``DO_NOTHING`` on every TPU group.
* **who recovers a lost slice** (:func:`recovered_by_compute_engine`, :func:`watch_recreates`):
  "Managed capacity mode (on-demand, flex-start, and standard reservations): Compute Engine
  automatically recovers TPU instances and slices by restarting them on healthy hardware", but
  not a "Spot VM preemption" (Google, "Failure recovery of TPU instances",
  https://cloud.google.com/tpu/docs/failure-recovery). So a multi-host Spot slice's lost VMs are
  brought back by the VMs' slice watch (``slice_watch.sh``: its group resized to 0 and back to the
  slice's VMs, bulk mode's one way to create them again); in the managed modes the watch only
  reports. A one-VM Spot slice's group repairs its VM ("MIG-initiated repair in single-host
  slices", same page).

Errors: none; the config refuses the combinations these functions do not cover
(:meth:`infra.backends.compute_engine.spec.ComputeEngineSpec.check_capacity`).
"""

from __future__ import annotations

BULK, INDIVIDUAL = "BULK", "INDIVIDUAL"
#: ``instance_lifecycle_policy.default_action_on_failure`` with per-VM repair off, and on. Both are
#: sent, never left to the API's default: a provider that keeps the old value when an argument is
#: removed would leave a group that moved from flex-start to Spot at ``DO_NOTHING``, with nothing to
#: repair its VM.
DO_NOTHING = "DO_NOTHING"
REPAIR = "REPAIR"
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


def target_size_policy_mode(vms_per_slice: int) -> str:
    """``BULK`` for a multi-host slice's group, ``INDIVIDUAL`` for a one-VM slice's (the module
    docstring)."""
    return BULK if vms_per_slice > 1 else INDIVIDUAL


def requested_by_resize_request(capacity: str, vms_per_slice: int) -> bool:
    """Whether each group starts at target size 0 and gets its VM from a resize request (a
    one-VM flex-start slice: bulk mode takes no resize request)."""
    return capacity == "flex-start" and vms_per_slice == 1


def repairs_vms(capacity: str, vms_per_slice: int) -> bool:
    """Whether the group recreates a failed VM by itself (per-VM repair, the API's default)."""
    return vms_per_slice == 1 and capacity != "flex-start"


def recovered_by_compute_engine(capacity: str) -> bool:
    """Whether Compute Engine recovers a failed slice itself: the managed capacity modes, all
    but Spot (the module docstring)."""
    return capacity != "spot"


def watch_recreates(capacity: str, vms_per_slice: int) -> bool:
    """Whether the VMs' slice watch brings a lost slice back (a multi-host Spot slice: neither
    its group nor Compute Engine does); elsewhere it only reports."""
    return not repairs_vms(capacity, vms_per_slice) and not recovered_by_compute_engine(capacity)


def describe(capacity: str, reservation_name: str | None, vms_per_slice: int, run_duration: str | None = None) -> str:
    """One sentence on how each group gets and keeps its VMs, who brings a lost slice back, and
    until when they are billed (``multislice plan`` and ``status`` print it; flex-start VMs:
    "About resize requests in a MIG", docs/compute-engine.md section 3b)."""
    model = provisioning_model(capacity, reservation_name)
    vms = f"{vms_per_slice} VM{'s' if vms_per_slice != 1 else ''}"
    if requested_by_resize_request(capacity, vms_per_slice):
        how = (
            f"each group is created empty (target size 0) and given one resize request for its {vms}, "
            f"for a run of {run_duration}; Compute Engine deletes it when the run ends"
        )
    elif target_size_policy_mode(vms_per_slice) == BULK:
        how = f"each group in bulk mode: its {vms} are created all at once or not at all"
        if capacity == "flex-start":
            how += f", for a run of {run_duration}; Compute Engine deletes them when it ends"
    else:
        how = f"each group creates its {vms}"
    if reservation_bound(capacity, reservation_name):
        how += f", from reservation {reservation_short_name(reservation_name)}"
    if repairs_vms(capacity, vms_per_slice):
        repair = "the group recreates a failed VM"
    elif watch_recreates(capacity, vms_per_slice):
        repair = (
            "per-VM repair off (a VM recreated alone cannot rejoin its slice); Compute Engine does not recover a "
            "preempted Spot slice, so the VMs' slice watch recreates a lost slice's VMs together"
        )
    else:
        repair = "per-VM repair off; Compute Engine recovers a failed slice itself (managed capacity mode)"
    if capacity == "flex-start":
        billed = "billed until their run duration ends"
    elif capacity == "reserved":
        billed = "the reservation is paid for either way; the VMs stay until pulumi destroy"
    else:
        billed = "billed until pulumi destroy (deleteOnComplete is not built for this backend)"
    return f"capacity: {capacity} ({model} VMs): {how}; {repair}; {billed}"

"""How a compute-engine stack's capacity becomes the instance template's ``scheduling`` and
``reservation_affinity`` (pure functions; the component turns them into pulumi-gcp args).

Per ``multislice:capacity`` (docs/compute-engine.md, section 3, which quotes Google's pages):

* ``spot`` – ``provisioning_model`` SPOT, ``instance_termination_action`` STOP,
  ``on_host_maintenance`` TERMINATE, ``automatic_restart`` false, ``preemptible`` true and
  ``reservation_affinity`` NO_RESERVATION (a Spot VM consumes no reservation: Google's Cluster
  Toolkit refuses a Spot node pool with any other, "Spot consumption option only works with
  reservation_affinity consume_reservation_type NO_RESERVATION", ``modules/compute/gke-node-pool/
  main.tf`` at 1047080, and the gke backend sends it; the API's default is ANY_RESERVATION)
  ("Request TPU Spot VMs", https://docs.cloud.google.com/tpu/docs/spot-compute:
  ``--provisioning-model=SPOT --instance-termination-action=STOP --maintenance-policy=TERMINATE``;
  gcloud itself sends ``automaticRestart=False, preemptible=True`` for SPOT:
  ``CreateSchedulingMessage`` in ``googlecloudsdk/api_lib/compute/instance_utils.py``, and
  pulumi-gcp's ``InstanceTemplateSchedulingArgs.provisioning_model`` says the same).
* ``on-demand`` – STANDARD, ``on_host_maintenance`` TERMINATE (TPU VMs cannot live-migrate:
  every TPU example of docs/compute-engine.md passes ``--maintenance-policy=TERMINATE``).
* ``reserved`` with ``multislice:reservationName`` – RESERVATION_BOUND, TERMINATE, termination
  action DELETE, and ``reservation_affinity`` SPECIFIC_RESERVATION with key
  ``compute.googleapis.com/reservation-name`` and the reservation's name (pulumi-gcp's
  ``InstanceTemplateReservationAffinitySpecificReservationArgs.key``: "To target a
  SPECIFIC_RESERVATION by name, specify compute.googleapis.com/reservation-name as the key and
  specify the name of your reservation as the only value"). The model and the action are those
  of Google's gke-labs/tpu-operator for a TPU group with a reservation (its converter:
  ``case "RESERVATION_BOUND": … InstanceTerminationAction = "DELETE"``; its validator: "instance
  termination action must be DELETE when provisioning model is RESERVATION_BOUND") and of the
  third-party vllm-project/ci-infra TPU7x module (:mod:`~infra.backends.compute_engine.provisioning`).
* ``reserved`` without a name – STANDARD, TERMINATE, ``reservation_affinity`` ANY_RESERVATION
  (tpu-operator: STANDARD when no reservation is set).
* ``flex-start`` – FLEX_START, ``max_run_duration`` (``multislice:computeEngine.maxRunDuration``,
  required by the config), ``instance_termination_action`` DELETE, ``automatic_restart`` false,
  TERMINATE (pulumi-gcp's rule for FLEX_START in ``pulumi_gcp/compute/_inputs.py``:
  "``automatic_restart`` should be ``false`` and ``instance_termination_action`` should be set to
  ``DELETE``. A ``max_run_duration`` must also be specified"), and ``reservation_affinity``
  NO_RESERVATION: every resize-request example sets it (terraform-provider-google's
  ``compute_resize_request`` and ``compute_region_resize_request``, pulumi-gcp's
  ``RegionResizeRequest``: ``reservation_affinity { type = "NO_RESERVATION" }``); without it the
  API's default, ANY_RESERVATION ("Consume any allocation available": the Compute API's
  ``ReservationAffinity.consumeReservationType``), applies. A flex-start stack names no reservation
  (the config refuses ``multislice:reservationName`` with it).

``maxRunDuration`` with ``spot``/``on-demand``/``reserved`` also sets ``max_run_duration`` and
the termination action DELETE: the VMs are deleted when it ends (gcloud's
``--max-run-duration``: "relative to the last time when the VM began running";
``AddMaxRunDurationVmArgs`` in ``command_lib/compute/instances/flags.py``).
"""

from __future__ import annotations

from typing import Any

from infra.backends.compute_engine.provisioning import (
    DELETE,
    provisioning_model,
    reservation_bound,
    reservation_short_name,
)

#: The reservation-affinity key that names a reservation (pulumi-gcp, see the module docstring).
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"


def scheduling(
    capacity: str, max_run_duration_seconds: int | None, reservation_name: str | None = None
) -> dict[str, Any]:
    """The template's ``scheduling`` (pulumi-gcp argument names) for ``capacity``.

    Raises:
      ValueError: an unknown capacity, or flex-start without a run duration (the config refuses
        both first: ``infra.config``).
    """
    model = provisioning_model(capacity, reservation_name)
    if capacity == "flex-start" and max_run_duration_seconds is None:
        raise ValueError("flex-start needs a max run duration (multislice:computeEngine.maxRunDuration)")
    out: dict[str, Any] = {"provisioning_model": model, "on_host_maintenance": "TERMINATE"}
    if capacity == "spot":
        out.update(preemptible=True, automatic_restart=False, instance_termination_action="STOP")
    if capacity == "flex-start":
        out["automatic_restart"] = False
    if reservation_bound(capacity, reservation_name):
        out["instance_termination_action"] = DELETE
    if max_run_duration_seconds is not None:
        out.update(max_run_duration={"seconds": int(max_run_duration_seconds)}, instance_termination_action=DELETE)
    return out


def reservation_affinity(capacity: str, reservation_name: str | None) -> dict[str, Any] | None:
    """The template's ``reservation_affinity``: ``capacity: reserved``'s, NO_RESERVATION for
    flex-start and Spot (the module docstring), None (the API's default) for on-demand.

    ``reservation_name`` is a short name, or a path whose last segment is the name (the
    queued-resource backend's ``projects/P/locations/Z/reservations/R`` form): the key selects a
    reservation of the project by name.
    """
    if capacity in ("flex-start", "spot"):
        return {"type": "NO_RESERVATION"}
    if capacity != "reserved":
        return None
    name = reservation_short_name(reservation_name)
    if name is None:
        return {"type": "ANY_RESERVATION"}
    return {"type": "SPECIFIC_RESERVATION", "specific_reservation": {"key": RESERVATION_NAME_KEY, "values": [name]}}

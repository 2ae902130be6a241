"""How a compute-engine stack's capacity becomes the instance template's ``scheduling`` and
``reservation_affinity`` (pure functions; the component turns them into pulumi-gcp args).

Per ``multislice:capacity`` (docs/compute-engine.md, section 3, which quotes Google's pages):

* ``spot`` – ``provisioning_model`` SPOT, ``instance_termination_action`` STOP,
  ``on_host_maintenance`` TERMINATE, ``automatic_restart`` false and ``preemptible`` true
  ("Request TPU Spot VMs", https://docs.cloud.google.com/tpu/docs/spot-compute:
  ``--provisioning-model=SPOT --instance-termination-action=STOP --maintenance-policy=TERMINATE``;
  gcloud itself sends ``automaticRestart=False, preemptible=True`` for SPOT:
  ``CreateSchedulingMessage`` in ``googlecloudsdk/api_lib/compute/instance_utils.py``, and
  pulumi-gcp's ``InstanceTemplateSchedulingArgs.provisioning_model`` says the same).
* ``on-demand`` – STANDARD, ``on_host_maintenance`` TERMINATE (TPU VMs cannot live-migrate:
  every TPU example of docs/compute-engine.md passes ``--maintenance-policy=TERMINATE``).
* ``reserved`` – STANDARD, TERMINATE, and ``reservation_affinity``: SPECIFIC_RESERVATION with
  key ``compute.googleapis.com/reservation-name`` and the reservation's name when
  ``multislice:reservationName`` is set (pulumi-gcp's
  ``InstanceTemplateReservationAffinitySpecificReservationArgs.key``: "To target a
  SPECIFIC_RESERVATION by name, specify compute.googleapis.com/reservation-name as the key and
  specify the name of your reservation as the only value"), else ANY_RESERVATION.
* ``flex-start`` – FLEX_START, ``max_run_duration`` (``multislice:computeEngine.maxRunDuration``,
  required by the config), ``instance_termination_action`` DELETE, ``automatic_restart`` false,
  TERMINATE (pulumi-gcp's rule for FLEX_START in ``pulumi_gcp/compute/_inputs.py``:
  "``automatic_restart`` should be ``false`` and ``instance_termination_action`` should be set to
  ``DELETE``. A ``max_run_duration`` must also be specified").

``maxRunDuration`` with ``spot``/``on-demand``/``reserved`` also sets ``max_run_duration`` and
the termination action DELETE: the VMs are deleted when it ends (gcloud's
``--max-run-duration``: "relative to the last time when the VM began running";
``AddMaxRunDurationVmArgs`` in ``command_lib/compute/instances/flags.py``).
"""

from __future__ import annotations

from typing import Any

#: The reservation-affinity key that names a reservation (pulumi-gcp, see the module docstring).
RESERVATION_NAME_KEY = "compute.googleapis.com/reservation-name"

_PROVISIONING_MODEL = {"spot": "SPOT", "on-demand": "STANDARD", "reserved": "STANDARD", "flex-start": "FLEX_START"}


def scheduling(capacity: str, max_run_duration_seconds: int | None) -> dict[str, Any]:
    """The template's ``scheduling`` (pulumi-gcp argument names) for ``capacity``.

    Raises:
      ValueError: an unknown capacity, or flex-start without a run duration (the config refuses
        both first: ``infra.config``).
    """
    if capacity not in _PROVISIONING_MODEL:
        raise ValueError(f"capacity {capacity!r}; allowed: {', '.join(_PROVISIONING_MODEL)}")
    if capacity == "flex-start" and max_run_duration_seconds is None:
        raise ValueError("flex-start needs a max run duration (multislice:computeEngine.maxRunDuration)")
    out: dict[str, Any] = {"provisioning_model": _PROVISIONING_MODEL[capacity], "on_host_maintenance": "TERMINATE"}
    if capacity == "spot":
        out.update(preemptible=True, automatic_restart=False, instance_termination_action="STOP")
    if capacity == "flex-start":
        out["automatic_restart"] = False
    if max_run_duration_seconds is not None:
        out.update(max_run_duration={"seconds": int(max_run_duration_seconds)}, instance_termination_action="DELETE")
    return out


def reservation_affinity(capacity: str, reservation_name: str | None) -> dict[str, Any] | None:
    """The template's ``reservation_affinity`` for ``capacity: reserved``; None otherwise.

    ``reservation_name`` is a short name, or a path whose last segment is the name (the
    queued-resource backend's ``projects/P/locations/Z/reservations/R`` form): the key selects a
    reservation of the project by name.
    """
    if capacity != "reserved":
        return None
    if reservation_name is None or reservation_name.rsplit("/", 1)[-1] in ("", "-"):
        return {"type": "ANY_RESERVATION"}
    name = reservation_name.rsplit("/", 1)[-1]
    return {"type": "SPECIFIC_RESERVATION", "specific_reservation": {"key": RESERVATION_NAME_KEY, "values": [name]}}

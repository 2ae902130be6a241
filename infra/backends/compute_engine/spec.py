"""The compute-engine backend's spec: ``multislice:computeEngine`` and what Compute Engine offers.

* generations and zones: the catalog's ``Generation.backends`` and ``compute_engine_zones``
  (Compute Engine supports TPU7x, v6e and v5p: docs/compute-engine.md section 1); a VM boots an
  image, so a stack names no TPU software version (``multislice:runtimeVersion`` is refused);
* capacity: spot, on-demand, reserved and flex-start (the instance template's provisioning
  model); flex-start VMs run for at most seven days and need ``maxRunDuration``
  (https://cloud.google.com/compute/docs/instances/about-flex-start-vms);
* the VM: Compute Engine documents none of Cloud TPU's identity keys for its TPU VMs, so
  ``boot_identity.sh`` finds the VM's place from the slices' managed instance groups and exports
  it as GKE gives it to a TPU Pod (``TPU_WORKER_ID``, ``TPU_WORKER_HOSTNAMES``, ``MEGASCALE_*``:
  docs/compute-engine.md, "4. How a VM learns its place in the job"); a new instance template reboots no VM, so
  every VM runs a release watch; lines go to the ``gce_instance`` resource.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from infra.accelerators import Generation
from infra.backends.compute_engine import provisioning
from infra.backends.spec import BackendSpec
from infra.durations import Duration, format_duration
from training.validation import StrictModel, invalid

#: The longest run a flex-start VM may have, seconds: "run for up to seven days"
#: (https://cloud.google.com/compute/docs/instances/about-flex-start-vms); a MIG resize
#: request's run duration is bounded the same way, 10 minutes to 7 days (gcloud 528's
#: ``compute instance-groups managed resize-requests create --requested-run-duration`` help).
MAX_RUN_DURATION_LIMIT = 7 * 24 * 3600
#: The shortest one, seconds (same gcloud help: at least ``10m``).
MIN_RUN_DURATION = 600


class ComputeEngineSettings(StrictModel):
    """``multislice:computeEngine``: how a ``multislice:backend: compute-engine`` stack's TPU VMs
    are requested (docs/compute-engine.md)."""

    model_config = StrictModel.model_config | {"populate_by_name": True}

    max_run_duration: Duration | None = Field(
        default=None,
        alias="maxRunDuration",
        description="How long the VMs may run before Compute Engine deletes them (required with flex-start; ≤ 7d).",
    )

    target_size_policy_mode: Literal["BULK", "INDIVIDUAL"] | None = Field(
        default=None,
        alias="targetSizePolicyMode",
        description=(
            "BULK (each slice's VMs created all at once or not at all) or INDIVIDUAL; default BULK for "
            "multi-host slices of a named reservation, else INDIVIDUAL."
        ),
    )

    @model_validator(mode="after")
    def _bounds(self) -> ComputeEngineSettings:
        limit = self.max_run_duration
        if limit is not None and not MIN_RUN_DURATION <= limit <= MAX_RUN_DURATION_LIMIT:
            raise invalid(
                "maxRunDuration",
                f"{limit}s is outside 10m..7d (600..604800 s): flex-start VMs run for at most seven days "
                "(https://cloud.google.com/compute/docs/instances/about-flex-start-vms)",
            )
        return self


#: Seconds a VM's boot waits for the groups to list every VM of its slice (and slice 0's) each
#: with an internal IP before it stops (``boot_identity.sh``; ``MULTISLICE_GROUP_WAIT_S``). A
#: managed instance group creates its VMs one by one, and the groups of a stack are created side
#: by side by ``pulumi up``: half an hour covers a slow creation, and a VM whose slice never
#: fills stops with one line rather than waiting for ever (a reboot tries again).
GROUP_WAIT_S = 1800


class ComputeEngineSpec(BackendSpec):
    """``multislice:backend: compute-engine``."""

    name = "compute-engine"
    summary = "MIGs of TPU VMs"
    settings_key = "multislice:computeEngine"
    settings_field = "compute_engine"
    settings_model = ComputeEngineSettings
    capacities = ("spot", "on-demand", "reserved", "flex-start")
    capacity_source = "instance templates"
    service = "Compute Engine"
    catalog_qualifier = " on Compute Engine"
    sole_offer_reason = "the Cloud TPU API does not support TPU7x and later"
    has_runtime_version = False
    capacity_noun = "instance groups"
    capacity_plural = True
    vm_reads_instance_groups = True
    boot_identity = "boot_identity.sh"
    release_watch = True
    identity_source = "environment"
    log_resource = "gce_instance"

    def zones(self, gen: Generation) -> tuple[tuple[str, ...], str]:
        return gen.compute_engine_zones, gen.sources["compute_engine_zones"]

    def check_keys(self, config: Any) -> None:
        if config.runtime_version is not None:
            raise invalid(
                "multislice:runtimeVersion",
                "configures the TPU software version a queued resource boots; compute-engine VMs boot an image "
                "instead: remove it (or set multislice:backend: queued-resource)",
            )

    def check_capacity(self, config: Any) -> None:
        if config.capacity == "flex-start" and config.compute_engine.max_run_duration is None:
            raise invalid(
                "multislice:computeEngine.maxRunDuration",
                "required with multislice:capacity flex-start: flex-start VMs run for at most seven days and "
                "Compute Engine deletes them at the end (e.g. maxRunDuration: 3d)",
            )
        if config.compute_engine.target_size_policy_mode == provisioning.BULK:
            _check_bulk(config)

    def slice_watch(self, config: Any) -> str | None:
        """``slice_watch.sh`` where the groups do not repair a VM by themselves
        (:func:`~infra.backends.compute_engine.provisioning.repairs_vms` is False)."""
        return None if provisioning.repairs_vms(config.capacity, config.accelerator.hosts) else "slice_watch.sh"

    def capacity_plan(self, config: Any) -> str | None:
        limit = config.compute_engine.max_run_duration
        return provisioning.describe(
            config.capacity,
            config.reservation_name,
            config.accelerator.hosts,
            config.compute_engine.target_size_policy_mode,
            run_duration=None if limit is None else format_duration(limit),
        )

    def refuse_settings(self, changed: list[str], backend: str) -> Exception:
        return invalid(
            self.settings_key, f"configures the compute-engine backend; this stack's multislice:backend is {backend}"
        )

    def describe_deployment(self, outputs: Mapping[str, Any]) -> str:
        groups = outputs.get("instanceGroupNames") or []
        return f"the managed instance groups {', '.join(map(str, groups)) or '(unnamed)'} and their TPU VMs"

    def boot_values(self) -> dict[str, str]:
        return {"GROUP_WAIT_S": str(GROUP_WAIT_S)}


#: Google's page on bulk mode (its rules: :mod:`~infra.backends.compute_engine.provisioning`).
BULK_MODE_PAGE = "https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode"


def _check_bulk(config: Any) -> None:
    """``targetSizePolicyMode: BULK`` only where bulk mode can be: one message naming the key."""
    key = "multislice:computeEngine.targetSizePolicyMode"
    if config.capacity in ("spot", "on-demand"):
        raise invalid(
            key,
            f"BULK cannot be used with multislice:capacity {config.capacity}: bulk mode takes only reservation-bound "
            f"and flex-start VMs ({BULK_MODE_PAGE}); use capacity reserved with multislice:reservationName, or "
            "remove the key",
        )
    if config.capacity == "flex-start":
        raise invalid(
            key,
            "BULK cannot be used with multislice:capacity flex-start here: each flex-start slice is requested by a "
            f"resize request, which bulk mode does not support ({BULK_MODE_PAGE}); remove the key",
        )
    if not provisioning.reservation_bound(config.capacity, config.reservation_name):
        raise invalid(
            key,
            "BULK needs reservation-bound VMs, and a reserved stack's VMs are reservation-bound only with a named "
            f"reservation ({BULK_MODE_PAGE}): set multislice:reservationName, or remove the key",
        )
    if config.accelerator.hosts == 1:
        raise invalid(
            key,
            f"BULK needs a slice of several VMs; {config.accelerator_type} is one VM per slice (Google's "
            'gke-labs/tpu-operator: "targetSizePolicyMode must be INDIVIDUAL when nodeCount is 1 or less"): '
            "remove the key",
        )


SPEC = ComputeEngineSpec()

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
from infra.backends.compute_engine import machine, provisioning, tpu_env
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
    are requested (docs/compute-engine.md). Keys by their stack-file names only: a snake_case spelling
    is an unknown key that names the camelCase one."""

    max_run_duration: Duration | None = Field(
        default=None,
        alias="maxRunDuration",
        description="How long the VMs may run before Compute Engine deletes them (required with flex-start; ≤ 7d).",
    )

    target_size_policy_mode: Literal["BULK", "INDIVIDUAL"] | None = Field(
        default=None,
        alias="targetSizePolicyMode",
        description=(
            "BULK (each slice's VMs created all at once or not at all) for a multi-host slice, INDIVIDUAL for a "
            "one-VM slice: the only value allowed is the one the slice size gives, so the key may be left out."
        ),
    )

    boot_disk_size_gb: int | None = Field(
        default=None,
        alias="bootDiskSizeGb",
        description=(
            f"Each VM's boot disk, GB ({machine.MIN_BOOT_DISK_SIZE_GB}..{machine.MAX_BOOT_DISK_SIZE_GB}; default 100)."
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
        size = self.boot_disk_size_gb
        if size is not None and not machine.MIN_BOOT_DISK_SIZE_GB <= size <= machine.MAX_BOOT_DISK_SIZE_GB:
            raise invalid(
                "bootDiskSizeGb",
                f"{size} GB is outside {machine.MIN_BOOT_DISK_SIZE_GB}..{machine.MAX_BOOT_DISK_SIZE_GB}: below "
                f"{machine.MIN_BOOT_DISK_SIZE_GB} GB the image, the releases and their virtualenvs may not fit; "
                f"{machine.MAX_BOOT_DISK_SIZE_GB} GB (64 TiB) is the largest Compute Engine disk "
                "(docs/compute-engine.md, section 2)",
            )
        return self


#: Seconds a VM's boot waits for the groups to list every VM of its slice (and slice 0's) each
#: with an internal IP before it stops (``boot_identity.sh``; ``MULTISLICE_GROUP_WAIT_S``). The
#: groups of a stack are created side by side by ``pulumi up``, each slice's VMs all at once (bulk
#: mode) when its capacity comes, so another slice may come up much later: half an hour covers a
#: slow creation, and a VM whose slices never fill stops with one line rather than waiting for
#: ever (a reboot tries again).
GROUP_WAIT_S = 1800
#: Seconds a VM of a multi-host Spot slice must have been seen lost (and on two polls of the slice
#: watch in a row) before the watch recreates the slice's VMs (``slice_watch.sh``;
#: ``MULTISLICE_SLICE_WATCH_GRACE_S`` on a VM changes it). Compute Engine does not recover a Spot
#: preemption ("Failure recovery of TPU instances"), so the wait is not for Compute Engine: a
#: preemption notice reaches every VM of the slice within seconds, and two minutes lets their
#: trainers save and the group's listing settle before its VMs are deleted. This project's
#: choice, not a Google figure.
SLICE_WATCH_GRACE_S = 120


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
    #: The template's ``reservationAffinity`` (Compute Engine's form); the backend sends the reservation's name
    #: (``scheduling.reservation_affinity``), so it also reads the queued-resource backend's path.
    reservation_forms = ("compute", "tpu")

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
        requested = config.compute_engine.target_size_policy_mode
        if requested is not None:
            _check_mode(config, requested)

    def slice_watch(self, config: Any) -> str | None:
        """``slice_watch.sh`` where the groups do not repair a VM by themselves
        (:func:`~infra.backends.compute_engine.provisioning.repairs_vms` is False)."""
        return None if provisioning.repairs_vms(config.capacity, config.accelerator.hosts) else "slice_watch.sh"

    def slice_watch_recreates(self, config: Any) -> bool:
        return provisioning.watch_recreates(config.capacity, config.accelerator.hosts)

    def slice_watch_values(self, config: Any) -> dict[str, str]:
        """What the watch does with a lost slice: ``recreate`` it where neither its group nor
        Compute Engine does (:func:`~infra.backends.compute_engine.provisioning.watch_recreates`),
        else ``report``; and the grace before it acts (:data:`SLICE_WATCH_GRACE_S`)."""
        acts = provisioning.watch_recreates(config.capacity, config.accelerator.hosts)
        return {"LOST_SLICE_ACTION": "recreate" if acts else "report", "LOST_GRACE_S": str(SLICE_WATCH_GRACE_S)}

    def capacity_plan(self, config: Any) -> str | None:
        limit = config.compute_engine.max_run_duration
        line = provisioning.describe(
            config.capacity,
            config.reservation_name,
            config.accelerator.hosts,
            run_duration=None if limit is None else format_duration(limit),
        )
        generation = config.accelerator.generation.name
        note = machine.boot_disk_note(generation, config.accelerator.machine_type)
        return f"{line}; {note}" if note else line

    def refuse_settings(self, changed: list[str], backend: str) -> Exception:
        return invalid(
            self.settings_key, f"configures the compute-engine backend; this stack's multislice:backend is {backend}"
        )

    def describe_deployment(self, outputs: Mapping[str, Any]) -> str:
        groups = outputs.get("instanceGroupNames") or []
        return f"the managed instance groups {', '.join(map(str, groups)) or '(unnamed)'} and their TPU VMs"

    def boot_values(self) -> dict[str, str]:
        return {
            "GROUP_WAIT_S": str(GROUP_WAIT_S),
            "PROCESS_PORT": str(tpu_env.PROCESS_PORT),
            "WORKER_HOSTNAME_PORT": str(tpu_env.WORKER_HOSTNAME_PORT),
        }


#: Google's page on bulk mode (its rules: :mod:`~infra.backends.compute_engine.provisioning`).
BULK_MODE_PAGE = "https://cloud.google.com/compute/docs/instance-groups/about-bulk-mode"


def _check_mode(config: Any, requested: str) -> None:
    """``targetSizePolicyMode`` other than the one the slice size gives: one message naming the key
    (:func:`~infra.backends.compute_engine.provisioning.target_size_policy_mode`)."""
    key = "multislice:computeEngine.targetSizePolicyMode"
    hosts = config.accelerator.hosts
    if requested == provisioning.target_size_policy_mode(hosts):
        return
    if hosts == 1:
        raise invalid(
            key,
            f"BULK needs a slice of several VMs; {config.accelerator_type} is one VM per slice (Google's "
            'gke-labs/tpu-operator: "targetSizePolicyMode must be INDIVIDUAL when nodeCount is 1 or less"): '
            "remove the key",
        )
    raise invalid(
        key,
        f"INDIVIDUAL cannot be used for {config.accelerator_type}, a slice of {hosts} VMs: each multi-host slice's "
        "group is in bulk mode, so that its VMs are created all at once or not at all (Google's gke-labs/tpu-operator: "
        f'multi-host slices "must explicitly configure targetSizePolicyMode: BULK"; {BULK_MODE_PAGE}): remove the key',
    )


SPEC = ComputeEngineSpec()

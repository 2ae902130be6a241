"""What :class:`~infra.backends.compute_engine.slices.ComputeEngineSlices` declares, as plain values.

The program (``infra/__main__.py``, ``compute_engine_inputs``) builds a
:class:`ComputeEngineInputs` from the StackConfig; the component never sees the StackConfig.
Network, subnetwork and service account may be Outputs of the other components.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi

from infra.backends.compute_engine import provisioning, tpu_env
from infra.vm_contract import (
    BACKEND_KEY,
    COMPUTE_ENGINE_ACCELERATOR_KEY,
    COMPUTE_ENGINE_BACKEND,
    COMPUTE_ENGINE_TPU_ENV_KEY,
    INSTANCE_GROUPS_KEY,
    SLICE_ID_KEY,
    WORKERS_PER_SLICE_KEY,
)

#: The OAuth scope of the VMs' service account: the account's IAM grants decide what it may do
#: (https://cloud.google.com/compute/docs/access/service-accounts#scopes_best_practice).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

#: The groups' ``description`` on a stack whose last deployment used the queued-resource backend
#: (the program confirmed the change: ``multislice:allowBackendChange``); the policy
#: ``backend-change`` of the policy pack looks for it.
REPLACES_QUEUED_RESOURCE = "replaces the stack's queued resource (multislice:backend changed)"
#: The groups' ``description`` otherwise.
GROUP_DESCRIPTION = "One TPU slice of a multislice stack (multislice:backend compute-engine)."


@dataclass(frozen=True)
class ComputeEngineInputs:
    """A compute-engine stack's slices.

    Attributes:
      stack, project, zone, region: where (the workload policy is regional, the groups zonal).
      group_names: one managed instance group per slice, in slice order (``config.node_ids``).
      machine_type: the TPU machine type of one VM (e.g. ``ct5p-hightpu-4t``).
      topology: the slice's accelerator topology (e.g. ``2x2x2``), the workload policy's.
      accelerator_type: the accelerator type (e.g. ``v5p-16``), told to the VMs in metadata.
      generation: the TPU generation (boot image family: :mod:`~infra.backends.compute_engine.images`).
      vms_per_slice: VMs per slice, each group's target size.
      capacity, reservation_name, max_run_duration_seconds: :mod:`~infra.backends.compute_engine.scheduling`.
      metadata: the template's metadata before the compute-engine keys (startup script, run dir).
      replaces_queued_resource: the stack's last deployment used the queued-resource backend (an
        Output of the program's backend check).
      boot_disk_size_gb: each VM's boot disk, GB (:func:`~infra.backends.compute_engine.machine.boot_disk_size_gb`).
      tpu_environment: the trainer's TPU environment that does not depend on the VMs' addresses
        (:func:`~infra.backends.compute_engine.tpu_env.static_environment`).
    """

    stack: str
    project: str
    zone: str
    region: str
    group_names: tuple[str, ...]
    machine_type: str
    topology: str
    accelerator_type: str
    generation: str
    vms_per_slice: int
    capacity: str
    network: pulumi.Input[str]
    subnetwork: pulumi.Input[str]
    service_account: pulumi.Input[str]
    tags: tuple[str, ...]
    labels: dict[str, str]
    metadata: dict[str, str]
    reservation_name: str | None = None
    max_run_duration_seconds: int | None = None
    replaces_queued_resource: pulumi.Input[bool] = False
    boot_disk_size_gb: int = 100
    tpu_environment: dict[str, str] = field(default_factory=dict)

    @property
    def target_size_policy_mode(self) -> str:
        """``BULK`` or ``INDIVIDUAL`` (:func:`~infra.backends.compute_engine.provisioning.target_size_policy_mode`)."""
        return provisioning.target_size_policy_mode(self.vms_per_slice)

    @property
    def resize_request(self) -> bool:
        """Each group starts empty and gets its VM from a resize request (a one-VM flex-start slice)."""
        return provisioning.requested_by_resize_request(self.capacity, self.vms_per_slice)

    @property
    def repairs_vms(self) -> bool:
        """Each group recreates a failed VM by itself (per-VM repair)."""
        return provisioning.repairs_vms(self.capacity, self.vms_per_slice)

    @property
    def multi_host(self) -> bool:
        """Whether a slice spans more than one VM: only then a workload policy (docs/compute-engine.md,
        section 2: required for a MIG "with a multi-host TPU slice")."""
        return self.vms_per_slice > 1

    def template_metadata(self) -> dict[str, str]:
        """The template's metadata: :attr:`metadata` plus what a VM needs to find its place
        (``boot.sh`` reads them: :mod:`infra.vm_contract`)."""
        return {
            **self.metadata,
            BACKEND_KEY: COMPUTE_ENGINE_BACKEND,
            INSTANCE_GROUPS_KEY: ",".join(self.group_names),
            WORKERS_PER_SLICE_KEY: str(self.vms_per_slice),
            COMPUTE_ENGINE_ACCELERATOR_KEY: self.accelerator_type,
            COMPUTE_ENGINE_TPU_ENV_KEY: tpu_env.metadata_value(self.tpu_environment),
        }

    def group_metadata(self, slice_index: int) -> dict[str, str]:
        """One group's ``all_instances_config.metadata``: its slice index, and the accelerator type
        (the template has it too): a new accelerator type changes the group's own inputs, which the
        program replaces the group on (``replaceOnChanges``: Compute Engine refuses a new workload
        policy, or a new target size in bulk mode, on a group with VMs; docs/compute-engine.md,
        section 3b)."""
        return {SLICE_ID_KEY: str(slice_index), COMPUTE_ENGINE_ACCELERATOR_KEY: self.accelerator_type}

    def group_description(self) -> pulumi.Output[str]:
        """The groups' ``description``: :data:`REPLACES_QUEUED_RESOURCE` when the stack's last
        deployment used the queued-resource backend, else :data:`GROUP_DESCRIPTION`."""
        return pulumi.Output.from_input(self.replaces_queued_resource).apply(
            lambda replaces: REPLACES_QUEUED_RESOURCE if replaces else GROUP_DESCRIPTION
        )

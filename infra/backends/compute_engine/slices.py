"""The compute-engine backend's Pulumi resources: :class:`ComputeEngineSlices`."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.backends.compute_engine import images, machine, provisioning
from infra.backends.compute_engine.inputs import CLOUD_PLATFORM_SCOPE, ComputeEngineInputs
from infra.backends.compute_engine.scheduling import reservation_affinity, scheduling
from infra.vm_contract import STARTUP_SCRIPT_KEY

#: The workload policy's type: the only one that takes an accelerator topology (gcloud's
#: ``ValidateWorkloadPolicy``; pulumi-gcp ``ResourcePolicyWorkloadPolicyArgs.accelerator_topology``:
#: "can be set only when the workload policy type is HIGH_THROUGHPUT").
WORKLOAD_POLICY_TYPE = "HIGH_THROUGHPUT"
#: The groups' update policy: ``OPPORTUNISTIC`` – "no action is proactively executed but the
#: update will be performed as part of other actions (for example, resizes or recreateInstances
#: calls)" (pulumi-gcp ``InstanceGroupManagerUpdatePolicyArgs.type``; gcloud's
#: ``--update-policy-type=opportunistic``: "Do not proactively replace VMs"), with minimal action
#: ``NONE``. A new template therefore recreates no VM and gives up no capacity.
UPDATE_POLICY_TYPE = "OPPORTUNISTIC"
UPDATE_MINIMAL_ACTION = "NONE"
#: The name of the groups' one version (the template it points to changes, not the name).
VERSION_NAME = "multislice"
#: The group's inputs whose change replaces it (``replaceOnChanges``), deleted first:
#: ``targetSizePolicies`` ("You can't change the target size policy mode in an existing MIG": "About
#: bulk mode"); ``resourcePolicies`` ("You can replace or remove a workload policy from a MIG only if
#: there are no compute instances in the MIG": Compute Engine's "Replace, remove, or delete workload
#: policies"); ``allInstancesConfig``, which holds the accelerator type
#: (:meth:`~infra.backends.compute_engine.inputs.ComputeEngineInputs.group_metadata`), so that a new
#: accelerator type (a new machine type and topology) recreates the slice's VMs as one step rather
#: than leaving the running ones on the old template (the update policy is opportunistic); and,
#: where the program sets it, :data:`TARGET_SIZE` (in bulk mode VMs are added only while the target
#: size is 0: "About bulk mode").
GROUP_REPLACE_ON_CHANGES = ("targetSizePolicies", "resourcePolicies", "allInstancesConfig")
TARGET_SIZE = "targetSize"
#: A flex-start group's resize request is named ``<group>-<this>``.
RESIZE_REQUEST_SUFFIX = "flex-start"


class ComputeEngineSlices(pulumi.ComponentResource):
    """The slices of a ``multislice:backend: compute-engine`` stack (type ``multislice:compute:Slices``).

    Declares, under this component:

    * one workload policy (``gcp.compute.ResourcePolicy``, regional, ``HIGH_THROUGHPUT``,
      ``accelerator_topology`` = the slice's topology), only when a slice spans several VMs;
    * one instance template (``gcp.compute.InstanceTemplate``, global, ``name_prefix``): the TPU
      machine type, the boot image (:mod:`~infra.backends.compute_engine.images`) on a boot disk of
      the generation's type and size (:mod:`~infra.backends.compute_engine.machine`), the stack's subnetwork
      without an external IP (no ``access_configs``), the network tag, the VMs' service account
      with the ``cloud-platform`` scope, the labels, the capacity's ``scheduling`` and
      ``reservation_affinity`` (:mod:`~infra.backends.compute_engine.scheduling`), and the metadata
      (startup script, run directory, and the compute-engine keys of
      :meth:`~infra.backends.compute_engine.inputs.ComputeEngineInputs.template_metadata`);
    * one zonal managed instance group per slice (``gcp.compute.InstanceGroupManager``), named as
      the queued resource's nodes are (``multislice-<stack>-<i>``), ``target_size`` = VMs per
      slice (0 for a one-VM flex-start slice, whose resize request fills it), bulk mode for a
      multi-host slice (:mod:`~infra.backends.compute_engine.provisioning`), the workload policy,
      ``all_instances_config.metadata`` = its slice index and the accelerator type, and update
      policy ``OPPORTUNISTIC``; replaced, not patched, on :data:`GROUP_REPLACE_ON_CHANGES`.

    A trainer change converges in place: the startup script (template metadata) changes, so the
    template is replaced, new one first (pulumi-gcp replaces a template on any change, and with
    ``name_prefix`` the new one can exist beside the old one), and each group is updated to point
    at it. The groups' opportunistic update policy recreates no VM: running VMs keep their
    capacity; new or repaired VMs come from the new template. The running VMs switch by
    themselves: the queued resource's ``ResetQueuedResource`` reboots every VM, and no equivalent
    is documented for a multi-host slice of Compute Engine (docs/compute-engine.md, section 5), so
    each VM's release watch (``multislice-release-watch.service``, written by ``boot.sh``) reads
    the release record that the same ``pulumi up`` writes and boots the new release in place
    within ``infra.startup.boot.RELEASE_POLL_S`` seconds
    (docs/vm-boot.md, "The release watch"). ``deleteOnComplete`` is not offered on this backend.

    Attributes: ``template``, ``workload_policy`` (None for single-host slices), ``groups``
    (one per slice), ``group_names`` (an Output of their names, in slice order).
    """

    def __init__(self, name: str, args: ComputeEngineInputs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("multislice:compute:Slices", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.workload_policy: gcp.compute.ResourcePolicy | None = None
        if args.multi_host:
            self.workload_policy = gcp.compute.ResourcePolicy(
                f"{name}-workload-policy",
                project=args.project,
                region=args.region,
                description=f"Accelerator topology {args.topology} of each slice of multislice stack {args.stack}.",
                workload_policy=gcp.compute.ResourcePolicyWorkloadPolicyArgs(
                    type=WORKLOAD_POLICY_TYPE, accelerator_topology=args.topology
                ),
                opts=child,
            )
        affinity = reservation_affinity(args.capacity, args.reservation_name)
        timing = scheduling(args.capacity, args.max_run_duration_seconds, args.reservation_name)
        run_limit = timing.pop("max_run_duration", None)
        self.template = gcp.compute.InstanceTemplate(
            f"{name}-template",
            project=args.project,
            name_prefix=f"multislice-{args.stack}-",
            description=f"TPU VMs ({args.accelerator_type} slices) of multislice stack {args.stack}.",
            machine_type=args.machine_type,
            disks=[
                gcp.compute.InstanceTemplateDiskArgs(
                    boot=True,
                    auto_delete=True,
                    source_image=images.source_image(args.generation),
                    disk_type=machine.boot_disk_type(args.generation),
                    disk_size_gb=args.boot_disk_size_gb,
                )
            ],
            # No access_configs: no external IP (egress through the stack's Cloud NAT).
            network_interfaces=[
                gcp.compute.InstanceTemplateNetworkInterfaceArgs(
                    network=args.network, subnetwork=args.subnetwork, nic_type=machine.nic_type(args.generation)
                )
            ],
            service_account=gcp.compute.InstanceTemplateServiceAccountArgs(
                email=args.service_account, scopes=[CLOUD_PLATFORM_SCOPE]
            ),
            tags=list(args.tags),
            labels=dict(sorted(args.labels.items())),
            metadata=args.template_metadata(),
            scheduling=gcp.compute.InstanceTemplateSchedulingArgs(
                **timing,
                max_run_duration=gcp.compute.InstanceTemplateSchedulingMaxRunDurationArgs(**run_limit)
                if run_limit
                else None,
            ),
            reservation_affinity=_affinity_args(affinity),
            # A new template exists before the groups move to it and the old one goes.
            opts=pulumi.ResourceOptions(parent=self, hide_diffs=[f'metadata["{STARTUP_SCRIPT_KEY}"]']),
        )
        self.groups: list[gcp.compute.InstanceGroupManager] = []
        self.resize_requests: list[gcp.compute.ResizeRequest] = []
        bulk = args.target_size_policy_mode == provisioning.BULK
        for index, group in enumerate(args.group_names):
            self.groups.append(
                gcp.compute.InstanceGroupManager(
                    f"{name}-{index}",
                    project=args.project,
                    zone=args.zone,
                    name=group,
                    base_instance_name=group,
                    description=args.group_description(),
                    target_size=0 if args.resize_request else args.vms_per_slice,
                    target_size_policies=[gcp.compute.InstanceGroupManagerTargetSizePolicyArgs(mode=provisioning.BULK)]
                    if bulk
                    else None,
                    instance_lifecycle_policy=gcp.compute.InstanceGroupManagerInstanceLifecyclePolicyArgs(
                        default_action_on_failure=provisioning.REPAIR if args.repairs_vms else provisioning.DO_NOTHING
                    ),
                    versions=[
                        gcp.compute.InstanceGroupManagerVersionArgs(
                            name=VERSION_NAME, instance_template=self.template.self_link_unique
                        )
                    ],
                    resource_policies=gcp.compute.InstanceGroupManagerResourcePoliciesArgs(
                        workload_policy=self.workload_policy.self_link
                    )
                    if self.workload_policy is not None
                    else None,
                    all_instances_config=gcp.compute.InstanceGroupManagerAllInstancesConfigArgs(
                        metadata=args.group_metadata(index)
                    ),
                    update_policy=gcp.compute.InstanceGroupManagerUpdatePolicyArgs(
                        type=UPDATE_POLICY_TYPE, minimal_action=UPDATE_MINIMAL_ACTION
                    ),
                    # Fixed names: a group that must be replaced goes before its successor comes.
                    # What Compute Engine refuses to change on a group with VMs replaces it, and the
                    # preview says so (GROUP_REPLACE_ON_CHANGES). A group filled by a resize
                    # request grows from 0 by it: its target size is the request's to set.
                    opts=pulumi.ResourceOptions(
                        parent=self,
                        delete_before_replace=True,
                        replace_on_changes=[
                            *GROUP_REPLACE_ON_CHANGES,
                            *([] if args.resize_request else [TARGET_SIZE]),
                        ],
                        ignore_changes=[TARGET_SIZE] if args.resize_request else None,
                    ),
                )
            )
            if args.resize_request:
                self.resize_requests.append(_resize_request_of(name, index, args, self.groups[-1], self))
        self.group_names = pulumi.Output.all(*[g.name for g in self.groups])
        self.register_outputs({"groupNames": self.group_names})


def _resize_request_of(
    name: str, index: int, args: ComputeEngineInputs, group: gcp.compute.InstanceGroupManager, parent: pulumi.Resource
) -> gcp.compute.ResizeRequest:
    """Slice ``index``'s resize request: the slice's one VM, for the run duration."""
    assert args.max_run_duration_seconds is not None  # flex-start: the config requires it
    return gcp.compute.ResizeRequest(
        f"{name}-{index}-resize-request",
        project=args.project,
        zone=args.zone,
        name=f"{args.group_names[index]}-{RESIZE_REQUEST_SUFFIX}",
        instance_group_manager=group.name,
        resize_by=args.vms_per_slice,
        requested_run_duration=gcp.compute.ResizeRequestRequestedRunDurationArgs(
            seconds=str(args.max_run_duration_seconds)
        ),
        description=f"The {args.vms_per_slice} flex-start VMs of slice {index} of multislice stack {args.stack}.",
        # A request is never changed in place (pulumi-gcp replaces it on any change); a fixed
        # name goes before its successor comes.
        opts=pulumi.ResourceOptions(parent=parent, delete_before_replace=True),
    )


def _affinity_args(affinity: dict | None) -> gcp.compute.InstanceTemplateReservationAffinityArgs | None:
    if affinity is None:
        return None
    specific = affinity.get("specific_reservation")
    return gcp.compute.InstanceTemplateReservationAffinityArgs(
        type=affinity["type"],
        specific_reservation=gcp.compute.InstanceTemplateReservationAffinitySpecificReservationArgs(**specific)
        if specific
        else None,
    )

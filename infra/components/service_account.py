"""The TPU VMs' service account and its least-privilege grants.

(The trainer's ``training.cluster.ClusterIdentity`` is something else: a process's slice,
worker and rank.)
"""

from __future__ import annotations

from collections.abc import Callable

import pulumi
import pulumi_gcp as gcp

from infra import naming
from infra.naming import RUNS_PREFIX
from infra.vm_contract import COMPILATION_CACHE_FOLDER
from training.validation import StrictModel

#: Bucket-level role on the whole checkpoint bucket, without a condition: read and list
#: objects (the release record and its payloads, ``datasets/``, checkpoints). Listing is
#: authorized against the bucket, not an object, so it cannot be confined to a prefix, and
#: Orbax and gcsfs list the run directory. https://cloud.google.com/storage/docs/access-control/iam-roles
READ_ROLE = "roles/storage.objectViewer"
#: Bucket-level role on the checkpoint bucket, confined by an IAM condition to
#: :data:`WRITE_PREFIXES`: create, overwrite and delete objects there (Orbax writes checkpoints
#: and deletes superseded ones; JAX fills the compilation cache).
CHECKPOINT_ROLE = "roles/storage.objectUser"
#: Where in the checkpoint bucket the VMs write: the run directories and the stack's
#: compilation cache. Not ``multislice/`` (the release record, payloads and workload sources
#: that every boot runs as root: only ``pulumi up`` writes them) and not ``datasets/``
#: (``multislice data prepare`` writes them from the operator's machine).
WRITE_PREFIXES = (RUNS_PREFIX, f"{COMPILATION_CACHE_FOLDER}/")
#: The write grant's condition title (with the description and expression, the binding's
#: identity for the provider: keep it stable).
WRITE_CONDITION_TITLE = "multislice-vm-writes"
WRITE_CONDITION_DESCRIPTION = (
    "The TPU VMs write run directories and the compilation cache only, never the release record under "
    "multislice/ that every boot runs."
)
#: Bucket-level role on a ``gs://`` training-data bucket: read and list objects.
DATA_ROLE = "roles/storage.objectViewer"
#: The only project-level roles: write log entries and metric points.
PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")
#: The permissions of the custom role that lets worker 0 delete the queued resource when the
#: run completes (``multislice:queuedResource.deleteOnComplete``). Cloud TPU authorizes
#: ``projects.locations.queuedResources.delete`` with ``tpu.nodes.delete`` (the method's "IAM
#: Permissions": https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/delete;
#: there is no ``tpu.queuedResources.*`` permission: https://cloud.google.com/iam/docs/roles-permissions/tpu),
#: and the force delete of its nodes is part of that call. The narrowest predefined role with
#: it, ``roles/tpu.editor``, also creates, starts, stops and resets TPUs, hence a custom role.
DELETE_PERMISSIONS = ("tpu.nodes.delete",)
#: The permissions of the custom role that lets a VM of the compute-engine backend find its place
#: in the job: ``boot.sh`` lists its slice's and slice 0's managed instance groups
#: (``instanceGroupManagers.listManagedInstances``, authorized by
#: ``compute.instanceGroupManagers.get`` on the group:
#: https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listManagedInstances;
#: gcloud's ``list-instances`` help names ``compute.instanceGroupManagers.list`` for its own
#: command, but the REST method the VMs call names ``get``) and reads each listed VM's internal
#: IP (``instances.get``, authorized by ``compute.instances.get``:
#: https://cloud.google.com/compute/docs/reference/rest/v1/instances/get). The predefined role
#: with both, ``roles/compute.viewer``, reads every Compute Engine resource of the project, hence
#: a custom role of the two.
COMPUTE_READ_PERMISSIONS = ("compute.instanceGroupManagers.get", "compute.instances.get")
#: The permission of the custom role that lets a VM of the compute-engine backend recreate a slice
#: whose VMs were lost, where neither its group nor Compute Engine does (a multi-host Spot slice;
#: ``slice-watch.sh``): ``instanceGroupManagers.resize`` is authorized by
#: ``compute.instanceGroupManagers.update`` on the group
#: (https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/resize).
#: Granted on the project without a condition: IAM Conditions' resource attributes list Compute
#: Engine's instances and instance templates but not its instance group managers
#: (https://cloud.google.com/iam/docs/conditions-resource-attributes), so a condition on the
#: group's name would deny the call. The VMs can therefore update any group of the project
#: (docs/deploying.md, "What the VMs may read and write").
RECREATE_PERMISSIONS = ("compute.instanceGroupManagers.update",)


#: The component's type token before it was renamed from ``Identity``; the alias keeps the
#: URNs of existing stacks (the account and its grants are not replaced).
#: https://www.pulumi.com/docs/iac/concepts/options/aliases/
FORMER_TYPE = "multislice:gcp:Identity"


def object_prefix_condition(bucket: str, prefixes: tuple[str, ...]) -> str:
    """A CEL expression true for the objects of ``bucket`` whose names start with one of
    ``prefixes``: ``resource.name.startsWith("projects/_/buckets/<bucket>/objects/<prefix>")``
    for each, joined by ``||`` (the resource name of an object in an IAM condition:
    https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name). It is
    false for the bucket itself, so it grants nothing that is checked against the bucket
    (listing objects)."""
    return " || ".join(
        f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}")' for prefix in prefixes
    )


def write_condition(bucket: pulumi.Input[str]) -> gcp.storage.BucketIAMMemberConditionArgs:
    """The condition of the VMs' write grant on ``bucket``: objects under :data:`WRITE_PREFIXES`."""
    return gcp.storage.BucketIAMMemberConditionArgs(
        title=WRITE_CONDITION_TITLE,
        description=WRITE_CONDITION_DESCRIPTION,
        expression=pulumi.Output.from_input(bucket).apply(lambda name: object_prefix_condition(name, WRITE_PREFIXES)),
    )


def data_bucket(source: str, checkpoint_bucket: str) -> str | None:
    """The bucket of a training-data ``source`` when it is a ``gs://`` glob in a bucket other
    than ``checkpoint_bucket`` (that one is granted already); else None."""
    if not source.startswith("gs://"):
        return None
    name = source[len("gs://") :].split("/", 1)[0]
    return None if name == checkpoint_bucket else name


class ServiceAccountArgs(StrictModel):
    """What :class:`ServiceAccount` needs: the stack (account id), the project, and the bucket
    of ``gs://`` training data if the trainer reads any (:func:`data_bucket`)."""

    stack: str
    project: str
    data_bucket: str | None = None
    #: Grant :data:`DELETE_PERMISSIONS` (``multislice:queuedResource.deleteOnComplete``).
    delete_on_complete: bool = False
    #: Grant :data:`COMPUTE_READ_PERMISSIONS`: the backend's VMs find their place from their
    #: instance groups (``BackendSpec.vm_reads_instance_groups``: ``multislice:backend: compute-engine``).
    reads_instance_groups: bool = False
    #: Grant :data:`RECREATE_PERMISSIONS`: the VMs recreate a lost slice's VMs
    #: (``BackendSpec.slice_watch_recreates``: a compute-engine multi-host Spot slice).
    recreates_slices: bool = False
    #: Roles on the project beyond :data:`PROJECT_ROLES` (``BackendSpec.node_project_roles``: a GKE node's).
    extra_project_roles: tuple[str, ...] = ()


class ServiceAccount(pulumi.ComponentResource):
    """A dedicated service account for the TPU VMs, with least privilege.

    Grants: on the checkpoint bucket only, :data:`READ_ROLE` (read and list every object) and
    :data:`CHECKPOINT_ROLE` under the condition :func:`write_condition` (write under
    :data:`WRITE_PREFIXES` only: the VMs cannot write the release record that every boot
    runs); :data:`DATA_ROLE` on the training-data bucket only when the trainer reads ``gs://``
    data; :data:`PROJECT_ROLES` (log and metric writing) and ``extra_project_roles`` (a backend's
    nodes': the gke backend's) on the project; with
    ``delete_on_complete``, a custom role of :data:`DELETE_PERMISSIONS` alone on the project
    (:func:`delete_role_id`): worker 0 deletes the queued resource when the run completes; with
    ``reads_instance_groups``, a custom role of :data:`COMPUTE_READ_PERMISSIONS` alone on the project
    (:func:`compute_read_role_id`): each VM lists its slices' groups and reads their VMs' IPs;
    with ``recreates_slices``, a custom role of :data:`RECREATE_PERMISSIONS` alone on the project
    (:func:`slice_repair_role_id`): a VM recreates a slice whose VMs were lost.
    Nothing else project-wide: no editor, no storage admin, no TPU admin, no compute viewer.
    docs/deploying.md ("What the VMs may read and write") lists each grant and why.

    The custom roles' ids end in the account's unique id (:func:`delete_role_id`), so a stack
    destroyed and deployed again gets role ids IAM has never seen: a deleted custom role's id
    stays taken for up to 37 days.

    The account id is ``infra.naming.service_account_id`` (``multislice-<stack>-tpu``);
    ``bucket`` is the checkpoint bucket's name (an Output of the bucket component).

    Attributes (Outputs): ``email``, ``member`` (``serviceAccount:<email>``).
    """

    def __init__(
        self,
        name: str,
        args: ServiceAccountArgs,
        *,
        bucket: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        renamed = pulumi.ResourceOptions(aliases=[pulumi.Alias(type_=FORMER_TYPE)])
        super().__init__("multislice:gcp:ServiceAccount", name, None, pulumi.ResourceOptions.merge(opts, renamed))
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-tpu-vms",
            account_id=naming.service_account_id(args.stack),
            project=args.project,
            display_name=f"Multislice {args.stack} TPU VMs",
            description="Runs the trainer on the stack's TPU VMs: checkpoint bucket objects, logs, metrics.",
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        self.email = self.account.email
        self.member = self.account.email.apply(lambda email: f"serviceAccount:{email}")
        self.grants: list[pulumi.CustomResource] = []
        self.grants.append(
            gcp.storage.BucketIAMMember(
                f"{name}-checkpoints-read", bucket=bucket, role=READ_ROLE, member=self.member, opts=child
            )
        )
        self.grants.append(
            gcp.storage.BucketIAMMember(
                f"{name}-checkpoints",
                bucket=bucket,
                role=CHECKPOINT_ROLE,
                member=self.member,
                condition=write_condition(bucket),
                opts=child,
            )
        )
        if args.data_bucket is not None:
            self.grants.append(
                gcp.storage.BucketIAMMember(
                    f"{name}-training-data", bucket=args.data_bucket, role=DATA_ROLE, member=self.member, opts=child
                )
            )
        for role in (*PROJECT_ROLES, *args.extra_project_roles):
            self.grants.append(
                gcp.projects.IAMMember(
                    f"{name}-{role.split('/')[1].replace('.', '-').lower()}",
                    project=args.project,
                    role=role,
                    member=self.member,
                    opts=child,
                )
            )

        def custom_role(
            role_name: str,
            grant_name: str,
            role_id: Callable[[str], str],
            title: str,
            description: str,
            permissions: tuple[str, ...],
        ) -> gcp.projects.IAMCustomRole:
            """A project custom role of ``permissions``, granted to the VMs' account."""
            role = gcp.projects.IAMCustomRole(
                role_name,
                project=args.project,
                role_id=self.account.unique_id.apply(role_id),
                title=title,
                description=description,
                permissions=list(permissions),
                opts=child,
            )
            self.grants.append(
                gcp.projects.IAMMember(grant_name, project=args.project, role=role.name, member=self.member, opts=child)
            )
            return role

        self.delete_role: gcp.projects.IAMCustomRole | None = None
        if args.delete_on_complete:
            self.delete_role = custom_role(
                f"{name}-delete-role",
                f"{name}-delete-on-complete",
                lambda unique_id: delete_role_id(args.stack, unique_id),
                f"Multislice {args.stack}: delete the queued resource on complete",
                "Lets the stack's TPU VMs delete their queued resource once the run is complete "
                "(multislice:queuedResource.deleteOnComplete).",
                DELETE_PERMISSIONS,
            )
        self.compute_read_role: gcp.projects.IAMCustomRole | None = None
        if args.reads_instance_groups:
            self.compute_read_role = custom_role(
                f"{name}-compute-read-role",
                f"{name}-compute-read",
                lambda unique_id: compute_read_role_id(args.stack, unique_id),
                f"Multislice {args.stack}: find the slices' VMs",
                "Lets the stack's TPU VMs list their slices' managed instance groups and read the "
                "listed VMs' internal IPs (multislice:backend compute-engine).",
                COMPUTE_READ_PERMISSIONS,
            )
        self.slice_repair_role: gcp.projects.IAMCustomRole | None = None
        if args.recreates_slices:
            self.slice_repair_role = custom_role(
                f"{name}-slice-repair-role",
                f"{name}-slice-repair",
                lambda unique_id: slice_repair_role_id(args.stack, unique_id),
                f"Multislice {args.stack}: recreate a lost slice",
                "Lets the stack's TPU VMs recreate every VM of a slice whose VMs were lost, as its "
                "managed instance group does not repair one VM alone (multislice:backend compute-engine).",
                RECREATE_PERMISSIONS,
            )
        self.register_outputs({"email": self.email, "member": self.member})


#: Trailing digits of the service account's unique id that end the custom role's id.
ROLE_SUFFIX_DIGITS = 10


def delete_role_id(stack: str, account_unique_id: str) -> str:
    """Id of the stack's custom delete-on-complete role:
    ``multisliceDeleteOnComplete_<stack>_<last 10 digits of the account's unique id>``, with
    ``-`` in the stack name as ``_`` (a custom role id holds letters, digits, ``_`` and ``.``,
    3–64 characters: https://cloud.google.com/iam/docs/reference/rest/v1/projects.roles/create;
    the longest stack name gives 27 + 15 + 1 + 10 = 53).

    Why a suffix that changes with each deployment: a deleted custom role can be undeleted for
    7 days and is then permanently deleted
    (https://cloud.google.com/iam/docs/reference/rest/v1/projects.roles/delete); the custom
    roles guide adds that purging takes 30 more days, during which "you cannot create a new
    role with the same role ID", so the id is free again only 37 days after the delete
    (https://cloud.google.com/iam/docs/creating-custom-roles#deleting-custom-role, as quoted
    in hashicorp/terraform-provider-google#1681 and terraform-google-modules/
    terraform-google-bastion-host#14). pulumi-gcp's
    ``IAMCustomRole`` is Terraform's ``google_project_iam_custom_role``, whose create undeletes
    a soft-deleted role of the same id (hashicorp/terraform-provider-google
    ``resource_google_project_iam_custom_role.go``, since PR #1681) but only while IAM still
    returns it: from day 7 to day 37 the create fails with "You can't create a role_id (…)
    which has been marked for deletion" (the error in bastion-host#14). The service account is
    created anew by every deployment, and "if you delete a service account, then create a new
    service account with the same name, the new service account has a different unique ID"
    (https://cloud.google.com/iam/docs/reference/rest/v1/projects.serviceAccounts), so its
    unique id names the deployment without a random-number provider.

    Raises:
      ValueError: ``account_unique_id`` is not a string of digits.
    """
    return _role_id("multisliceDeleteOnComplete", stack, account_unique_id)


def compute_read_role_id(stack: str, account_unique_id: str) -> str:
    """Id of the stack's custom role of :data:`COMPUTE_READ_PERMISSIONS`:
    ``multisliceComputeRead_<stack>_<last 10 digits of the account's unique id>`` (why the
    suffix: :func:`delete_role_id`; the longest stack name gives 21 + 1 + 15 + 1 + 10 = 48).

    Raises:
      ValueError: ``account_unique_id`` is not a string of digits.
    """
    return _role_id("multisliceComputeRead", stack, account_unique_id)


def slice_repair_role_id(stack: str, account_unique_id: str) -> str:
    """Id of the stack's custom role of :data:`RECREATE_PERMISSIONS`:
    ``multisliceSliceRepair_<stack>_<last 10 digits of the account's unique id>`` (why the
    suffix: :func:`delete_role_id`; the longest stack name gives 21 + 1 + 15 + 1 + 10 = 48).

    Raises:
      ValueError: ``account_unique_id`` is not a string of digits.
    """
    return _role_id("multisliceSliceRepair", stack, account_unique_id)


def _role_id(prefix: str, stack: str, account_unique_id: str) -> str:
    if not account_unique_id.isdigit():
        raise ValueError(f"a service account's unique id is a number; got {account_unique_id[:40]!r}")
    return f"{prefix}_{stack.replace('-', '_')}_{account_unique_id[-ROLE_SUFFIX_DIGITS:]}"

"""The TPU VMs' service account and its least-privilege grants.

(The trainer's ``training.cluster.ClusterIdentity`` is something else: a process's slice,
worker and rank.)
"""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra import naming
from training.validation import StrictModel

#: Bucket-level role on the checkpoint bucket: create, read, list, overwrite and delete
#: objects (Orbax writes, finalizes and garbage-collects checkpoints); nothing on the bucket
#: itself. https://cloud.google.com/storage/docs/access-control/iam-roles
CHECKPOINT_ROLE = "roles/storage.objectUser"
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


#: The component's type token before it was renamed from ``Identity``; the alias keeps the
#: URNs of existing stacks (the account and its grants are not replaced).
#: https://www.pulumi.com/docs/iac/concepts/options/aliases/
FORMER_TYPE = "multislice:gcp:Identity"


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


class ServiceAccount(pulumi.ComponentResource):
    """A dedicated service account for the TPU VMs, with least privilege.

    Grants: :data:`CHECKPOINT_ROLE` on the checkpoint bucket only; :data:`DATA_ROLE` on the
    training-data bucket only when the trainer reads ``gs://`` data; :data:`PROJECT_ROLES`
    (log and metric writing) on the project; with ``delete_on_complete``, a custom role of
    :data:`DELETE_PERMISSIONS` alone on the project (:func:`delete_role_id`): worker 0
    deletes the queued resource when the run completes. Nothing else project-wide: no
    editor, no storage admin, no TPU admin.

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
        self.grants: list[pulumi.CustomResource] = [
            gcp.storage.BucketIAMMember(
                f"{name}-checkpoints", bucket=bucket, role=CHECKPOINT_ROLE, member=self.member, opts=child
            )
        ]
        if args.data_bucket is not None:
            self.grants.append(
                gcp.storage.BucketIAMMember(
                    f"{name}-training-data", bucket=args.data_bucket, role=DATA_ROLE, member=self.member, opts=child
                )
            )
        for role in PROJECT_ROLES:
            self.grants.append(
                gcp.projects.IAMMember(
                    f"{name}-{role.split('/')[1].replace('.', '-').lower()}",
                    project=args.project,
                    role=role,
                    member=self.member,
                    opts=child,
                )
            )
        self.delete_role: gcp.projects.IAMCustomRole | None = None
        if args.delete_on_complete:
            self.delete_role = gcp.projects.IAMCustomRole(
                f"{name}-delete-role",
                project=args.project,
                role_id=delete_role_id(args.stack),
                title=f"Multislice {args.stack}: delete the queued resource on complete",
                description="Lets the stack's TPU VMs delete their queued resource once the run is complete "
                "(multislice:queuedResource.deleteOnComplete).",
                permissions=list(DELETE_PERMISSIONS),
                opts=child,
            )
            self.grants.append(
                gcp.projects.IAMMember(
                    f"{name}-delete-on-complete",
                    project=args.project,
                    role=self.delete_role.name,
                    member=self.member,
                    opts=child,
                )
            )
        self.register_outputs({"email": self.email, "member": self.member})


def delete_role_id(stack: str) -> str:
    """Id of the stack's custom delete-on-complete role: ``multisliceDeleteOnComplete_<stack>`` with ``-`` as
    ``_`` (a custom role id holds letters, digits, ``_`` and ``.``, 3–64 characters:
    https://cloud.google.com/iam/docs/reference/rest/v1/projects.roles/create)."""
    return f"multisliceDeleteOnComplete_{stack.replace('-', '_')}"

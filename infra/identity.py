"""The TPU VMs' service account and its least-privilege grants."""

from __future__ import annotations

import pulumi
import pulumi_gcp as gcp

from infra.config import StackConfig, gce_name

#: Bucket-level role on the checkpoint bucket: create, read, list, overwrite and delete
#: objects (Orbax writes, finalizes and garbage-collects checkpoints); nothing on the bucket
#: itself. https://cloud.google.com/storage/docs/access-control/iam-roles
CHECKPOINT_ROLE = "roles/storage.objectUser"
#: Bucket-level role on a ``gs://`` training-data bucket: read and list objects.
DATA_ROLE = "roles/storage.objectViewer"
#: The only project-level roles: write log entries and metric points.
PROJECT_ROLES = ("roles/logging.logWriter", "roles/monitoring.metricWriter")


def data_bucket(config: StackConfig) -> str | None:
    """The bucket of ``training.data.source`` when it is a ``gs://`` glob other than ours."""
    source = config.training.data.source
    if not source.startswith("gs://"):
        return None
    name = source[len("gs://") :].split("/", 1)[0]
    return None if name == config.bucket_name else name


class Identity(pulumi.ComponentResource):
    """A dedicated service account for the TPU VMs, with least privilege.

    Grants: :data:`CHECKPOINT_ROLE` on the checkpoint bucket only; :data:`DATA_ROLE` on the
    training-data bucket only when the trainer reads ``gs://`` data; :data:`PROJECT_ROLES`
    (log and metric writing) on the project. Nothing else project-wide: no editor, no
    storage admin, no TPU admin.

    Attributes (Outputs): ``email``, ``member`` (``serviceAccount:<email>``).
    """

    def __init__(
        self,
        name: str,
        config: StackConfig,
        *,
        bucket: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("multislice:gcp:Identity", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            f"{name}-tpu-vms",
            account_id=gce_name("multislice", config.stack, "tpu", limit=30),
            project=config.project,
            display_name=f"Multislice {config.stack} TPU VMs",
            description="Runs the trainer on the stack's TPU VMs: checkpoint bucket objects, logs, metrics.",
            opts=pulumi.ResourceOptions(parent=self, delete_before_replace=True),
        )
        self.email = self.account.email
        self.member = self.account.email.apply(lambda email: f"serviceAccount:{email}")
        self.grants = [
            gcp.storage.BucketIAMMember(
                f"{name}-checkpoints", bucket=bucket, role=CHECKPOINT_ROLE, member=self.member, opts=child
            )
        ]
        if (data := data_bucket(config)) is not None:
            self.grants.append(
                gcp.storage.BucketIAMMember(f"{name}-training-data", bucket=data, role=DATA_ROLE, member=self.member, opts=child)
            )
        for role in PROJECT_ROLES:
            self.grants.append(
                gcp.projects.IAMMember(
                    f"{name}-{role.split('/')[1].replace('.', '-').lower()}",
                    project=config.project,
                    role=role,
                    member=self.member,
                    opts=child,
                )
            )
        self.register_outputs({"email": self.email, "member": self.member})

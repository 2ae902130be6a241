"""The names a stack's cloud resources get, derived from its config: :class:`ResourceNames`.

Deterministic (:mod:`infra.naming` holds the rules), so local tools find a deployed stack's
resources from its stack file alone. :class:`~infra.config.StackConfig` inherits them; this module
declares the fields they read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra import accelerators, naming

if TYPE_CHECKING:
    from infra.config.environment import BucketSettings


class ResourceNames:
    """The derived names and shapes of :class:`~infra.config.StackConfig` (a mixin: the model
    declares the fields, with their stack keys)."""

    if TYPE_CHECKING:  # the model's fields (declared for the type checker only: the model keeps its field order)
        stack: str
        project: str
        zone: str
        accelerator_type: str
        slices: int
        run_name: str | None
        bucket: BucketSettings
        labels: dict[str, str]

    @property
    def accelerator(self) -> accelerators.AcceleratorType:
        return accelerators.parse_accelerator_type(self.accelerator_type)

    @property
    def is_production(self) -> bool:
        """A production stack: named ``prod`` or ``prod-*`` (protected bucket, soft delete on)."""
        return self.stack == "prod" or self.stack.startswith("prod-")

    @property
    def effective_run_name(self) -> str:
        return self.run_name or self.stack

    @property
    def resource_prefix(self) -> str:
        """``multislice-<stack>`` as a GCE name: the stem of every resource name."""
        return naming.resource_prefix(self.stack)

    @property
    def queued_resource_id(self) -> str:
        """Id of the queued resource; also the node id (1 slice) or node id prefix (slices > 1)."""
        return naming.queued_resource_id(self.stack)

    @property
    def queued_resource_name(self) -> str:
        """The QR's resource name, ``projects/<project>/locations/<zone>/queuedResources/<id>``."""
        return f"projects/{self.project}/locations/{self.zone}/queuedResources/{self.queued_resource_id}"

    @property
    def node_ids(self) -> list[str]:
        """Node (slice) ids the QR creates: ``<prefix>-0 … <prefix>-<n-1>``, or ``<id>`` for 1 slice."""
        return naming.node_ids(self.stack, self.slices)

    @property
    def network_tag(self) -> str:
        """Network tag on every TPU VM; the firewall rules target and admit it."""
        return naming.network_tag(self.stack)

    @property
    def bucket_name(self) -> str:
        """Checkpoint bucket: ``multislice:bucket.name`` or ``<project>-<stack>-ckpt``."""
        return naming.bucket_name(self.project, self.stack, self.bucket.name)

    @property
    def run_dir(self) -> str:
        """``gs://<bucket>/runs/<run name>``: the value of the nodes' ``multislice-run-dir`` metadata."""
        return naming.run_dir(self.bucket_name, self.effective_run_name)

    @property
    def bucket_protected(self) -> bool:
        """Pulumi ``protect`` on the bucket: ``multislice:bucket.protect``, default on for prod stacks."""
        if self.bucket.protect is not None:
            return self.bucket.protect
        return self.is_production

    @property
    def resource_labels(self) -> dict[str, str]:
        """Labels on every labelled resource: ``multislice:labels`` plus the reserved ones."""
        return naming.resource_labels(self.stack, self.effective_run_name, self.labels)

    @property
    def workers_per_slice(self) -> int:
        return self.accelerator.hosts

    @property
    def total_workers(self) -> int:
        return self.slices * self.accelerator.hosts

"""StackConfig: the validated model of one stack's ``config:`` map.

Field aliases are the stack-file keys (``gcp:project``, ``multislice:slices`` …); reading the
file or the Pulumi engine's config map into this model is :mod:`infra.config.loading`, the
environment keys' models are :mod:`infra.config.environment`, and every derived resource
name comes from :mod:`infra.naming` (the properties below delegate to it).

Rules and their sources:

* accelerator type is in the catalog (``infra.accelerators``);
* slices > 1 only where the generation supports Multislice (v4 and later), and
  1 ≤ slices ≤ 256 (https://cloud.google.com/tpu/docs/multislice-introduction);
* ici.data × ici.fsdp × ici.tensor = chips per slice and dcn.data × dcn.fsdp × dcn.tensor =
  slices, dcn.tensor = 1 (same source);
* the global batch divides by the data-parallel size (``training.config``);
* ``capacity`` is one of :data:`CAPACITY_TYPES`, the capacity the ``tpu_v2`` API's
  QueuedResource can request (``spot``, ``guaranteed``, ``reservation_name``:
  https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources);
  ``best-effort`` exists only in the v2alpha1 API, and Spot supersedes it;
* ``reservationName`` only with ``capacity: reserved``; a reservation name or a full
  ``projects/<p>/locations/<zone>/reservations/<name>`` path.
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from infra import accelerators, naming
from infra.config.environment import BucketSettings, NetworkSettings, QueuedResourceSettings
from training.config import TrainConfig
from training.validation import StrictModel, invalid

#: How the slices are paid for (``multislice:capacity``).
Capacity = Literal["spot", "on-demand", "reserved"]
CAPACITY_TYPES: tuple[str, ...] = typing.get_args(Capacity)

_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
#: Stack and run names become directory names (local state, ``gs://<bucket>/runs/<run>``):
#: they start with a letter or digit, so "." and ".." can never name a parent directory.
_STACK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_RESERVATION_PATH = re.compile(
    r"^(projects|folders|organizations)/[A-Za-z0-9-]+/locations/[a-z0-9-]+/reservations/([a-z]([-a-z0-9]{0,61}[a-z0-9])?|-)$"
)


def _capacity(value: Any) -> Any:
    if value == "best-effort":
        raise ValueError(
            "got 'best-effort'; the tpu_v2 API has no best-effort tier (it exists only in v2alpha1; "
            f"Spot supersedes it); allowed: {', '.join(CAPACITY_TYPES)}"
        )
    return value


class StackConfig(StrictModel):
    """A validated stack. Field aliases are the stack-file keys.

    ``stack`` is the stack name (from the file name or ``pulumi.get_stack()``), not a key.
    """

    model_config = StrictModel.model_config | {"populate_by_name": True}

    stack: str
    project: str = Field(alias="gcp:project", description="GCP project id.")
    zone: str = Field(alias="gcp:zone", description="Zone of the TPU slices, e.g. us-central2-b.")
    accelerator_type: str = Field(alias="multislice:acceleratorType", description="e.g. v4-8, v5p-16, v6e-256.")
    slices: int = Field(1, ge=1, le=accelerators.MAX_SLICES, alias="multislice:slices")
    runtime_version: str | None = Field(
        None, min_length=1, alias="multislice:runtimeVersion", description="TPU software version; catalog default."
    )
    capacity: Annotated[Capacity, BeforeValidator(_capacity)] = Field(
        "on-demand", alias="multislice:capacity", description="spot, on-demand or reserved."
    )
    reservation_name: str | None = Field(None, min_length=1, alias="multislice:reservationName")
    run_name: str | None = Field(
        None, alias="multislice:runName", description="Run directory name; default: stack."
    )
    training: TrainConfig = Field(TrainConfig(), alias="multislice:training")
    network: NetworkSettings = Field(NetworkSettings(), alias="multislice:network")
    bucket: BucketSettings = Field(BucketSettings(), alias="multislice:bucket")
    queued_resource: QueuedResourceSettings = Field(QueuedResourceSettings(), alias="multislice:queuedResource")
    labels: Annotated[dict[str, str], BeforeValidator(naming.check_labels)] = Field(
        default_factory=dict, alias="multislice:labels", description="Extra labels on every labelled resource."
    )

    @field_validator("stack", "run_name")
    @classmethod
    def _directory_name(cls, value: str | None) -> str | None:
        if value is not None and not _STACK.match(value):
            raise ValueError(
                f"{value!r} must start with a letter or digit and hold only letters, digits, '.', '_' "
                "and '-' (at most 100 characters): it names directories"
            )
        return value

    @field_validator("project")
    @classmethod
    def _project_id(cls, value: str) -> str:
        if not _PROJECT.match(value):
            raise ValueError(
                f"{value!r} is not a GCP project id (6–30 characters: lowercase letters, digits, hyphens; "
                "starts with a letter)"
            )
        return value

    @field_validator("zone")
    @classmethod
    def _zone_format(cls, value: str) -> str:
        if not _ZONE.match(value):
            raise ValueError(f"{value!r} is not a zone name like 'us-central2-b' (<region>-<letter>)")
        return value

    @field_validator("reservation_name")
    @classmethod
    def _reservation(cls, value: str | None) -> str | None:
        if value is not None and not (naming.GCE_NAME.match(value) or _RESERVATION_PATH.match(value)):
            raise ValueError(
                f"{value!r} is not a reservation name (lowercase letters, digits, hyphens) or a "
                "projects/<project>/locations/<zone>/reservations/<name> path"
            )
        return value

    @field_validator("accelerator_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        accelerators.parse_accelerator_type(value)  # UnknownAcceleratorType is a ValueError
        return value

    @model_validator(mode="after")
    def _consistent(self) -> StackConfig:
        acc = accelerators.parse_accelerator_type(self.accelerator_type)
        gen = acc.generation
        if self.slices > 1 and not gen.supports_multislice:
            raise invalid(
                "multislice:slices",
                f"Multislice needs TPU v4 or later; {self.accelerator_type} allows only 1 slice",
            )
        if self.reservation_name is not None and self.capacity != "reserved":
            raise invalid(
                "multislice:reservationName",
                f"is only used with multislice:capacity 'reserved' (capacity is {self.capacity!r})",
            )
        par = self.training.parallelism
        if par.ici.product != acc.chips:
            raise invalid(
                "multislice:training.parallelism.ici",
                f"data×fsdp×tensor = {par.ici.data}×{par.ici.fsdp}×{par.ici.tensor} = {par.ici.product} "
                f"must equal the chips per slice of {self.accelerator_type}: {acc.chips}",
            )
        if par.dcn.product != self.slices:
            raise invalid(
                "multislice:training.parallelism.dcn",
                f"data×fsdp×tensor = {par.dcn.data}×{par.dcn.fsdp}×{par.dcn.tensor} = {par.dcn.product} "
                f"must equal multislice:slices: {self.slices}",
            )
        return self

    # Derived values -------------------------------------------------------------------------

    @property
    def accelerator(self) -> accelerators.AcceleratorType:
        return accelerators.parse_accelerator_type(self.accelerator_type)

    @property
    def region(self) -> str:
        """The zone's region: ``us-central2-b`` → ``us-central2``."""
        return self.zone.rsplit("-", 1)[0]

    @property
    def effective_runtime_version(self) -> str:
        return self.runtime_version or self.accelerator.generation.default_runtime_version

    @property
    def effective_run_name(self) -> str:
        return self.run_name or self.stack

    # Names of the cloud resources (infra.naming; deterministic, so local tools find them) --

    @property
    def resource_prefix(self) -> str:
        """``multislice-<stack>`` as a GCE name: the stem of every resource name."""
        return naming.resource_prefix(self.stack)

    @property
    def queued_resource_id(self) -> str:
        """Id of the queued resource; also the node id (1 slice) or node id prefix (slices > 1)."""
        return naming.queued_resource_id(self.stack)

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
        return self.stack == "prod" or self.stack.startswith("prod-")

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

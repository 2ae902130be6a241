"""StackConfig: the validated model of one stack's ``config:`` map.

Field aliases are the stack-file keys (``gcp:project``, ``multislice:slices`` …); reading the
file or the Pulumi engine's config map into this model is :mod:`infra.config.loading`, the
environment keys' models are :mod:`infra.config.environment`, and every derived resource
name comes from :mod:`infra.naming` (:class:`~infra.config.resource_names.ResourceNames`, which
the model inherits, delegates to it).

Rules and their sources:

* accelerator type is in the catalog (``infra.accelerators``);
* slices > 1 only where the generation supports Multislice (v4 and later), and
  1 ≤ slices ≤ 256 (https://cloud.google.com/tpu/docs/multislice-introduction);
* ici.data × ici.fsdp × ici.tensor = chips per slice and dcn.data × dcn.fsdp × dcn.tensor =
  slices, dcn.tensor = 1 (same source);
* the global batch divides by the data-parallel size (``training.config``);
* the trainer's attention kernel is not ``cudnn`` (NVIDIA GPUs' kernel; a stack's chips are TPUs);
* ``capacity`` is one of :data:`CAPACITY_TYPES`, the capacity the ``tpu_v2`` API's
  QueuedResource can request (``spot``, ``guaranteed``, ``reservation_name``:
  https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources);
  ``best-effort`` exists only in the v2alpha1 API, and Spot supersedes it;
* ``reservationName`` only with ``capacity: reserved``; a reservation name or a path of the form the
  stack's backend sends it in (the Cloud TPU API's ``projects/<p>/locations/<zone>/reservations/<name>``,
  Compute Engine's ``projects/<p>/reservations/<name>``: :mod:`infra.config.reservations`), naming the
  stack's own project and zone;
* every boolean key takes ``true`` or ``false`` only (:data:`training.validation.ConfigBool`: what
  Pulumi's ``Config.get_bool`` reads), and every key of a nested map its stack-file (camelCase) name only;
* the stack name is spelled the way GCP names are (``infra.naming.check_stack_name``): two
  stacks never map to one set of resource names;
* ``gcp:zone`` offers the accelerator's generation and ``runtimeVersion`` is one the
  generation runs (``Generation.zones`` and ``Generation.runtime_versions`` of
  ``infra.accelerators``, with their public sources), unless ``multislice:allowUnlisted``
  names the check (``zone``, ``runtimeVersion``): the catalog can lag behind Cloud TPU, and
  an unlisted value then only warns. A runtime version is always a plain name
  (``[a-z0-9.-]``): the TPU API would refuse anything else only after the network, bucket and
  service account exist;
* a reused subnetwork is in the zone's region, and the bucket has a location
  (``infra.bucket_location``: ``us-central2``, the v4 region, is not a storage location);
* ``multislice:backend`` is a registered backend (:data:`infra.backends.registry.SPECS`) and the
  stack is checked through its spec (:class:`infra.backends.spec.BackendSpec`): the backend offers
  the accelerator's generation and the capacity (the catalog keeps the facts, the spec answers
  from them; docs/compute-engine.md section 1), ``gcp:zone`` is among the backend's zones for the
  generation (``allowUnlisted: [zone]`` relaxes it the same way), a runtime version is checked
  only where the backend has one, and each backend refuses the keys it cannot honour and its own
  settings key (``multislice:queuedResource``, ``multislice:computeEngine``) on another backend's
  stack. A key set to its default configures nothing and is not refused (a stack dumped and
  validated again holds every key).
"""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from infra import accelerators, bucket_location as locations, naming
from infra.backends import registry
from infra.backends.compute_engine.spec import ComputeEngineSettings
from infra.backends.gke.cluster import GkeSettings
from infra.backends.queued_resource.spec import QueuedResourceSettings
from infra.backends.spec import BackendSpec
from infra.config import backend_checks, elastic, reservations
from infra.config.derived import DerivedValues
from infra.config.elastic import ElasticSettings
from infra.config.environment import BucketSettings, NetworkSettings
from infra.config.workload import WorkloadSettings
from training.config import TrainConfig
from training.validation import ConfigBool, StrictModel, invalid

#: How the slices are paid for (``multislice:capacity``); ``flex-start`` only on Compute Engine and GKE.
Capacity = Literal["spot", "on-demand", "reserved", "flex-start"]
CAPACITY_TYPES: tuple[str, ...] = typing.get_args(Capacity)
#: Where the TPU VMs come from (``multislice:backend``): one of :data:`BACKENDS`, the registered
#: backends (:data:`infra.backends.registry.SPECS`: a multislice queued resource of the Cloud TPU
#: API, or Compute Engine instances in one managed instance group per slice).
Backend = str
BACKENDS: tuple[str, ...] = registry.NAMES

#: ``<region>-<letter>``, or an AI zone ``<region>-ai<n><letter>`` (the regions-zones page lists
#: e.g. us-central1-ai1a: https://cloud.google.com/tpu/docs/regions-zones).
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-(?:[a-z]|ai[0-9]+[a-z]?)$")
#: A TPU software version as the runtimes page spells them (tpu-ubuntu2204-base, v2-alpha-tpuv5).
_RUNTIME_VERSION = re.compile(r"^[a-z0-9](?:[a-z0-9.-]{0,61}[a-z0-9])?$")
#: Catalog checks ``multislice:allowUnlisted`` can relax into warnings.
Unlisted = Literal["zone", "runtimeVersion"]
_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
#: Run names become directory names (``gs://<bucket>/runs/<run>``, local state): they start
#: with a letter or digit, so "." and ".." can never name a parent directory.
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


def _capacity(value: Any) -> Any:
    if value == "best-effort":
        raise ValueError(
            "got 'best-effort'; the tpu_v2 API has no best-effort tier (it exists only in v2alpha1; "
            f"Spot supersedes it); allowed: {', '.join(CAPACITY_TYPES)}"
        )
    return value


def _backend(value: Any) -> Any:
    """A registered backend's name (the message pydantic gives a ``Literal`` of them)."""
    if value not in BACKENDS:
        quoted = [repr(name) for name in BACKENDS]
        raise ValueError(f"Input should be {', '.join(quoted[:-1])} or {quoted[-1]}")
    return value


class StackConfig(DerivedValues, StrictModel):
    """A validated stack. Field aliases are the stack-file keys.

    ``stack`` is the stack name (from the file name or ``pulumi.get_stack()``), not a key.
    """

    model_config = StrictModel.model_config | {"populate_by_name": True}

    stack: str
    project: str = Field(alias="gcp:project", description="GCP project id.")
    zone: str = Field(alias="gcp:zone", description="Zone of the TPU slices, e.g. us-central2-b.")
    accelerator_type: str = Field(alias="multislice:acceleratorType", description="e.g. v4-8, v5p-16, v6e-256.")
    slices: int = Field(default=1, ge=1, le=accelerators.MAX_SLICES, alias="multislice:slices")
    runtime_version: str | None = Field(
        default=None,
        min_length=1,
        alias="multislice:runtimeVersion",
        description="TPU software version; catalog default.",
    )
    backend: Annotated[Backend, BeforeValidator(_backend)] = Field(
        default=registry.DEFAULT,
        alias="multislice:backend",
        description=" or ".join(f"{spec.name} ({spec.summary})" for spec in registry.SPECS.values()) + ".",
    )
    capacity: Annotated[Capacity, BeforeValidator(_capacity)] = Field(
        default="on-demand",
        alias="multislice:capacity",
        description="spot, on-demand, reserved or (compute-engine and gke only) flex-start.",
    )
    reservation_name: str | None = Field(default=None, min_length=1, alias="multislice:reservationName")
    run_name: str | None = Field(
        default=None, alias="multislice:runName", description="Run directory name; default: stack."
    )
    training: TrainConfig = Field(default=TrainConfig(), alias="multislice:training")
    network: NetworkSettings = Field(default=NetworkSettings(), alias="multislice:network")
    bucket: BucketSettings = Field(default=BucketSettings(), alias="multislice:bucket")
    queued_resource: QueuedResourceSettings = Field(default=QueuedResourceSettings(), alias="multislice:queuedResource")
    compute_engine: ComputeEngineSettings = Field(default=ComputeEngineSettings(), alias="multislice:computeEngine")
    gke: GkeSettings = Field(default=GkeSettings(), alias="multislice:gke")
    elastic: ElasticSettings = Field(default=ElasticSettings(), alias="multislice:elastic")
    labels: Annotated[dict[str, str], BeforeValidator(naming.check_labels)] = Field(
        default_factory=dict, alias="multislice:labels", description="Extra labels on every labelled resource."
    )
    allow_backend_change: ConfigBool = Field(
        default=False,
        alias="multislice:allowBackendChange",
        description="Confirms a change of multislice:backend on a deployed stack (infra/backend_change.py).",
    )
    warm_standby: ConfigBool = Field(
        default=True,
        alias="multislice:warmStandby",
        description="A warm standby trainer on every VM, forked by each trainer restart (training/standby.py).",
    )
    allow_unlisted: tuple[Unlisted, ...] = Field(
        default=(), alias="multislice:allowUnlisted", description="Catalog checks that only warn: zone, runtimeVersion."
    )
    #: None: the bundled trainer (``multislice:training``); else the user's command (infra.config.workload).
    workload: WorkloadSettings | None = Field(default=None, alias="multislice:workload")

    @model_validator(mode="before")
    @classmethod
    def _peak_flops_from_catalog(cls, data: Any) -> Any:
        """``training.peak_flops_per_chip`` (the trainer's MFU denominator) from the catalog's
        ``peak_bf16_flops_per_chip`` of the accelerator type, unless the stack sets it; the
        trainer never imports infra/, so the program renders the number into its config."""
        if not isinstance(data, dict):
            return data
        if data.get("multislice:workload", data.get("workload")) is not None and (
            "multislice:training" in data or "training" in data
        ):
            raise invalid(
                "multislice:training",
                "configures the bundled trainer, and multislice:workload runs a command instead: keep one of them",
            )
        key = "multislice:training" if "multislice:training" in data or "training" not in data else "training"
        try:
            peak = accelerators.parse_accelerator_type(
                data.get("multislice:acceleratorType", data.get("accelerator_type"))
            ).generation.peak_bf16_flops_per_chip
        except (ValueError, TypeError):
            return data  # the accelerator type's own validator reports it
        training = data.get(key, {})
        if isinstance(training, TrainConfig):
            if training.peak_flops_per_chip is None:
                training = training.model_copy(update={"peak_flops_per_chip": peak})
        elif isinstance(training, dict):
            training = {"peak_flops_per_chip": peak} | training
        return data | {key: training}

    @field_validator("stack")
    @classmethod
    def _stack_name(cls, value: str) -> str:
        return naming.check_stack_name(value)

    @field_validator("run_name")
    @classmethod
    def _directory_name(cls, value: str | None) -> str | None:
        if value is not None and not _RUN_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} must start with a letter or digit and hold only letters, digits, '.', '_' "
                "and '-' (at most 100 characters): it names directories"
            )
        return value

    @field_validator("runtime_version")
    @classmethod
    def _runtime_version_spelling(cls, value: str | None) -> str | None:
        if value is not None and not _RUNTIME_VERSION.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a TPU software version name (lowercase letters, digits, '.', '-'; e.g. "
                "'tpu-ubuntu2204-base'; https://cloud.google.com/tpu/docs/runtimes)"
            )
        return value

    @field_validator("project")
    @classmethod
    def _project_id(cls, value: str) -> str:
        if not _PROJECT.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a GCP project id (6–30 characters: lowercase letters, digits, hyphens; "
                "starts with a letter)"
            )
        return value

    @field_validator("zone")
    @classmethod
    def _zone_format(cls, value: str) -> str:
        if not _ZONE.fullmatch(value):
            raise ValueError(f"{value!r} is not a zone name like 'us-central2-b' (<region>-<letter>)")
        return value

    @field_validator("reservation_name")
    @classmethod
    def _reservation(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A name, or a path of the form the backend sends (lowercase letters, digits, hyphens)."""
        if value is None:
            return value
        spec = registry.spec_of(info.data.get("backend", registry.DEFAULT))
        return reservations.check_form(value, spec.name, spec.reservation_forms, naming.GCE_NAME, info.data.get("zone"))

    def _reservation_in_the_stacks_zone(self) -> None:
        """A reservation path names the stack's own project and zone: each backend sends the path
        or its last segment for the VMs of ``gcp:zone`` in ``gcp:project``, so another one would be
        dropped or fail only when the capacity is requested."""
        problem = reservations.place_problem(self.reservation_name or "", self.project, self.zone)
        if problem is not None:
            raise invalid("multislice:reservationName", problem)

    @field_validator("accelerator_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        accelerators.parse_accelerator_type(value)  # UnknownAcceleratorType is a ValueError
        return value

    @model_validator(mode="after")
    def _consistent(self) -> StackConfig:
        acc = accelerators.parse_accelerator_type(self.accelerator_type)
        gen = acc.generation
        backend_checks.check_generation(self, gen)
        if self.slices > 1 and not gen.supports_multislice:
            raise invalid(
                "multislice:slices",
                f"Multislice needs TPU v4 or later; {self.accelerator_type} allows only 1 slice",
            )
        backend_checks.check_capacity(self)
        if self.reservation_name is not None and self.capacity != "reserved":
            raise invalid(
                "multislice:reservationName",
                f"is only used with multislice:capacity 'reserved' (capacity is {self.capacity!r})",
            )
        self._reservation_in_the_stacks_zone()
        backend_checks.check_catalog(self, gen)
        self._reused_subnetwork()
        if self.bucket.location is None and locations.bucket_location(self.region) is None:
            raise invalid(
                "multislice:bucket.location",
                f"required: region {self.region!r} of gcp:zone is not a Cloud Storage location this program knows "
                "(https://cloud.google.com/storage/docs/locations); set a location, e.g. a nearby region",
            )
        if self.workload is not None:
            elastic.check(self)
            return self  # the command brings its own parallelism; the trainer's checks do not apply
        elastic_fields = (("min_slices", "minSlices"), ("shrink_after_s", "shrinkAfter"), ("grow_after_s", "growAfter"))
        for field, key in elastic_fields:  # at its default (a full dump read again) it says nothing
            if getattr(self.training, field) != type(self.training).model_fields[field].default:
                raise invalid(
                    f"multislice:training.{field}",
                    f"is the program's, filled from multislice:elastic.{key}: set that key instead",
                )
        if self.training.model.attention == "cudnn":
            raise invalid(
                "multislice:training.model.attention",
                f"cudnn is NVIDIA GPUs' kernel; this stack's accelerator is TPU {self.accelerator_type}: use auto "
                "(splash on TPU where it takes the shapes), splash, xla or reference",
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
        elastic.check(self)
        return self

    @property
    def backend_spec(self) -> BackendSpec:
        """The spec of the stack's ``multislice:backend`` (:mod:`infra.backends`)."""
        return registry.spec_of(self.backend)

    @property
    def model_fields_set_aliases(self) -> set[str]:
        """The stack-file keys this stack sets (aliases of the fields set)."""
        return {type(self).model_fields[name].alias or name for name in self.model_fields_set}

    def _reused_subnetwork(self) -> None:
        """A reused subnetwork is in the network's project and the zone's region."""
        subnet = self.network.subnetwork_path(self.project, self.region)
        if subnet is None:
            return
        _, subnet_project, _, subnet_region, *_ = subnet.split("/")
        host = self.network.host_project(self.project)
        if subnet_project != host:
            raise invalid(
                "multislice:network.existingSubnetwork",
                f"is in project {subnet_project!r} but existingNetwork is in {host!r}; a subnetwork belongs to its "
                "network's project (for Shared VPC: the host project; a bare network name means gcp:project)",
            )
        if subnet_region != self.region:
            raise invalid(
                "multislice:network.existingSubnetwork",
                f"is in region {subnet_region!r} but gcp:zone {self.zone} is in {self.region!r}; the TPU VMs need "
                "a subnetwork of their zone's region",
            )

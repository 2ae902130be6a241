"""The values a stack derives from its keys: :class:`DerivedValues`, which
:class:`~infra.config.StackConfig` inherits (as it inherits the resource names,
:class:`~infra.config.resource_names.ResourceNames`); this module declares the fields they read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra import bucket_location as locations
from infra.backends.queued_resource.spec import FORMER_DELETE_ON_COMPLETE_KEY
from infra.config import backend_checks
from infra.config.resource_names import ResourceNames
from training.warning_text import WarningText, act

if TYPE_CHECKING:
    from infra.backends.compute_engine.spec import ComputeEngineSettings
    from infra.backends.queued_resource.spec import QueuedResourceSettings
    from infra.backends.spec import BackendSpec
    from infra.config.workload import WorkloadSettings
    from training.config import TrainConfig

#: Soft-delete retention of a production stack's checkpoint bucket, days (the smallest nonzero
#: value GCS allows: https://cloud.google.com/storage/docs/soft-delete).
PRODUCTION_SOFT_DELETE_DAYS = 7


class DerivedValues(ResourceNames):
    """The derived values of :class:`~infra.config.StackConfig` (a mixin: the model declares the
    fields, with their stack keys, and :attr:`backend_spec`)."""

    if TYPE_CHECKING:  # the model's fields (declared for the type checker only: the model keeps its field order)
        runtime_version: str | None
        backend: str
        training: TrainConfig
        queued_resource: QueuedResourceSettings
        compute_engine: ComputeEngineSettings
        workload: WorkloadSettings | None

        @property
        def backend_spec(self) -> BackendSpec: ...

    @property
    def catalog_warnings(self) -> list[WarningText]:
        """What ``multislice:allowUnlisted`` let through (``pulumi preview`` prints each)."""
        return backend_checks.catalog_warnings(self)

    @property
    def region(self) -> str:
        """The zone's region: ``us-central2-b`` → ``us-central2``."""
        return locations.region_of(self.zone)

    @property
    def bucket_location(self) -> str:
        """``multislice:bucket.location``, else the storage location of the zone's region."""
        location = self.bucket.location or locations.bucket_location(self.region)
        assert location is not None  # _consistent refused the stack otherwise
        return location

    @property
    def bucket_soft_delete_days(self) -> int:
        """``multislice:bucket.softDeleteDays``, else 7 on production stacks and 0 elsewhere."""
        if self.bucket.soft_delete_days is not None:
            return self.bucket.soft_delete_days
        return PRODUCTION_SOFT_DELETE_DAYS if self.is_production else 0

    @property
    def delete_on_complete(self) -> bool:
        """Whether worker 0 of slice 0 deletes the stack's slices once the run is complete: the
        backend's answer (:meth:`infra.backends.spec.BackendSpec.delete_on_complete`). On the
        queued resource ``multislice:queuedResource.deleteOnComplete``, else on for ``spot`` and
        ``on-demand`` capacity and off for ``reserved``; not built on compute-engine (False:
        ``delete_on_complete.sh`` deletes a queued resource, and ``multislice:queuedResource`` is
        refused there)."""
        return self.backend_spec.delete_on_complete(self)

    @property
    def deprecation_warnings(self) -> list[WarningText]:
        """Deprecated keys the stack uses, each with its replacement, and keys this release reads but
        does not act on yet (``pulumi preview`` and the ``multislice`` commands that load the stack
        print each)."""
        warnings: list[WarningText] = []
        if self.queued_resource.delete_on_complete_former_key is not None:
            warnings.append(
                act(
                    f"multislice:queuedResource.{FORMER_DELETE_ON_COMPLETE_KEY} is deprecated "
                    "(multislice:queuedResource.deleteOnComplete has the same meaning)",
                    "rename it to multislice:queuedResource.deleteOnComplete",
                )
            )
        return warnings

    @property
    def total_steps(self) -> int:
        """The run's steps: ``multislice:workload.steps`` for a command, else ``training.steps``."""
        return self.workload.steps if self.workload is not None else self.training.steps

    @property
    def effective_runtime_version(self) -> str:
        """``multislice:runtimeVersion``, else the generation's default: the queued resource's
        TPU software version.

        Raises:
            ValueError: the generation has none (TPU7x: the Cloud TPU API does not offer it, and a
                compute-engine stack has no runtime version; ``_consistent`` refuses such a stack
                on the queued-resource backend).
        """
        version = self.runtime_version or self.accelerator.generation.default_runtime_version
        if version is None:
            raise ValueError(f"{self.accelerator_type} has no TPU software version (not on the Cloud TPU API)")
        return version

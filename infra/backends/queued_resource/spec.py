"""The queued-resource backend's spec: ``multislice:queuedResource`` and what the Cloud TPU API offers.

* capacity: the ``tpu_v2`` QueuedResource can request ``spot``, ``guaranteed`` (on-demand) and
  ``reservation_name`` (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources);
  flex-start is not among its fields (the v2alpha1 API's preview only);
* zones and runtime versions: the catalog's ``Generation.zones`` and ``runtime_versions``
  (Cloud TPU's regions-zones and runtimes pages);
* the VM: Cloud TPU sets ``agent-worker-number``, ``worker-network-endpoints`` and ``tpu-env`` on
  every VM of a queued resource (JAX's ``cloud_tpu_cluster.py`` reads the same keys), which
  ``boot_identity.sh`` reads; a ``ResetQueuedResource`` reboots every VM into the current
  startup script, so no release watch; lines go to the ``tpu_worker`` resource
  (https://cloud.google.com/logging/docs/api/v2/resource-list).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from infra.accelerators import Generation
from infra.backends.spec import BackendSpec
from infra.durations import Duration, format_duration
from training.validation import ConfigBool, StrictModel, invalid

#: The key ``multislice:queuedResource.deleteOnComplete`` had before "release" came to mean a
#: software release only; read as its deprecated alias.
FORMER_DELETE_ON_COMPLETE_KEY = "releaseOnComplete"
#: The longest ``createTimeout`` and ``deleteTimeout``, seconds: seven days. They bound a wait of
#: ``pulumi up`` (or ``destroy``) itself, which holds the stack's update the whole time; a queued
#: resource not yet in ``waitFor``'s state when the wait ends stays recorded and queued, and the next
#: ``pulumi up`` waits again (docs/deploying.md), so a longer wait buys nothing. Seven days is also the
#: longest run Google gives any TPU capacity with a run limit (flex-start: "up to seven days",
#: https://cloud.google.com/compute/docs/instances/about-flex-start-vms). ``validUntil``, which the
#: Cloud TPU API takes (``QueueingPolicy.validUntilDuration``, no maximum documented there), keeps
#: the largest protobuf Duration (:data:`infra.durations.MAX_DURATION_S`).
MAX_WAIT_S = 7 * 24 * 3600


class QueuedResourceSettings(StrictModel):
    """``multislice:queuedResource``: how the queued resource is requested and waited for (keys by their
    stack-file names only: a snake_case spelling is an unknown key that names the camelCase one)."""

    #: States in the order a queued resource passes them (tpu_v2 QueuedResourceState).
    wait_for: Literal["ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"] = Field(
        default="ACTIVE",
        alias="waitFor",
        description="`pulumi up` returns once the QR reached this state or a later one.",
    )
    create_timeout: Duration = Field(
        default=1800,
        alias="createTimeout",
        description="Longest wait for waitFor (≤ 7d); past it the QR stays recorded, still queued.",
    )
    delete_timeout: Duration = Field(
        default=1200, alias="deleteTimeout", description="Longest wait for a delete (2–5 min typical; ≤ 7d)."
    )
    valid_until: Duration | None = Field(
        default=None,
        alias="validUntil",
        description="Queueing policy valid_until_duration: the API fails the request after it.",
    )
    #: None: on for spot and on-demand capacity, off for reserved (``StackConfig.delete_on_complete``).
    delete_on_complete: ConfigBool | None = Field(
        default=None,
        alias="deleteOnComplete",
        description="Worker 0 of slice 0 deletes the queued resource once the run is COMPLETE (docs/deploying.md).",
    )
    #: The former spelling of ``deleteOnComplete`` (same meaning), still read: a stack that
    #: uses it gets a warning naming the new key (``StackConfig.deprecation_warnings``).
    delete_on_complete_former_key: ConfigBool | None = Field(
        default=None,
        alias=FORMER_DELETE_ON_COMPLETE_KEY,
        description="Deprecated spelling of deleteOnComplete.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> QueuedResourceSettings:
        for key, seconds in (("createTimeout", self.create_timeout), ("deleteTimeout", self.delete_timeout)):
            if seconds > MAX_WAIT_S:
                raise invalid(
                    key,
                    f"{format_duration(seconds)} is longer than 7d ({MAX_WAIT_S} s): pulumi up holds the stack's "
                    "update while it waits, and a queued resource still waiting stays queued for the next pulumi "
                    "up to wait again",
                )
        if self.valid_until is not None and self.valid_until < 600:
            raise invalid("validUntil", f"{self.valid_until}s is shorter than 10 minutes; allow the queue time to work")
        if self.delete_on_complete is not None and self.delete_on_complete_former_key is not None:
            raise invalid(
                FORMER_DELETE_ON_COMPLETE_KEY,
                f"the deprecated spelling of deleteOnComplete; both {FORMER_DELETE_ON_COMPLETE_KEY} and "
                f"deleteOnComplete are set: keep only deleteOnComplete",
            )
        return self


class QueuedResourceSpec(BackendSpec):
    """``multislice:backend: queued-resource`` (the default)."""

    name = "queued-resource"
    summary = "Cloud TPU API"
    settings_key = "multislice:queuedResource"
    settings_field = "queued_resource"
    settings_model = QueuedResourceSettings
    capacities = ("spot", "on-demand", "reserved")
    capacity_source = "tpu_v2 API"
    service = "Cloud TPU"
    sole_offer_reason = "Compute Engine offers TPU7x, v6e and v5p"
    has_runtime_version = True
    capacity_noun = "queued resource"
    #: The Cloud TPU API serves queued resources (https://cloud.google.com/tpu/docs/queued-resources).
    apis = ("tpu.googleapis.com",)
    legacy_output = "queuedResourceName"
    boot_identity = "boot_identity.sh"
    identity_source = "metadata"
    log_resource = "tpu_worker"
    #: ``QueuedResource.reservationName``: "Format: projects/{project}/locations/{zone}/reservations/{reservation}".
    reservation_forms = ("tpu",)

    def zones(self, gen: Generation) -> tuple[tuple[str, ...], str]:
        return gen.zones, gen.sources["zones"]

    def refuse_settings(self, changed: list[str], backend: str) -> Exception:
        return invalid(
            self.settings_key,
            f"configures the queued resource of the queued-resource backend ({', '.join(changed)}); this stack's "
            f"multislice:backend is {backend}: remove it (deleteOnComplete is not built on {backend})",
        )

    def describe_deployment(self, outputs: Mapping[str, Any]) -> str:
        name = outputs.get(self.legacy_output or "") or "(unnamed)"
        return f"the queued resource {name} and its slices' TPU VMs"

    def delete_on_complete(self, config: Any) -> bool:
        """``multislice:queuedResource.deleteOnComplete``, else on for ``spot`` and ``on-demand``
        capacity (billed while it exists) and off for ``reserved`` (the reservation is paid for
        whether or not a queued resource holds it)."""
        settings: QueuedResourceSettings = config.queued_resource
        for value in (settings.delete_on_complete, settings.delete_on_complete_former_key):
            if value is not None:
                return value
        return config.capacity != "reserved"

    def capacity_plan(self, config: Any) -> str | None:
        """The capacity mode and what it costs: whose VMs, whether they can be preempted, and
        until when they are billed (deleteOnComplete, :meth:`delete_on_complete`)."""
        vms = {
            "spot": "Spot VMs: Cloud TPU can preempt them at any time; the run then resumes from its newest checkpoint",
            "on-demand": "on-demand VMs",
            "reserved": f"VMs of reservation {config.reservation_name}" if config.reservation_name else "reserved VMs",
        }.get(config.capacity, f"{config.capacity} VMs")
        if self.delete_on_complete(config):
            kept = "worker 0 of slice 0 deletes the queued resource once the run is complete (deleteOnComplete), "
            kept += "which ends their billing; until then, or if the run never completes, until pulumi destroy"
        else:
            kept = "the queued resource is kept after the run (deleteOnComplete off)"
            kept += "; the reservation is paid for either way" if config.capacity == "reserved" else ""
            kept += "; billed until pulumi destroy" if config.capacity != "reserved" else ""
        return f"capacity: {config.capacity} ({vms}); {kept}"


SPEC = QueuedResourceSpec()

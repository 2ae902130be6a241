"""The capacity a run trains on (the queued resource's, or the instance groups', state and each
slice's state and health): the types every backend reports it in, part of the backends' seam.

* Deployed: each backend reads its own (:meth:`infra.backends.interface.Backend.capacity_source`:
  the queued resource through the Cloud TPU API, :mod:`infra.backends.queued_resource.capacity`;
  the instance groups through gcloud, :mod:`infra.backends.compute_engine.capacity`; the node pools
  through kubectl, :mod:`infra.backends.gke.capacity`), into the types of this module.
* Local: ``multislice status`` reads the emulator's state file into them
  (:func:`infra.status.capacity.read_local`).

A queued resource that is gone after its run completed is :data:`DELETED` (:func:`deleted`),
as the queued-resource provider treats it (``infra.backends.queued_resource.provider.completion``): deleted by
worker 0 of slice 0 (``multislice:queuedResource.deleteOnComplete``) or by hand. Deployed, the
TPU API no longer knows it and the run directory holds ``COMPLETE``; emulated, the emulation
recorded the delete (``infra.emulated.state.read_deletion``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from infra.backends.registry import DEFAULT as DEFAULT_BACKEND

#: The state of a queued resource gone after its run completed (not a TPU API state).
DELETED = "DELETED"


class QueuedResourceNotFound(LookupError):
    """The stack's queued resource does not exist (never deployed, or deleted)."""


class CapacityError(RuntimeError):
    """The capacity cannot be read (the API refused or did not answer, no usable credentials or
    tool); one line saying why, and the exit status ``multislice status`` ends with (2: bad
    input such as credentials; 1: an API that cannot be read)."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class InstanceStatus:
    """One VM of a compute-engine slice (:mod:`infra.backends.compute_engine.capacity`): its name, its
    status (``RUNNING``, …; ``""`` before it exists) and its group's current action on it
    (``NONE``, ``CREATING``, …)."""

    name: str
    status: str
    action: str


@dataclass(frozen=True)
class SliceStatus:
    """One slice: its index, node id (on the compute-engine backend: its instance group),
    node state (e.g. ``READY``, ``PREEMPTED``; ``MISSING`` when the node does not exist) and
    health (``HEALTHY``, … or None when not reported), for an emulated or compute-engine slice
    how many of its VMs run, and for a compute-engine slice its VMs in worker order."""

    slice: int
    node: str
    state: str
    health: str | None = None
    vms_running: int | None = None
    vms: int | None = None
    instances: list[InstanceStatus] | None = None


@dataclass
class CapacityStatus:
    """The queued resource ``id`` and its ``state`` (a QR state, ``DELETED`` when it is gone
    after its run completed, or ``NOT_RUNNING`` for a local emulation that is not running),
    ``detail`` (the API's failure reason, or what the emulator left behind), and its slices.
    On the compute-engine ``backend`` (:mod:`infra.backends.compute_engine.capacity`) ``id`` is the
    stem of the slices' instance group names and ``state`` is ``READY`` or ``NOT_READY``."""

    id: str
    state: str
    emulated: bool = False
    detail: str | None = None
    slices: list[SliceStatus] = field(default_factory=list)
    backend: str = DEFAULT_BACKEND

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def deleted(qr_id: str, detail: str, emulated: bool = False) -> CapacityStatus:
    """The :data:`DELETED` queued resource ``qr_id`` (no slices: its nodes are deleted)."""
    return CapacityStatus(qr_id, DELETED, emulated=emulated, detail=detail)


def status_credentials(settings: Any, project: str, *, needed: bool) -> Any:
    """The credentials ``multislice status`` reads the stack with (``settings``:
    :class:`infra.credentials.CredentialSettings`): loaded when ``needed`` (a real API or bucket)
    or set explicitly, else None (anonymous, for loopback fakes).

    Raises:
      CapacityError: no usable credentials (exit status 2).
    """
    from infra import credentials as gcp

    problem = gcp.problem(settings, os.environ, require_credentials=needed)
    if problem:
        raise CapacityError(problem, 2)
    if not (needed or settings.explicit):
        return None
    try:
        return gcp.load(settings, quota_project=settings.quota_project(project))
    except gcp.CredentialsError as err:
        raise CapacityError(str(err), 2) from None

"""The capacity a run trains on: the queued resource's state and each slice's node state and
health.

* Deployed (:func:`read_cloud`): ``GET queuedResources/<id>`` and ``GET nodes`` (one request per
  page of the zone's nodes) of the Cloud TPU API v2 over REST
  (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/get,
  https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/list), at Google's
  endpoint or ``MULTISLICE_TPU_API_ENDPOINT`` as the queued-resource provider reads it (a
  plain-http endpoint must be loopback: a local fake; it is called anonymously unless
  credentials are given). QR states:
  https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources#state;
  node states and health: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes#state.
  The provider uses google-cloud-tpu's ``tpu_v2`` client (typed requests, long-running
  operations); this command needs two GETs, and importing ``tpu_v2`` alone costs about a
  second of CPU (its protobuf types, gRPC and aiohttp), half the command's 2-second budget, so
  it sends them with google-auth's ``AuthorizedSession`` (``requests``).
* Local (:func:`read_local`): the emulator's state file (``infra.local.state``): ACTIVE while
  the emulator runs; a slice is READY while every process group of its emulated VMs lives.

A queued resource that is gone after its run completed is :data:`DELETED` (:func:`deleted`),
as the queued-resource provider treats it (``infra.queued_resource.completion``): deleted by
worker 0 of slice 0 (``multislice:queuedResource.deleteOnComplete``) or by hand. Deployed, the
TPU API no longer knows it and the run directory holds ``COMPLETE``; emulated, the emulation
recorded the delete (``infra.local.state.read_deletion``).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

from infra.startup.contract import DEFAULT_TPU_API_ENDPOINT, TPU_API_ENDPOINT_ENV

#: Hosts a plain-http TPU API endpoint may name (a local fake).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: Seconds one TPU API request may take.
REQUEST_TIMEOUT_S = 30.0
#: The environment variable naming another TPU API endpoint (as the provider reads it).
ENDPOINT_ENV = TPU_API_ENDPOINT_ENV
#: The state of a queued resource gone after its run completed (not a TPU API state).
DELETED = "DELETED"


class QueuedResourceNotFound(LookupError):
    """The stack's queued resource does not exist (never deployed, or deleted)."""


class CapacityError(RuntimeError):
    """The TPU API refused or did not answer; one line saying why."""


@dataclass(frozen=True)
class InstanceStatus:
    """One VM of a compute-engine slice (:mod:`infra.status.instance_groups`): its name, its
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
    On the compute-engine ``backend`` (:mod:`infra.status.instance_groups`) ``id`` is the
    stem of the slices' instance group names and ``state`` is ``READY`` or ``NOT_READY``."""

    id: str
    state: str
    emulated: bool = False
    detail: str | None = None
    slices: list[SliceStatus] = field(default_factory=list)
    backend: str = "queued-resource"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def endpoint() -> str | None:
    """The TPU API endpoint: ``$MULTISLICE_TPU_API_ENDPOINT`` or None (Google's)."""
    return os.environ.get(ENDPOINT_ENV) or None


def is_local_endpoint(url: str | None) -> bool:
    """Whether ``url`` is a plain-http endpoint (a local fake, which must be loopback)."""
    return bool(url) and urlsplit(url).scheme == "http"


#: Google's Cloud TPU API.
GOOGLE_TPU = DEFAULT_TPU_API_ENDPOINT


def tpu_session(url: str | None, credentials: Any = None) -> tuple[str, Any]:
    """The API's base URL (Google's, or ``url``) and a ``requests`` session for it: google-auth's
    ``AuthorizedSession`` with ``credentials``, or a plain session (anonymous) for a loopback
    fake without credentials.

    Raises:
      CapacityError: a plain-http endpoint that is not a loopback address, or no credentials
        for Google's endpoint.
    """
    import requests

    base = GOOGLE_TPU
    if url:
        parts = urlsplit(url if "://" in url else f"https://{url}")
        if parts.scheme == "http" and parts.hostname not in LOOPBACK_HOSTS:
            raise CapacityError(f"{ENDPOINT_ENV}={url}: a plain-http TPU API endpoint must be a loopback address")
        base = f"{parts.scheme}://{parts.netloc}"
    if credentials is None:
        if not is_local_endpoint(base):
            raise CapacityError(f"no credentials for the Cloud TPU API at {base}")
        return base, requests.Session()
    from google.auth.transport.requests import AuthorizedSession

    return base, AuthorizedSession(credentials)


def _get(session: Any, url: str, params: dict[str, Any] | None, qr_id: str) -> dict[str, Any] | None:
    """The JSON of ``GET url`` (None on 404).

    Raises:
      CapacityError: any other error, in one line.
    """
    try:
        response = session.get(url, params=params, timeout=REQUEST_TIMEOUT_S)
    except Exception as err:  # requests and google-auth errors (network, token refresh)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CapacityError(f"cannot reach the Cloud TPU API for queued resource {qr_id!r}: {first}") from None
    if response.status_code == 404:
        return None
    if response.status_code >= 400:
        try:
            error = response.json()["error"]
            message = f"{error.get('status') or response.status_code} {error.get('message', '')}".strip()
        except (ValueError, KeyError, TypeError):
            message = f"HTTP {response.status_code} {response.text[:200].strip()}"
        raise CapacityError(f"the Cloud TPU API refused to read queued resource {qr_id!r}: {message}")
    return response.json()


def read_cloud(session: Any, base: str, project: str, zone: str, qr_id: str, node_ids: list[str]) -> CapacityStatus:
    """The deployed queued resource ``qr_id`` and its nodes ``node_ids`` (see :func:`tpu_session`).

    Raises:
      QueuedResourceNotFound: no such queued resource.
      CapacityError: any other API error (permission, API disabled, network), in one line.
    """
    parent = f"projects/{project}/locations/{zone}"
    qr = _get(session, f"{base}/v2/{parent}/queuedResources/{quote(qr_id, safe='')}", None, qr_id)
    if qr is None:
        raise QueuedResourceNotFound(f"queued resource {qr_id!r} not found in {parent}")
    wanted, nodes, params = set(node_ids), {}, {"pageSize": 1000}
    while True:
        page = _get(session, f"{base}/v2/{parent}/nodes", params, qr_id) or {}
        for node in page.get("nodes", []):
            node_id = str(node.get("name", "")).rsplit("/", 1)[-1]
            if node_id in wanted:
                nodes[node_id] = node
        if not page.get("nextPageToken"):
            break
        params = {**params, "pageToken": page["nextPageToken"]}
    state = (qr.get("state") or {}).get("state", "STATE_UNSPECIFIED")
    detail = ((qr.get("state") or {}).get("failedData") or {}).get("error", {}).get("message") or None
    slices = []
    for index, node_id in enumerate(node_ids):
        node = nodes.get(node_id)
        if node is None:
            slices.append(SliceStatus(index, node_id, "MISSING"))
        else:
            health = node.get("health")
            slices.append(
                SliceStatus(
                    index,
                    node_id,
                    node.get("state", "STATE_UNSPECIFIED"),
                    None if health in (None, "HEALTH_UNSPECIFIED") else health,
                )
            )
    return CapacityStatus(qr_id, state, detail=detail, slices=slices)


def deleted(qr_id: str, detail: str, emulated: bool = False) -> CapacityStatus:
    """The :data:`DELETED` queued resource ``qr_id`` (no slices: its nodes are deleted)."""
    return CapacityStatus(qr_id, DELETED, emulated=emulated, detail=detail)


def read_local(paths: Any, qr_id: str, node_ids: list[str], workers_per_slice: int) -> CapacityStatus:
    """The emulated queued resource of a stack whose emulation keeps its state in ``paths``
    (``infra.local.state.LocalPaths``): ACTIVE while the emulator runs, else DELETED when its
    VMs deleted it once the run completed, else NOT_RUNNING."""
    from infra.local import state as local_state

    state = local_state.read_state(paths)
    running = bool(state and local_state.emulator_alive(state))
    if not running:
        orphans = local_state.find_processes(state["emulation_id"]) if state and state.get("emulation_id") else []
        record = local_state.read_deletion(paths)
        if record is not None and not orphans:
            from infra.clock import clock

            when = record.get("deleted_at")
            at = f" at {clock(when)}" if isinstance(when, (int, float)) else ""
            return deleted(
                qr_id,
                f"deleted by worker 0 of slice 0{at} once the run was complete (deleteOnComplete)",
                emulated=True,
            )
        detail = None
        if orphans:
            assert state is not None  # the orphans carry its emulation id
            detail = (
                f"the emulator is gone but {len(orphans)} emulated process(es) still run; "
                f"stop them with: multislice local down --stack {state.get('stack')}"
            )
        return CapacityStatus(qr_id, "NOT_RUNNING", emulated=True, detail=detail)
    assert state is not None  # running
    vms = state.get("vms") or []
    slices = []
    for index, node_id in enumerate(node_ids):
        groups = [int(vm["pgid"]) for vm in vms if vm.get("slice") == index and vm.get("pgid")]
        alive = sum(_group_alive(pgid) for pgid in groups)
        slices.append(
            SliceStatus(
                index,
                node_id,
                "READY" if groups and alive == workers_per_slice else "REPAIRING",
                None,
                alive,
                workers_per_slice,
            )
        )
    return CapacityStatus(qr_id, "ACTIVE", emulated=True, detail=f"emulator pid {state['pid']}", slices=slices)


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a process (signal 0: nothing is sent)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True

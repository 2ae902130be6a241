"""The capacity a run trains on: the queued resource's state and each slice's node state and
health.

* Deployed (:func:`read_cloud`): ``GetQueuedResource`` and one ``ListNodes`` per page of the
  zone's nodes through google-cloud-tpu's ``tpu_v2.TpuClient`` (REST), at the public endpoint or
  ``MULTISLICE_TPU_API_ENDPOINT`` as the queued-resource provider uses it (a plain-http
  endpoint must be loopback: a local fake; it gets anonymous credentials unless some are
  given). QR states:
  https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources#state;
  node states and health:
  https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes#state.
* Local (:func:`read_local`): the emulator's state file (``infra.local.state``): ACTIVE while
  the emulator runs; a slice is READY while every process group of its emulated VMs lives.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import urlsplit

#: Hosts a plain-http TPU API endpoint may name (a local fake).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: Seconds one TPU API request may take.
REQUEST_TIMEOUT_S = 30.0
#: The environment variable naming another TPU API endpoint (as the provider reads it).
ENDPOINT_ENV = "MULTISLICE_TPU_API_ENDPOINT"


class QueuedResourceNotFound(LookupError):
    """The stack's queued resource does not exist (never deployed, or deleted)."""


class CapacityError(RuntimeError):
    """The TPU API refused or did not answer; one line saying why."""


@dataclass(frozen=True)
class SliceStatus:
    """One slice: its index, node id, node state (e.g. ``READY``, ``PREEMPTED``; ``MISSING``
    when the node does not exist) and health (``HEALTHY``, … or None when not reported), and
    for an emulated slice how many of its VMs run."""

    slice: int
    node: str
    state: str
    health: str | None = None
    vms_running: int | None = None
    vms: int | None = None


@dataclass
class CapacityStatus:
    """The queued resource ``id`` and its ``state`` (a QR state, or ``NOT_RUNNING`` for a
    local emulation that is not running), ``detail`` (the API's failure reason, or what the
    emulator left behind), and its slices."""

    id: str
    state: str
    emulated: bool = False
    detail: str | None = None
    slices: list[SliceStatus] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def endpoint() -> str | None:
    """The TPU API endpoint: ``$MULTISLICE_TPU_API_ENDPOINT`` or None (Google's)."""
    return os.environ.get(ENDPOINT_ENV) or None


def is_local_endpoint(url: str | None) -> bool:
    """Whether ``url`` is a plain-http endpoint (a local fake, which must be loopback)."""
    return bool(url) and urlsplit(url).scheme == "http"


def tpu_client(url: str | None, credentials: Any = None) -> Any:
    """A REST ``tpu_v2.TpuClient`` at Google's endpoint or ``url`` (the same rules as the
    provider's ``infra.queued_resource.api.TpuApi.client_for``, without importing Pulumi).

    Raises:
      CapacityError: a plain-http endpoint that is not a loopback address.
    """
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import tpu_v2

    if not url:
        return tpu_v2.TpuClient(transport="rest", credentials=credentials)
    parts = urlsplit(url if "://" in url else f"https://{url}")
    if parts.scheme == "http":
        if parts.hostname not in LOOPBACK_HOSTS:
            raise CapacityError(f"{ENDPOINT_ENV}={url}: a plain-http TPU API endpoint must be a loopback address")
        credentials = credentials if credentials is not None else AnonymousCredentials()
    return tpu_v2.TpuClient(transport="rest", credentials=credentials, client_options=ClientOptions(api_endpoint=url))


def read_cloud(client: Any, project: str, zone: str, qr_id: str, node_ids: list[str]) -> CapacityStatus:
    """The deployed queued resource ``qr_id`` and its nodes ``node_ids``.

    Raises:
      QueuedResourceNotFound: no such queued resource.
      CapacityError: any other API error (permission, API disabled, network), in one line.
    """
    from google.api_core import exceptions
    from google.cloud import tpu_v2

    parent = f"projects/{project}/locations/{zone}"
    try:
        qr = client.get_queued_resource(name=f"{parent}/queuedResources/{qr_id}", timeout=REQUEST_TIMEOUT_S)
        wanted = set(node_ids)
        nodes = {}
        for node in client.list_nodes(request=tpu_v2.ListNodesRequest(parent=parent), timeout=REQUEST_TIMEOUT_S):
            node_id = node.name.rsplit("/", 1)[-1]
            if node_id in wanted:
                nodes[node_id] = node
    except exceptions.NotFound:
        raise QueuedResourceNotFound(f"queued resource {qr_id!r} not found in {parent}") from None
    except exceptions.GoogleAPICallError as err:
        raise CapacityError(f"the Cloud TPU API refused to read queued resource {qr_id!r} in {parent}: {err.code} {err.message}") from None
    except Exception as err:  # transport and credential errors (google.auth, requests)
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise CapacityError(f"cannot reach the Cloud TPU API for queued resource {qr_id!r}: {first}") from None
    state = qr.state.state.name
    detail = None
    if "failed_data" in qr.state and qr.state.failed_data.error.message:
        detail = qr.state.failed_data.error.message
    slices = []
    for index, node_id in enumerate(node_ids):
        node = nodes.get(node_id)
        if node is None:
            slices.append(SliceStatus(index, node_id, "MISSING"))
        else:
            health = node.health.name if node.health else None
            slices.append(SliceStatus(index, node_id, node.state.name, None if health == "HEALTH_UNSPECIFIED" else health))
    return CapacityStatus(qr_id, state, detail=detail, slices=slices)


def read_local(paths: Any, qr_id: str, node_ids: list[str], workers_per_slice: int) -> CapacityStatus:
    """The emulated queued resource of a stack whose emulation keeps its state in ``paths``
    (``infra.local.state.LocalPaths``)."""
    from infra.local import state as local_state

    state = local_state.read_state(paths)
    running = bool(state and local_state.emulator_alive(state))
    if not running:
        orphans = local_state.find_processes(state["emulation_id"]) if state and state.get("emulation_id") else []
        detail = (
            f"the emulator is gone but {len(orphans)} emulated process(es) still run; "
            f"stop them with: multislice local down --stack {state.get('stack')}"
            if orphans
            else None
        )
        return CapacityStatus(qr_id, "NOT_RUNNING", emulated=True, detail=detail)
    vms = state.get("vms") or []
    slices = []
    for index, node_id in enumerate(node_ids):
        groups = [int(vm["pgid"]) for vm in vms if vm.get("slice") == index and vm.get("pgid")]
        alive = sum(_group_alive(pgid) for pgid in groups)
        slices.append(
            SliceStatus(index, node_id, "READY" if groups and alive == workers_per_slice else "REPAIRING", None, alive, workers_per_slice)
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

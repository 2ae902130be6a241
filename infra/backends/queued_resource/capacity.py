"""The queued resource's capacity as ``multislice status`` reads it: the Cloud TPU API v2 over REST.

``GET queuedResources/<id>`` and ``GET nodes`` (one request per page of the zone's nodes)
(https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/get,
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/list), at Google's
endpoint or ``MULTISLICE_TPU_API_ENDPOINT`` as the queued-resource provider reads it (a plain-http
endpoint must be loopback: a local fake; it is called anonymously unless credentials are given).
QR states: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources#state;
node states and health: https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes#state.
The provider uses google-cloud-tpu's ``tpu_v2`` client (typed requests, long-running operations);
this command needs two GETs, and importing ``tpu_v2`` alone costs about a second of CPU (its
protobuf types, gRPC and aiohttp), half the command's 2-second budget, so it sends them with
google-auth's ``AuthorizedSession`` (``requests``).
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import quote, urlsplit

from infra.backends.capacity import CapacityError, CapacityStatus, QueuedResourceNotFound, SliceStatus
from infra.vm_contract import DEFAULT_TPU_API_ENDPOINT, TPU_API_ENDPOINT_ENV

#: Hosts a plain-http TPU API endpoint may name (a local fake).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: Seconds one TPU API request may take.
REQUEST_TIMEOUT_S = 30.0
#: The environment variable naming another TPU API endpoint (as the provider reads it).
ENDPOINT_ENV = TPU_API_ENDPOINT_ENV


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

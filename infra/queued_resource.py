"""The Multislice queued resource: a Pulumi dynamic provider over google-cloud-tpu ``tpu_v2``.

Why a dynamic provider: pulumi-gcp's ``gcp.tpu.V2QueuedResource`` has no multislice node
count, no metadata (startup script), no tags and no spot/reserved capacity (DESIGN.md).

Pickling contract (DESIGN.md, "Pulumi"): Pulumi pickles the provider with dill *by module
reference*, so :class:`QueuedResourceProvider` must stay importable as
``infra.queued_resource.QueuedResourceProvider`` forever (renaming it breaks update/delete of
existing stacks). It holds only plain values; the ``TpuClient`` and every google import are
created inside the methods. Bump :data:`PROVIDER_VERSION` when the provider's semantics change
(it is an input, so the change shows in ``pulumi preview``).

Lifecycle (resource type ``pulumi-python:dynamic/tpu:QueuedResource``):

* **create** – one ``CreateQueuedResource`` (a QR with this id that carries this stack's
  labels and shape, left by an interrupted earlier run, is adopted and converged instead) (``multislice_params`` for slices > 1, ``node_id``
  for one slice; external IPs off; our tags, service account, labels and metadata; spot tier,
  reservation or on-demand; ``valid_until_duration``), then a bounded wait, printing progress,
  until the QR reaches ``waitFor`` (default ACTIVE) or a later state.

  - FAILED / SUSPENDING / SUSPENDED: the QR is force-deleted (it holds QR quota, and a FAILED QR
    can hold ACTIVE slices) and the error lists every node's state and the API's reason.
  - the wait times out (typically WAITING_FOR_RESOURCES): create *succeeds* with
    ``ready: false`` so the QR is recorded in the stack (never an orphan); the program then
    fails the update with a message saying so (``infra/__main__.py``), and the next
    ``pulumi up`` resumes waiting.
* **diff** – replace (delete first: the ids are fixed) on accelerator type, slice count,
  runtime version, capacity, reservation, network, subnetwork, service account or zone; update
  in place when only metadata, labels or tags change (and the structured trainer config and
  hashes that describe the metadata); an update is also due when the recorded state is not
  ready or the nodes are out of sync. A recorded FAILED/SUSPENDED state (after a refresh)
  means replace.
* **update** – ``UpdateNode`` on every node (metadata merged so keys others set, such as
  ``ssh-keys``, survive), then ``ResetQueuedResource`` when metadata changed, so every VM
  re-runs the new startup script; no capacity is given up.
* **read** – live state for ``pulumi refresh``: QR state, node names, each node's state and
  health, whether the nodes carry the recorded metadata/labels/tags.
* **delete** – force delete, then wait until the QR is gone (bounded).

Errors: HTTP 429 (rate limits) and 5xx are retried with exponential backoff by
``google.api_core.retry.Retry``; allocation-quota (429 with a QuotaFailure) and permission
(403) errors are not retried and become one message saying what to fix.

Credentials: Application Default Credentials (``gcloud auth application-default login`` or
``GOOGLE_APPLICATION_CREDENTIALS``); the gcp provider's ``gcp:credentials`` key is not read here.

Tuning (tests make these small): constructor arguments, else the environment variables
``MULTISLICE_TPU_API_ENDPOINT`` (e.g. ``http://127.0.0.1:PORT``: a plain-http endpoint must
be loopback and gets anonymous credentials), ``MULTISLICE_TPU_POLL_SECONDS`` (first poll
interval, default 10; it grows ×1.5 to ``MULTISLICE_TPU_MAX_POLL_SECONDS``, default 60),
``MULTISLICE_TPU_RETRY_INITIAL_SECONDS`` (default 1) and ``MULTISLICE_TPU_RETRY_DEADLINE_SECONDS``
(default 300).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import urlsplit

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

if TYPE_CHECKING:  # pragma: no cover
    from google.cloud import tpu_v2

    from infra.config import StackConfig
    from infra.startup import RenderedScript

#: Bump when create/diff/update/delete semantics change (an input: shows in previews).
PROVIDER_VERSION = "1"

#: Metadata keys on every node (the startup script reads the run dir from the second).
STARTUP_SCRIPT_KEY = "startup-script"
RUN_DIR_KEY = "multislice-run-dir"

#: OAuth scope of the VMs: access is governed by the service account's IAM roles
#: (https://cloud.google.com/compute/docs/access/service-accounts#accesscopesiam).
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"

#: Capacity types the tpu_v2 API can express (best-effort exists only in v2alpha1).
API_CAPACITY = ("spot", "on-demand", "reserved")

#: The order a queued resource passes on its way to ACTIVE (tpu_v2 QueuedResourceState).
STATE_ORDER = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE")
#: States from which a queued resource never becomes ACTIVE again.
FAILED_STATES = ("FAILED", "SUSPENDING", "SUSPENDED")

#: Input keys whose change means delete + create (QRs are immutable; node fields outside
#: UpdateNode's mask cannot change in place).
REPLACE_KEYS = (
    "project",
    "zone",
    "queuedResourceId",
    "nodeId",
    "nodeIdPrefix",
    "acceleratorType",
    "runtimeVersion",
    "slices",
    "capacity",
    "reservationName",
    "network",
    "subnetwork",
    "serviceAccount",
)
#: Input keys UpdateNode changes in place (its update_mask: description, tags, labels,
#: metadata, network_config.enable_external_ips).
NODE_KEYS = ("metadata", "labels", "tags")
#: Input keys that describe the metadata for readable diffs; they change with it.
DESCRIPTIVE_KEYS = ("trainer", "runDir", "bundleSha256", "startupScriptSha256", "requirementsSha256", "startupScriptBytes")
#: Input keys that only steer the provider (no API call when they change alone).
#: ``validUntilSeconds`` (the queueing deadline) only matters while a QR waits in the queue:
#: a change is recorded and used by the next create, never a reason to give up capacity.
BEHAVIOUR_KEYS = ("waitFor", "createTimeoutSeconds", "deleteTimeoutSeconds", "validUntilSeconds", "version")
INPUT_KEYS = REPLACE_KEYS + NODE_KEYS + DESCRIPTIVE_KEYS + BEHAVIOUR_KEYS
#: Output-only keys.
OUTPUT_KEYS = ("queuedResourceName", "state", "ready", "statusMessage", "nodeNames", "nodes", "nodesInSync", "pendingNodeSync")

#: Value Pulumi passes for a not-yet-known input during preview (pulumi.runtime.rpc.UNKNOWN).
_UNKNOWN = "04da6b54-80e4-46f7-96ec-b56ff0331ba9"


class QueuedResourceError(RuntimeError):
    """The queued resource could not be converged; the message says why and what to do."""


class QueuedResourceFailed(QueuedResourceError):
    """The queued resource went FAILED or SUSPENDED."""


class QuotaOrPermissionError(QueuedResourceError):
    """The API refused for quota or permission reasons (not retried)."""


# Inputs (built by the program) ------------------------------------------------------------


def reservation_path(config: StackConfig) -> str | None:
    """The QR's ``reservation_name`` for ``capacity: reserved``.

    A short name becomes ``projects/<project>/locations/<zone>/reservations/<name>``; without
    a name it is ``.../reservations/-`` (any reservation of the project in the zone), as
    ``gcloud compute tpus queued-resources create --reserved`` sends it (gcloud's
    ``queued_resource_util.CreateReservationName``).
    """
    if config.capacity != "reserved":
        return None
    name = config.reservation_name or "-"
    if "/" in name:
        return name
    return f"projects/{config.project}/locations/{config.zone}/reservations/{name}"


def check_provisionable(config: StackConfig) -> None:
    """Reject stacks the tpu_v2 API cannot provision, naming the key, before any API call.

    Raises:
      infra.config.StackConfigError
    """
    from infra.config import StackConfigError

    if config.capacity not in API_CAPACITY:
        raise StackConfigError(
            f"stack {config.stack!r} cannot be provisioned:",
            [
                f"multislice:capacity: {config.capacity!r} needs the TPU v2alpha1 API, which this program "
                f"does not use; allowed: {', '.join(API_CAPACITY)}"
            ],
        )


def queued_resource_props(
    config: StackConfig,
    script: RenderedScript,
    *,
    network: pulumi.Input[str],
    subnetwork: pulumi.Input[str],
    service_account: pulumi.Input[str],
    tags: pulumi.Input[list[str]],
) -> dict[str, Any]:
    """The QR's inputs for a stack (camelCase engine names; some values may be Outputs).

    ``metadata`` holds the startup script and the run directory; ``trainer`` (the TrainConfig
    as a plain object) and the sha256 values describe the script so ``pulumi preview --diff``
    shows which key changed while the script's own diff is hidden. Pure: equal configs give
    equal dicts.
    """
    check_provisionable(config)
    props: dict[str, Any] = {
        "project": config.project,
        "zone": config.zone,
        "queuedResourceId": config.queued_resource_id,
        "acceleratorType": config.accelerator_type,
        "runtimeVersion": config.effective_runtime_version,
        "slices": config.slices,
        "capacity": config.capacity,
        "network": network,
        "subnetwork": subnetwork,
        "serviceAccount": service_account,
        "tags": tags,
        "labels": dict(sorted(config.resource_labels.items())),
        "metadata": {STARTUP_SCRIPT_KEY: script.text, RUN_DIR_KEY: config.run_dir},
        # None values are dropped: the engine stores no nulls, so previews compare like with like.
        "trainer": config.training.model_dump(mode="json", exclude_none=True),
        "runDir": config.run_dir,
        "bundleSha256": script.bundle_sha256,
        "startupScriptSha256": script.sha256,
        "requirementsSha256": script.requirements_sha256,
        "startupScriptBytes": script.size_bytes,
        "waitFor": config.queued_resource.wait_for,
        "createTimeoutSeconds": config.queued_resource.create_timeout,
        "deleteTimeoutSeconds": config.queued_resource.delete_timeout,
        "version": PROVIDER_VERSION,
    }
    if config.slices > 1:
        props["nodeIdPrefix"] = config.queued_resource_id
    else:
        props["nodeId"] = config.queued_resource_id
    if (reservation := reservation_path(config)) is not None:
        props["reservationName"] = reservation
    if config.queued_resource.valid_until is not None:
        props["validUntilSeconds"] = config.queued_resource.valid_until
    return props


def node_ids(props: dict[str, Any]) -> list[str]:
    """Node ids the QR of ``props`` creates: ``<prefix>-0…`` (slices > 1) or ``nodeId``."""
    if props.get("nodeIdPrefix"):
        return [f"{props['nodeIdPrefix']}-{i}" for i in range(int(props["slices"]))]
    return [props.get("nodeId") or props["queuedResourceId"]]


def parent_of(props: dict[str, Any]) -> str:
    return f"projects/{props['project']}/locations/{props['zone']}"


def qr_name_of(props: dict[str, Any]) -> str:
    return f"{parent_of(props)}/queuedResources/{props['queuedResourceId']}"


def build_queued_resource(props: dict[str, Any]) -> tpu_v2.QueuedResource:
    """The ``tpu_v2.QueuedResource`` message for ``props`` (see :func:`queued_resource_props`)."""
    from google.cloud import tpu_v2
    from google.protobuf import duration_pb2

    node = tpu_v2.Node(
        accelerator_type=props["acceleratorType"],
        runtime_version=props["runtimeVersion"],
        network_config=tpu_v2.NetworkConfig(
            network=props["network"], subnetwork=props["subnetwork"], enable_external_ips=False
        ),
        service_account=tpu_v2.ServiceAccount(email=props["serviceAccount"], scope=[CLOUD_PLATFORM_SCOPE]),
        metadata=dict(props.get("metadata") or {}),
        labels=dict(props.get("labels") or {}),
        tags=list(props.get("tags") or []),
        description=f"multislice {props['queuedResourceId']} ({int(props['slices'])} x {props['acceleratorType']})",
    )
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(parent=parent_of(props), node=node)
    if props.get("nodeIdPrefix"):
        spec.multislice_params = tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=int(props["slices"]), node_id_prefix=props["nodeIdPrefix"]
        )
    else:
        spec.node_id = props.get("nodeId") or props["queuedResourceId"]
    qr = tpu_v2.QueuedResource(tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec]))
    capacity = props["capacity"]
    if capacity == "spot":
        qr.spot = tpu_v2.QueuedResource.Spot()
    elif capacity == "reserved":
        qr.reservation_name = props["reservationName"]
    if props.get("validUntilSeconds"):
        qr.queueing_policy = tpu_v2.QueuedResource.QueueingPolicy(
            valid_until_duration=duration_pb2.Duration(seconds=int(props["validUntilSeconds"]))
        )
    return qr


# Error classification --------------------------------------------------------------------


def _root(exc: BaseException) -> BaseException:
    from google.api_core import exceptions

    if isinstance(exc, exceptions.RetryError) and exc.cause is not None:
        return exc.cause
    return exc


def _details(exc: BaseException) -> list[dict[str, Any]]:
    return [d for d in (getattr(exc, "details", None) or []) if isinstance(d, dict)]


def _has_detail(exc: BaseException, type_name: str) -> bool:
    return any(str(d.get("@type", "")).endswith(type_name) for d in _details(exc))


def is_quota_exhausted(exc: BaseException) -> bool:
    """An allocation quota is used up (429/RESOURCE_EXHAUSTED that is not a request-rate limit)."""
    from google.api_core import exceptions

    if not isinstance(exc, (exceptions.TooManyRequests, exceptions.ResourceExhausted)):
        return False
    if getattr(exc, "reason", None) == "RATE_LIMIT_EXCEEDED":
        return False
    return _has_detail(exc, "google.rpc.QuotaFailure") or "quota" in str(getattr(exc, "message", exc)).lower()


def is_service_disabled(exc: BaseException) -> bool:
    """403 because the API is not (yet) enabled: enabling propagates within minutes."""
    from google.api_core import exceptions

    return isinstance(exc, exceptions.Forbidden) and getattr(exc, "reason", None) in (
        "SERVICE_DISABLED",
        "ACCESS_NOT_CONFIGURED",
    )


def is_retryable(exc: BaseException) -> bool:
    """Retry predicate: 429 request-rate limits, 5xx, transport errors, and a just-enabled API."""
    from google.api_core import exceptions
    from google.auth import exceptions as auth_exceptions
    from requests import exceptions as requests_exceptions

    if isinstance(exc, (exceptions.TooManyRequests, exceptions.ResourceExhausted)):
        return not is_quota_exhausted(exc)
    if isinstance(exc, (exceptions.InternalServerError, exceptions.BadGateway, exceptions.ServiceUnavailable, exceptions.GatewayTimeout)):
        return True
    if isinstance(exc, (requests_exceptions.ConnectionError, requests_exceptions.Timeout, auth_exceptions.TransportError)):
        return True
    return is_service_disabled(exc)


def is_new_service_account_race(exc: BaseException) -> bool:
    """400/404 naming the service account: IAM is eventually consistent, and the account was
    typically created moments before (pulumi-gcp's own TPU example waits 60 s after it)."""
    from google.api_core import exceptions

    message = str(getattr(exc, "message", exc)).lower()
    return isinstance(exc, (exceptions.BadRequest, exceptions.NotFound)) and "service account" in message


def explain(exc: BaseException, action: str, props: dict[str, Any]) -> QueuedResourceError:
    """One actionable error for an API failure of ``action`` on the QR of ``props``."""
    from google.api_core import exceptions

    exc = _root(exc)
    name = props.get("queuedResourceId", "?")
    project, zone = props.get("project", "?"), props.get("zone", "?")
    message = getattr(exc, "message", None) or str(exc)
    if is_quota_exhausted(exc):
        return QuotaOrPermissionError(
            f"{action} queued resource {name!r}: TPU quota exhausted in {zone} of project {project}: {message}\n"
            f"Fix: request more quota for {props.get('slices')} x {props.get('acceleratorType')} "
            f"({props.get('capacity')}) at https://console.cloud.google.com/iam-admin/quotas?project={project} "
            "(filter 'tpu'), or lower multislice:slices / change multislice:acceleratorType or multislice:capacity; "
            "then run `pulumi up` again."
        )
    if is_service_disabled(exc):
        return QuotaOrPermissionError(
            f"{action} queued resource {name!r}: the Cloud TPU API is not enabled in project {project}: {message}\n"
            "Fix: this program enables tpu.googleapis.com; if it was enabled moments ago wait a few minutes and "
            "run `pulumi up` again."
        )
    if isinstance(exc, (exceptions.PermissionDenied, exceptions.Forbidden, exceptions.Unauthorized)):
        return QuotaOrPermissionError(
            f"{action} queued resource {name!r}: permission denied in project {project}: {message}\n"
            "Fix: the identity running `pulumi up` needs roles/tpu.admin on the project and "
            f"roles/iam.serviceAccountUser on {props.get('serviceAccount', 'the TPU service account')} "
            "(`gcloud auth application-default login` for local credentials)."
        )
    if isinstance(exc, exceptions.Conflict):  # 409 ALREADY_EXISTS
        return QueuedResourceError(
            f"{action} queued resource {name!r}: one with this id already exists in {zone} but not in this stack: "
            f"{message}\nFix: delete it (`gcloud compute tpus queued-resources delete {name} --zone {zone} "
            f"--project {project} --force`) or import it, then run `pulumi up` again."
        )
    if isinstance(exc, exceptions.GoogleAPICallError):
        return QueuedResourceError(f"{action} queued resource {name!r}: {type(exc).__name__}: {message}")
    return QueuedResourceError(f"{action} queued resource {name!r}: {type(exc).__name__}: {exc}")


# The provider ------------------------------------------------------------------------------


@dataclass
class _Wait:
    """Result of waiting for a state."""

    qr: Any  # tpu_v2.QueuedResource | None
    state: str
    reached: bool
    failed: bool
    elapsed: float
    error: str = ""


def _state_name(qr: Any) -> str:
    return qr.state.state.name


def _reached(state: str, target: str) -> bool:
    return state in STATE_ORDER and STATE_ORDER.index(state) >= STATE_ORDER.index(target)


def _seconds(value: float) -> str:
    value = int(value)
    return f"{value // 60}m{value % 60:02d}s" if value >= 60 else f"{value}s"


def _differs(old: Any, new: Any) -> bool:
    if old == _UNKNOWN or new == _UNKNOWN:
        return True
    return json.dumps(old, sort_keys=True, default=str) != json.dumps(new, sort_keys=True, default=str)


@dataclass
class QueuedResourceProvider(ResourceProvider):
    """Dynamic provider of :class:`QueuedResource` (see the module docstring).

    All fields are optional plain values (pickled with the provider); ``None`` means "the
    environment variable, else the default". ``progress`` receives progress lines (default:
    stderr, which the Pulumi CLI shows for dynamic providers run with ``--logtostderr``/verbose
    and which is never relied on for correctness).
    """

    api_endpoint: str | None = None
    poll_seconds: float | None = None
    max_poll_seconds: float | None = None
    retry_initial_seconds: float | None = None
    retry_deadline_seconds: float | None = None
    progress: Callable[[str], None] | None = field(default=None, repr=False)

    serialize_as_secret_always = False  # nothing secret is captured

    # settings ---------------------------------------------------------------------------

    def _setting(self, value: float | None, env: str, default: float) -> float:
        if value is not None:
            return float(value)
        raw = os.environ.get(env)
        return float(raw) if raw else default

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)
        else:
            print(f"[multislice queued-resource] {message}", file=sys.stderr, flush=True)

    def _client(self) -> tpu_v2.TpuClient:
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import tpu_v2

        endpoint = self.api_endpoint or os.environ.get("MULTISLICE_TPU_API_ENDPOINT")
        if not endpoint:
            return tpu_v2.TpuClient(transport="rest")
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        credentials = None
        if parts.scheme == "http":
            if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
                raise QueuedResourceError(f"plain-http TPU API endpoint {endpoint!r} must be a loopback address")
            credentials = AnonymousCredentials()  # never send real tokens over plain http
        return tpu_v2.TpuClient(
            transport="rest", credentials=credentials, client_options=ClientOptions(api_endpoint=endpoint)
        )

    def _retry(self, predicate: Callable[[BaseException], bool] = is_retryable) -> Any:
        from google.api_core import retry as retries

        def on_error(exc: BaseException) -> None:
            self._say(f"transient API error, retrying with backoff: {type(exc).__name__}: {getattr(exc, 'message', exc)}")

        return retries.Retry(
            predicate=predicate,
            initial=self._setting(self.retry_initial_seconds, "MULTISLICE_TPU_RETRY_INITIAL_SECONDS", 1.0),
            maximum=30.0,
            multiplier=2.0,
            timeout=self._setting(self.retry_deadline_seconds, "MULTISLICE_TPU_RETRY_DEADLINE_SECONDS", 300.0),
            on_error=on_error,
        )

    def _polling(self, timeout: float) -> Any:
        from google.api_core.future import polling

        first = self._setting(self.poll_seconds, "MULTISLICE_TPU_POLL_SECONDS", 10.0)
        cap = max(first, self._setting(self.max_poll_seconds, "MULTISLICE_TPU_MAX_POLL_SECONDS", 60.0))
        return polling.DEFAULT_POLLING.with_delay(initial=first, maximum=cap, multiplier=1.5).with_timeout(timeout)

    # API helpers --------------------------------------------------------------------------

    def _get(self, client: Any, name: str) -> Any | None:
        """The QR, or None when it does not exist."""
        from google.api_core import exceptions

        try:
            return client.get_queued_resource(name=name, retry=self._retry())
        except exceptions.NotFound:
            return None

    def _wait_state(self, client: Any, props: dict[str, Any], target: str, timeout: float) -> _Wait:
        """Poll the QR until it reaches ``target`` (or later), fails, or ``timeout`` passes."""
        from google.api_core import exceptions

        name, label = qr_name_of(props), props["queuedResourceId"]
        delay = self._setting(self.poll_seconds, "MULTISLICE_TPU_POLL_SECONDS", 10.0)
        cap = max(delay, self._setting(self.max_poll_seconds, "MULTISLICE_TPU_MAX_POLL_SECONDS", 60.0))
        start = time.monotonic()
        last_state, last_report = "", start
        qr = None
        while True:
            elapsed = time.monotonic() - start
            try:
                qr = client.get_queued_resource(name=name, retry=self._retry())
            except exceptions.NotFound:
                return _Wait(None, "NOT_FOUND", False, True, elapsed, f"queued resource {label!r} disappeared")
            except Exception as exc:  # retries exhausted: keep what exists recorded
                err = explain(exc, "waiting for", props)
                return _Wait(qr, last_state or "UNKNOWN", False, False, elapsed, str(err))
            state = _state_name(qr)
            now = time.monotonic()
            if state != last_state or now - last_report >= 60:
                self._say(f"{label}: {state} after {_seconds(elapsed)} (waiting for {target}, timeout {_seconds(timeout)})")
                last_state, last_report = state, now
            if state in FAILED_STATES:
                return _Wait(qr, state, False, True, elapsed)
            if _reached(state, target):
                return _Wait(qr, state, True, False, elapsed)
            if elapsed + delay > timeout:
                return _Wait(qr, state, False, False, elapsed)
            time.sleep(delay)
            delay = min(delay * 1.5, cap)

    def _node(self, client: Any, props: dict[str, Any], node_id: str) -> Any | None:
        from google.api_core import exceptions

        try:
            return client.get_node(name=f"{parent_of(props)}/nodes/{node_id}", retry=self._retry())
        except exceptions.NotFound:
            return None

    def _node_views(self, client: Any, props: dict[str, Any]) -> list[dict[str, Any]]:
        views = []
        for node_id in node_ids(props):
            node = self._node(client, props, node_id)
            if node is None:
                views.append({"name": node_id, "state": "NOT_CREATED", "health": "", "healthDescription": "", "inSync": False})
                continue
            views.append(
                {
                    "name": node_id,
                    "state": node.state.name,
                    "health": node.health.name,
                    "healthDescription": node.health_description,
                    "ipAddresses": [e.ip_address for e in node.network_endpoints],
                    "inSync": self._node_in_sync(node, props),
                }
            )
        return views

    @staticmethod
    def _node_in_sync(node: Any, props: dict[str, Any]) -> bool:
        metadata = dict(node.metadata)
        wanted = props.get("metadata") or {}
        labels = dict(node.labels)
        return (
            all(metadata.get(k) == v for k, v in wanted.items())
            and all(labels.get(k) == v for k, v in (props.get("labels") or {}).items())
            and list(node.tags) == list(props.get("tags") or [])
        )

    def _outputs(
        self,
        props: dict[str, Any],
        qr: Any | None,
        nodes: list[dict[str, Any]] | None,
        *,
        ready: bool,
        message: str = "",
        pending_node_sync: bool = False,
    ) -> dict[str, Any]:
        outs = {k: v for k, v in props.items() if k in INPUT_KEYS}
        outs.update(
            queuedResourceName=qr_name_of(props),
            state=_state_name(qr) if qr is not None else "UNKNOWN",
            ready=ready,
            statusMessage=message,
            nodeNames=node_ids(props),
            nodes=nodes or [],
            # None (not False) while there are no nodes to compare: nothing to converge yet.
            nodesInSync=all(n.get("inSync") for n in nodes) if nodes else None,
            pendingNodeSync=pending_node_sync,
        )
        return outs

    def _describe_failure(self, client: Any, qr: Any, props: dict[str, Any]) -> str:
        lines = [f"queued resource {props['queuedResourceId']!r} is {_state_name(qr) if qr is not None else 'gone'}"]
        if qr is not None and "failed_data" in qr.state and qr.state.failed_data.error.message:
            err = qr.state.failed_data.error
            lines.append(f"  reason (code {err.code}): {err.message}")
        for view in self._node_views(client, props):
            health = f", health {view['health']}" if view["health"] else ""
            detail = f": {view['healthDescription']}" if view.get("healthDescription") else ""
            lines.append(f"  node {view['name']}: {view['state']}{health}{detail}")
        return "\n".join(lines)

    def _delete_and_wait(self, client: Any, props: dict[str, Any], timeout: float) -> bool:
        """Force-delete the QR and wait until it is gone. True when gone within ``timeout``."""
        from google.api_core import exceptions
        from google.cloud import tpu_v2

        name, label = qr_name_of(props), props["queuedResourceId"]
        try:
            client.delete_queued_resource(
                request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True), retry=self._retry()
            )
        except exceptions.NotFound:
            return True
        delay = self._setting(self.poll_seconds, "MULTISLICE_TPU_POLL_SECONDS", 10.0)
        cap = max(delay, self._setting(self.max_poll_seconds, "MULTISLICE_TPU_MAX_POLL_SECONDS", 60.0))
        start = time.monotonic()
        last = ""
        while True:
            qr = self._get(client, name)
            elapsed = time.monotonic() - start
            if qr is None:
                self._say(f"{label}: deleted after {_seconds(elapsed)}")
                return True
            if _state_name(qr) != last:
                last = _state_name(qr)
                self._say(f"{label}: {last} after {_seconds(elapsed)} (deleting, timeout {_seconds(timeout)})")
            if elapsed + delay > timeout:
                return False
            time.sleep(delay)
            delay = min(delay * 1.5, cap)

    @staticmethod
    def _is_ours(qr: Any, props: dict[str, Any]) -> bool:
        """Whether a live QR is the one ``props`` describes: this stack's labels and shape."""
        if len(qr.tpu.node_spec) != 1:
            return False
        spec = qr.tpu.node_spec[0]
        labels = dict(spec.node.labels)
        wanted = props.get("labels") or {}
        count = spec.multislice_params.node_count if "multislice_params" in spec else 1
        return (
            labels.get("managed-by") == wanted.get("managed-by") == "pulumi"
            and labels.get("multislice-stack") == wanted.get("multislice-stack")
            and spec.node.accelerator_type == props["acceleratorType"]
            and count == int(props["slices"])
        )

    def _fail(self, client: Any, qr: Any, props: dict[str, Any]) -> QueuedResourceFailed:
        """Describe a FAILED/SUSPENDED QR, delete it, and return the error to raise."""
        description = self._describe_failure(client, qr, props)
        timeout = float(props.get("deleteTimeoutSeconds") or 1200)
        try:
            gone = self._delete_and_wait(client, props, timeout)
            cleanup = (
                "It was deleted (a FAILED queued resource holds quota and possibly ACTIVE slices); "
                "run `pulumi up` again to queue a new one."
                if gone
                else f"Deleting it did not finish within {_seconds(timeout)}: check "
                f"`gcloud compute tpus queued-resources describe {props['queuedResourceId']} --zone {props['zone']} "
                f"--project {props['project']}` and delete it if it remains."
            )
        except Exception as exc:  # report the original failure either way
            cleanup = f"Deleting it failed ({explain(exc, 'deleting', props)}); delete it with gcloud."
        return QueuedResourceFailed(f"{description}\n{cleanup}")

    # ResourceProvider -----------------------------------------------------------------------

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures: list[CheckFailure] = []

        def known(key: str) -> bool:
            return key in news and news[key] != _UNKNOWN

        for key in ("project", "zone", "queuedResourceId", "acceleratorType", "runtimeVersion", "slices", "capacity", "serviceAccount", "metadata"):
            if key not in news or news[key] in (None, ""):
                failures.append(CheckFailure(key, "required"))
        if known("slices") and not (isinstance(news["slices"], (int, float)) and 1 <= int(news["slices"]) <= 256):
            failures.append(CheckFailure("slices", f"must be 1..256; got {news['slices']!r}"))
        if known("slices") and int(news.get("slices") or 0) > 1 and not news.get("nodeIdPrefix"):
            failures.append(CheckFailure("nodeIdPrefix", "required when slices > 1"))
        if known("capacity") and news["capacity"] not in API_CAPACITY:
            failures.append(CheckFailure("capacity", f"must be one of {', '.join(API_CAPACITY)}; got {news['capacity']!r}"))
        if known("capacity") and news["capacity"] == "reserved" and not news.get("reservationName"):
            failures.append(CheckFailure("reservationName", "required with capacity 'reserved'"))
        if known("waitFor") and news["waitFor"] not in STATE_ORDER[1:]:
            failures.append(CheckFailure("waitFor", f"must be one of {', '.join(STATE_ORDER[1:])}; got {news['waitFor']!r}"))
        if known("metadata") and isinstance(news["metadata"], dict):
            for key in (STARTUP_SCRIPT_KEY, RUN_DIR_KEY):
                if not news["metadata"].get(key):
                    failures.append(CheckFailure(f"metadata.{key}", "required"))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        replaces = [k for k in REPLACE_KEYS if _differs(olds.get(k), news.get(k))]
        if olds.get("state") in FAILED_STATES:
            replaces.append("state")
        changed = [k for k in INPUT_KEYS if _differs(olds.get(k), news.get(k))]
        pending = olds.get("ready") is False or bool(olds.get("pendingNodeSync")) or olds.get("nodesInSync") is False
        return DiffResult(
            changes=bool(replaces or changed or pending),
            replaces=replaces,
            delete_before_replace=True,  # fixed ids: the old QR must go before the new one
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        from google.api_core import exceptions
        from google.cloud import tpu_v2

        client = self._client()
        name, label = qr_name_of(props), props["queuedResourceId"]
        request = tpu_v2.CreateQueuedResourceRequest(
            parent=parent_of(props),
            queued_resource_id=label,
            queued_resource=build_queued_resource(props),
            request_id=str(uuid.uuid4()),  # the same id on every retry: creates at most once
        )
        self._say(f"{label}: creating ({int(props['slices'])} x {props['acceleratorType']}, {props['capacity']}) in {props['zone']}")
        timeout = float(props.get("createTimeoutSeconds") or 1800)
        try:
            operation = client.create_queued_resource(
                request=request,
                retry=self._retry(lambda e: is_retryable(e) or is_new_service_account_race(e)),
            )
        except exceptions.Conflict as exc:
            # Ours from an interrupted earlier `pulumi up` (same stack label, same shape)? Adopt
            # it rather than leave it orphaned; anything else is not ours to touch.
            existing = self._get(client, name)
            if existing is None or not self._is_ours(existing, props):
                raise explain(exc, "creating", props) from None
            self._say(f"{label}: adopting the queued resource an interrupted earlier run created ({_state_name(existing)})")
            operation = None
        except Exception as exc:
            raise explain(exc, "creating", props) from None
        if operation is not None:
            try:
                operation.result(retry=self._retry(), polling=self._polling(min(timeout, 600.0)))
            except exceptions.GoogleAPICallError as exc:  # the operation itself failed
                qr = self._get(client, name)
                if qr is not None:
                    raise self._fail(client, qr, props) from None
                raise explain(exc, "creating", props) from None
            except Exception:  # operation polling timed out: the state wait below decides
                pass
        wait = self._wait_state(client, props, props.get("waitFor") or "ACTIVE", timeout)
        if wait.failed:
            if wait.qr is None:
                raise QueuedResourceError(f"creating queued resource {label!r}: {wait.error or 'it disappeared'}")
            raise self._fail(client, wait.qr, props)
        if not wait.reached:
            message = (
                f"queued resource {label!r} is still {wait.state} after {_seconds(wait.elapsed)} "
                f"(waiting for {props.get('waitFor') or 'ACTIVE'}; multislice:queuedResource.createTimeout is "
                f"{_seconds(timeout)}). It is recorded in the stack and stays queued: run `pulumi up` again to keep "
                "waiting, or `pulumi destroy` to give up."
            )
            if wait.error:
                message += f" Last error: {wait.error}"
            self._say(message)
            return CreateResult(name, self._outputs(props, wait.qr, None, ready=False, message=message))
        nodes = self._node_views(client, props) if wait.state == "ACTIVE" else []
        if operation is None and nodes and not all(n["inSync"] for n in nodes):
            # Adopted with an older spec: converge its nodes now, as an update would.
            return CreateResult(name, self.update(name, {}, props).outs)
        return CreateResult(name, self._outputs(props, wait.qr, nodes, ready=True, message=f"{wait.state} after {_seconds(wait.elapsed)}"))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        client = self._client()
        try:
            qr = client.get_queued_resource(name=id_, retry=self._retry())
        except Exception as exc:
            from google.api_core import exceptions

            if isinstance(_root(exc), exceptions.NotFound):
                return ReadResult("", {})
            raise explain(exc, "reading", props) from None
        state = _state_name(qr)
        nodes = self._node_views(client, props) if state in ("ACTIVE", *FAILED_STATES) else []
        ready = _reached(state, props.get("waitFor") or "ACTIVE")
        return ReadResult(
            id_,
            self._outputs(props, qr, nodes, ready=ready, message=state, pending_node_sync=bool(props.get("pendingNodeSync"))),
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        client = self._client()
        label = news["queuedResourceId"]
        qr = self._get(client, id_)
        if qr is None:
            raise QueuedResourceError(
                f"queued resource {label!r} no longer exists (deleted outside Pulumi or by the service): "
                "run `pulumi refresh` and then `pulumi up` to create it again"
            )
        if _state_name(qr) in FAILED_STATES:
            raise QueuedResourceError(
                self._describe_failure(client, qr, news)
                + "\nRun `pulumi up --refresh`: the refresh records the failure and the update replaces the queued resource."
            )
        node_change = any(_differs(olds.get(k), news.get(k)) for k in NODE_KEYS) or bool(olds.get("pendingNodeSync"))
        target = news.get("waitFor") or "ACTIVE"
        timeout = float(news.get("createTimeoutSeconds") or 1800)
        wait = self._wait_state(client, news, target, timeout)
        if wait.failed:
            if wait.qr is None:
                raise QueuedResourceError(f"updating queued resource {label!r}: {wait.error or 'it disappeared'}")
            raise self._fail(client, wait.qr, news)
        if not wait.reached or wait.state != "ACTIVE":
            # Nodes do not exist yet: they are created from the QR's spec (the old metadata), so
            # the sync stays pending until a later `pulumi up` finds them ACTIVE.
            message = (
                f"queued resource {label!r} is {wait.state}"
                + (f" after {_seconds(wait.elapsed)}; run `pulumi up` again to keep waiting" if not wait.reached else "")
                + ("; node metadata/labels/tags will be applied once it is ACTIVE" if node_change else "")
            )
            return UpdateResult(
                self._outputs(news, wait.qr, None, ready=wait.reached, message=message, pending_node_sync=node_change)
            )
        metadata_changed = False
        for node_id in node_ids(news):
            node = self._node(client, news, node_id)
            if node is None:
                raise QueuedResourceError(f"queued resource {label!r} is ACTIVE but node {node_id!r} does not exist")
            patch, mask = tpu_v2.Node(name=node.name), []
            live_metadata = dict(node.metadata)
            wanted_metadata = {
                **{k: v for k, v in live_metadata.items() if k not in (olds.get("metadata") or {})},
                **(news.get("metadata") or {}),
            }
            if wanted_metadata != live_metadata:
                patch.metadata = wanted_metadata
                mask.append("metadata")
                metadata_changed = True
            live_labels = dict(node.labels)
            wanted_labels = {
                **{k: v for k, v in live_labels.items() if k not in (olds.get("labels") or {})},
                **(news.get("labels") or {}),
            }
            if wanted_labels != live_labels:
                patch.labels = wanted_labels
                mask.append("labels")
            if list(node.tags) != list(news.get("tags") or []):
                patch.tags = list(news.get("tags") or [])
                mask.append("tags")
            if not mask:
                continue
            self._say(f"{label}: updating {', '.join(mask)} of node {node_id}")
            try:
                operation = client.update_node(
                    request=tpu_v2.UpdateNodeRequest(node=patch, update_mask=field_mask_pb2.FieldMask(paths=mask)),
                    retry=self._retry(),
                )
                operation.result(retry=self._retry(), polling=self._polling(600.0))
            except Exception as exc:
                raise explain(exc, f"updating node {node_id} of", news) from None
        if metadata_changed:
            self._say(f"{label}: resetting every VM so the new startup script runs (1–2 min)")
            try:
                operation = client.reset_queued_resource(name=id_, retry=self._retry())
                operation.result(retry=self._retry(), polling=self._polling(timeout))
            except Exception as exc:
                raise explain(exc, "resetting", news) from None
            wait = self._wait_state(client, news, "ACTIVE", timeout)
            if wait.failed:
                raise self._fail(client, wait.qr, news) if wait.qr is not None else QueuedResourceError(wait.error)
        nodes = self._node_views(client, news)
        message = f"{wait.state}; " + ("metadata updated and every VM reset" if metadata_changed else "nodes in sync")
        return UpdateResult(self._outputs(news, wait.qr, nodes, ready=wait.reached, message=message))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        client = self._client()
        timeout = float(props.get("deleteTimeoutSeconds") or 1200)
        self._say(f"{props.get('queuedResourceId', id_)}: deleting (force: its nodes go with it)")
        try:
            gone = self._delete_and_wait(client, props, timeout)
        except Exception as exc:
            raise explain(exc, "deleting", props) from None
        if not gone:
            raise QueuedResourceError(
                f"queued resource {props.get('queuedResourceId', id_)!r} is still being deleted after {_seconds(timeout)}; "
                "it stays in the stack: run the command again to keep waiting"
            )


class QueuedResource(pulumi.dynamic.Resource, module="tpu", name="QueuedResource"):
    """A Multislice queued resource (type ``pulumi-python:dynamic/tpu:QueuedResource``).

    Args:
      resource_name: Pulumi name.
      props: from :func:`queued_resource_props`.
      opts: resource options; the startup script's diff is always hidden.
    """

    queuedResourceName: pulumi.Output[str]
    state: pulumi.Output[str]
    ready: pulumi.Output[bool]
    statusMessage: pulumi.Output[str]
    nodeNames: pulumi.Output[list[str]]
    nodes: pulumi.Output[list[dict[str, Any]]]

    def __init__(self, resource_name: str, props: dict[str, Any], opts: pulumi.ResourceOptions | None = None):
        hidden = pulumi.ResourceOptions(hide_diffs=[f'metadata["{STARTUP_SCRIPT_KEY}"]'])
        super().__init__(
            QueuedResourceProvider(),
            resource_name,
            {**props, **{key: None for key in OUTPUT_KEYS}},
            pulumi.ResourceOptions.merge(hidden, opts),
        )

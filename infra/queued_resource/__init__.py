"""The Multislice queued resource: a Pulumi dynamic provider over google-cloud-tpu ``tpu_v2``.

Why a dynamic provider: pulumi-gcp's ``gcp.tpu.V2QueuedResource`` has no multislice node
count, no metadata (startup script), no tags and no spot/reserved capacity
(https://www.pulumi.com/registry/packages/gcp/api-docs/tpu/v2queuedresource/).

Pickling contract: Pulumi serializes a dynamic provider with dill
(``pulumi.dynamic.dynamic.serialize_provider``; https://www.pulumi.com/docs/iac/concepts/resources/dynamic-providers/),
and dill pickles an importable class *by module reference*, so :class:`QueuedResourceProvider`
is defined here and must stay importable as ``infra.queued_resource.QueuedResourceProvider``
with the same fields forever (moving or renaming it breaks update/delete of existing stacks).
It holds only plain values; the ``TpuClient`` and every google import are created inside the
methods. Bump :data:`PROVIDER_VERSION` when the provider's semantics change (it is an input,
so the change shows in ``pulumi preview``).

The package, one concern per module: :mod:`~infra.queued_resource.inputs` (the properties,
each with its engine name and kind: replace, update in place, descriptive, provider-only,
output), :mod:`~infra.queued_resource.errors` (exception types, retried errors, messages),
:mod:`~infra.queued_resource.polling` (the one bounded wait), :mod:`~infra.queued_resource.states`
(the QR states) and :mod:`~infra.queued_resource.api` (the TPU client with its retry and
poll settings, reads and waits); the provider and the resource are here.

Lifecycle (resource type ``pulumi-python:dynamic/tpu:QueuedResource``):

* **create** – one ``CreateQueuedResource`` (a QR with this id that carries this stack's
  labels and shape, left by an interrupted earlier run, is adopted and converged instead)
  (``multislice_params`` for slices > 1, ``node_id`` for one slice; external IPs off; our
  tags, service account, labels and metadata; spot tier, reservation or on-demand;
  ``valid_until_duration``), then a bounded wait, printing progress, until the QR reaches
  ``waitFor`` (default ACTIVE) or a later state.

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

Errors (:mod:`~infra.queued_resource.errors`): HTTP 429 (rate limits) and 5xx are retried with
exponential backoff by ``google.api_core.retry.Retry``; allocation-quota (429 with a
QuotaFailure) and permission (403) errors are not retried and become one message saying what
to fix.

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

import os
import sys
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

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
from pulumi.runtime.rpc import UNKNOWN

from infra.queued_resource.api import TpuApi, is_ours, node_patch
from infra.queued_resource.errors import (
    QueuedResourceError,
    QueuedResourceFailed,
    QuotaOrPermissionError,
    explain,
    is_new_service_account_race,
    is_retryable,
    root_cause,
)
from infra.queued_resource.inputs import (
    INPUT_KEYS,
    OUTPUT_KEYS,
    PROVIDER_VERSION,
    REPLACE_KEYS,
    RUN_DIR_KEY,
    STARTUP_SCRIPT_KEY,
    UPDATE_IN_PLACE_KEYS,
    build_queued_resource,
    differs,
    node_ids,
    outputs_for,
    parent_of,
    qr_name_of,
    queued_resource_props,
)
from infra.queued_resource.polling import PollSchedule, duration_text
from infra.queued_resource.states import FAILED_STATES, STATE_ORDER, reached, state_name

__all__ = [
    "PROVIDER_VERSION",
    "RUN_DIR_KEY",
    "STARTUP_SCRIPT_KEY",
    "QueuedResource",
    "QueuedResourceError",
    "QueuedResourceFailed",
    "QueuedResourceProvider",
    "QuotaOrPermissionError",
    "queued_resource_props",
]

#: Input keys ``check`` requires (Pulumi reports each missing one by name).
REQUIRED_KEYS = (
    "project", "zone", "queuedResourceId", "acceleratorType", "runtimeVersion", "slices", "capacity", "serviceAccount", "metadata"
)


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

    def _api(self) -> TpuApi:
        """A :class:`TpuApi` with this provider's settings (created per call: never pickled)."""
        first = self._setting(self.poll_seconds, "MULTISLICE_TPU_POLL_SECONDS", 10.0)
        cap = max(first, self._setting(self.max_poll_seconds, "MULTISLICE_TPU_MAX_POLL_SECONDS", 60.0))
        return TpuApi(
            client=TpuApi.client_for(self.api_endpoint or os.environ.get("MULTISLICE_TPU_API_ENDPOINT")),
            schedule=PollSchedule(first=first, maximum=cap, multiplier=1.5),
            retry_initial_seconds=self._setting(self.retry_initial_seconds, "MULTISLICE_TPU_RETRY_INITIAL_SECONDS", 1.0),
            retry_deadline_seconds=self._setting(self.retry_deadline_seconds, "MULTISLICE_TPU_RETRY_DEADLINE_SECONDS", 300.0),
            say=self._say,
        )

    # ResourceProvider -----------------------------------------------------------------------

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        from infra.config.schema import CAPACITY_TYPES

        failures: list[CheckFailure] = []

        def known(key: str) -> bool:
            return key in news and news[key] != UNKNOWN

        for key in REQUIRED_KEYS:
            if key not in news or news[key] in (None, ""):
                failures.append(CheckFailure(key, "required"))
        if known("slices") and not (isinstance(news["slices"], (int, float)) and 1 <= int(news["slices"]) <= 256):
            failures.append(CheckFailure("slices", f"must be 1..256; got {news['slices']!r}"))
        if known("slices") and int(news.get("slices") or 0) > 1 and not news.get("nodeIdPrefix"):
            failures.append(CheckFailure("nodeIdPrefix", "required when slices > 1"))
        if known("capacity") and news["capacity"] not in CAPACITY_TYPES:
            failures.append(CheckFailure("capacity", f"must be one of {', '.join(CAPACITY_TYPES)}; got {news['capacity']!r}"))
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
        replaces = [k for k in REPLACE_KEYS if differs(olds.get(k), news.get(k))]
        if olds.get("state") in FAILED_STATES:
            replaces.append("state")
        changed = [k for k in INPUT_KEYS if differs(olds.get(k), news.get(k))]
        pending = olds.get("ready") is False or bool(olds.get("pendingNodeSync")) or olds.get("nodesInSync") is False
        return DiffResult(
            changes=bool(replaces or changed or pending),
            replaces=replaces,
            delete_before_replace=True,  # fixed ids: the old QR must go before the new one
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        from google.api_core import exceptions
        from google.cloud import tpu_v2

        api = self._api()
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
            operation = api.client.create_queued_resource(
                request=request,
                retry=api.retry(lambda e: is_retryable(e) or is_new_service_account_race(e)),
            )
        except exceptions.Conflict as exc:
            # Ours from an interrupted earlier `pulumi up` (same stack label, same shape)? Adopt
            # it rather than leave it orphaned; anything else is not ours to touch.
            existing = api.get_queued_resource(name)
            if existing is None or not is_ours(existing, props):
                raise explain(exc, "creating", props) from None
            self._say(f"{label}: adopting the queued resource an interrupted earlier run created ({state_name(existing)})")
            operation = None
        except Exception as exc:
            raise explain(exc, "creating", props) from None
        if operation is not None:
            try:
                operation.result(retry=api.retry(), polling=api.operation_polling(min(timeout, 600.0)))
            except exceptions.GoogleAPICallError as exc:  # the operation itself failed
                qr = api.get_queued_resource(name)
                if qr is not None:
                    raise api.delete_failed(qr, props) from None
                raise explain(exc, "creating", props) from None
            except Exception:  # operation polling timed out: the state wait below decides
                pass
        wait = api.wait_for_state(props, props.get("waitFor") or "ACTIVE", timeout)
        if wait.failed:
            if wait.qr is None:
                raise QueuedResourceError(f"creating queued resource {label!r}: {wait.error or 'it disappeared'}")
            raise api.delete_failed(wait.qr, props)
        if not wait.reached:
            message = (
                f"queued resource {label!r} is still {wait.state} after {duration_text(wait.elapsed)} "
                f"(waiting for {props.get('waitFor') or 'ACTIVE'}; multislice:queuedResource.createTimeout is "
                f"{duration_text(timeout)}). It is recorded in the stack and stays queued: run `pulumi up` again to keep "
                "waiting, or `pulumi destroy` to give up."
            )
            if wait.error:
                message += f" Last error: {wait.error}"
            self._say(message)
            return CreateResult(name, outputs_for(props, wait.qr, None, ready=False, message=message))
        nodes = api.node_views(props) if wait.state == "ACTIVE" else []
        if operation is None and nodes and not all(n["inSync"] for n in nodes):
            # Adopted with an older spec: converge its nodes now, as an update would.
            return CreateResult(name, self.update(name, {}, props).outs)
        return CreateResult(name, outputs_for(props, wait.qr, nodes, ready=True, message=f"{wait.state} after {duration_text(wait.elapsed)}"))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        api = self._api()
        try:
            qr = api.client.get_queued_resource(name=id_, retry=api.retry())
        except Exception as exc:
            from google.api_core import exceptions

            if isinstance(root_cause(exc), exceptions.NotFound):
                return ReadResult("", {})
            raise explain(exc, "reading", props) from None
        state = state_name(qr)
        nodes = api.node_views(props) if state in ("ACTIVE", *FAILED_STATES) else []
        ready = reached(state, props.get("waitFor") or "ACTIVE")
        return ReadResult(
            id_,
            outputs_for(props, qr, nodes, ready=ready, message=state, pending_node_sync=bool(props.get("pendingNodeSync"))),
        )

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        api = self._api()
        label = news["queuedResourceId"]
        qr = api.get_queued_resource(id_)
        if qr is None:
            raise QueuedResourceError(
                f"queued resource {label!r} no longer exists (deleted outside Pulumi or by the service): "
                "run `pulumi refresh` and then `pulumi up` to create it again"
            )
        if state_name(qr) in FAILED_STATES:
            raise QueuedResourceError(
                api.describe_failure(qr, news)
                + "\nRun `pulumi up --refresh`: the refresh records the failure and the update replaces the queued resource."
            )
        node_change = any(differs(olds.get(k), news.get(k)) for k in UPDATE_IN_PLACE_KEYS) or bool(olds.get("pendingNodeSync"))
        target = news.get("waitFor") or "ACTIVE"
        timeout = float(news.get("createTimeoutSeconds") or 1800)
        wait = api.wait_for_state(news, target, timeout)
        if wait.failed:
            if wait.qr is None:
                raise QueuedResourceError(f"updating queued resource {label!r}: {wait.error or 'it disappeared'}")
            raise api.delete_failed(wait.qr, news)
        if not wait.reached or wait.state != "ACTIVE":
            # Nodes do not exist yet: they are created from the QR's spec (the old metadata), so
            # the sync stays pending until a later `pulumi up` finds them ACTIVE.
            message = (
                f"queued resource {label!r} is {wait.state}"
                + (f" after {duration_text(wait.elapsed)}; run `pulumi up` again to keep waiting" if not wait.reached else "")
                + ("; node metadata/labels/tags will be applied once it is ACTIVE" if node_change else "")
            )
            return UpdateResult(
                outputs_for(news, wait.qr, None, ready=wait.reached, message=message, pending_node_sync=node_change)
            )
        metadata_changed = False
        for node_id in node_ids(news):
            node = api.get_node(news, node_id)
            if node is None:
                raise QueuedResourceError(f"queued resource {label!r} is ACTIVE but node {node_id!r} does not exist")
            patch, mask = node_patch(node, olds, news)
            metadata_changed = metadata_changed or "metadata" in mask
            if not mask:
                continue
            self._say(f"{label}: updating {', '.join(mask)} of node {node_id}")
            try:
                operation = api.client.update_node(
                    request=tpu_v2.UpdateNodeRequest(node=patch, update_mask=field_mask_pb2.FieldMask(paths=mask)),
                    retry=api.retry(),
                )
                operation.result(retry=api.retry(), polling=api.operation_polling(600.0))
            except Exception as exc:
                raise explain(exc, f"updating node {node_id} of", news) from None
        if metadata_changed:
            self._say(f"{label}: resetting every VM so the new startup script runs (1–2 min)")
            try:
                operation = api.client.reset_queued_resource(name=id_, retry=api.retry())
                operation.result(retry=api.retry(), polling=api.operation_polling(timeout))
            except Exception as exc:
                raise explain(exc, "resetting", news) from None
            wait = api.wait_for_state(news, "ACTIVE", timeout)
            if wait.failed:
                raise api.delete_failed(wait.qr, news) if wait.qr is not None else QueuedResourceError(wait.error)
        nodes = api.node_views(news)
        message = f"{wait.state}; " + ("metadata updated and every VM reset" if metadata_changed else "nodes in sync")
        return UpdateResult(outputs_for(news, wait.qr, nodes, ready=wait.reached, message=message))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        api = self._api()
        timeout = float(props.get("deleteTimeoutSeconds") or 1200)
        self._say(f"{props.get('queuedResourceId', id_)}: deleting (force: its nodes go with it)")
        try:
            gone = api.delete_and_wait(props, timeout)
        except Exception as exc:
            raise explain(exc, "deleting", props) from None
        if not gone:
            raise QueuedResourceError(
                f"queued resource {props.get('queuedResourceId', id_)!r} is still being deleted after {duration_text(timeout)}; "
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

"""The Cloud TPU API as the provider uses it: a ``tpu_v2.TpuClient`` with one retry policy, one
poll schedule and a progress sink, and the reads and waits every lifecycle step shares.

A :class:`TpuApi` lives for one provider call (clients cannot be pickled with the provider);
every google import happens inside its methods. REST reference:
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources and
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from infra.queued_resource.errors import QueuedResourceError, QueuedResourceFailed, explain, is_retryable
from infra.queued_resource.inputs import node_ids, parent_of, qr_name_of
from infra.queued_resource.polling import PollSchedule, duration_text, poll_until
from infra.queued_resource.states import FAILED_STATES, reached, state_name

#: Hosts a plain-http endpoint may name (a local fake; it gets anonymous credentials).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class StateWait:
    """Result of :meth:`TpuApi.wait_for_state`.

    ``qr`` is the last ``tpu_v2.QueuedResource`` read (None when it disappeared), ``state``
    its state name (``NOT_FOUND`` when gone, ``UNKNOWN`` when never read), ``reached`` whether
    the target (or a later state) was reached, ``failed`` whether it went FAILED/SUSPENDED or
    disappeared, ``elapsed`` seconds waited, ``error`` why reading stopped early (else "").
    """

    qr: Any
    state: str
    reached: bool
    failed: bool
    elapsed: float
    error: str = ""


@dataclass(frozen=True)
class _Read:
    """One poll of the QR: what was read, or why nothing was."""

    qr: Any
    error: str = ""
    gone: bool = False


def node_in_sync(node: Any, props: dict[str, Any]) -> bool:
    """Whether a ``tpu_v2.Node`` carries the metadata, labels and tags of ``props`` (other
    metadata keys and labels, such as ``ssh-keys``, may be there too)."""
    metadata = dict(node.metadata)
    labels = dict(node.labels)
    return (
        all(metadata.get(k) == v for k, v in (props.get("metadata") or {}).items())
        and all(labels.get(k) == v for k, v in (props.get("labels") or {}).items())
        and list(node.tags) == list(props.get("tags") or [])
    )


def is_ours(qr: Any, props: dict[str, Any]) -> bool:
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


def node_patch(node: Any, olds: dict[str, Any], news: dict[str, Any]) -> tuple[Any, list[str]]:
    """The ``UpdateNode`` patch (a ``tpu_v2.Node``) and update mask that bring a live node from
    ``olds`` to ``news``; the mask is empty when the node is in sync.

    Metadata and labels are merged: keys others set (such as ``ssh-keys``) survive, keys that
    ``olds`` set and ``news`` drops are removed. Tags are replaced.
    """
    from google.cloud import tpu_v2

    patch, mask = tpu_v2.Node(name=node.name), []
    live_metadata = dict(node.metadata)
    wanted_metadata = {
        **{k: v for k, v in live_metadata.items() if k not in (olds.get("metadata") or {})},
        **(news.get("metadata") or {}),
    }
    if wanted_metadata != live_metadata:
        patch.metadata = wanted_metadata
        mask.append("metadata")
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
    return patch, mask


@dataclass
class TpuApi:
    """A connected ``tpu_v2.TpuClient`` plus the provider's retry and poll settings.

    Args:
      client: the ``tpu_v2.TpuClient`` (see :meth:`connect`).
      schedule: delays between polls of waits and long-running operations.
      retry_initial_seconds, retry_deadline_seconds: backoff of retried API errors
        (:func:`~infra.queued_resource.errors.is_retryable`): first delay, doubling to 30 s,
        until the deadline.
      say: receives progress lines.
    """

    client: Any
    schedule: PollSchedule
    retry_initial_seconds: float
    retry_deadline_seconds: float
    say: Callable[[str], None]

    @staticmethod
    def client_for(endpoint: str | None) -> Any:
        """A REST ``tpu_v2.TpuClient``: Application Default Credentials at the public endpoint,
        or at ``endpoint``; a plain-http endpoint gets anonymous credentials (never real
        tokens over plain http).

        Raises:
          QueuedResourceError: a plain-http endpoint that is not a loopback address.
        """
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import tpu_v2

        if not endpoint:
            return tpu_v2.TpuClient(transport="rest")
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        credentials = None
        if parts.scheme == "http":
            if parts.hostname not in LOOPBACK_HOSTS:
                raise QueuedResourceError(f"plain-http TPU API endpoint {endpoint!r} must be a loopback address")
            credentials = AnonymousCredentials()
        return tpu_v2.TpuClient(
            transport="rest", credentials=credentials, client_options=ClientOptions(api_endpoint=endpoint)
        )

    def retry(self, predicate: Callable[[BaseException], bool] = is_retryable) -> Any:
        """A ``google.api_core.retry.Retry`` of ``predicate`` errors that states each retry."""
        from google.api_core import retry as retries

        def on_error(exc: BaseException) -> None:
            self.say(f"transient API error, retrying with backoff: {type(exc).__name__}: {getattr(exc, 'message', exc)}")

        return retries.Retry(
            predicate=predicate,
            initial=self.retry_initial_seconds,
            maximum=30.0,
            multiplier=2.0,
            timeout=self.retry_deadline_seconds,
            on_error=on_error,
        )

    def operation_polling(self, timeout: float) -> Any:
        """The ``polling=`` of ``Operation.result``: this schedule, ``timeout`` seconds."""
        return self.schedule.operation_polling(timeout)

    # Reads ------------------------------------------------------------------------------------

    def get_queued_resource(self, name: str) -> Any | None:
        """The ``tpu_v2.QueuedResource`` called ``name``, or None when it does not exist."""
        from google.api_core import exceptions

        try:
            return self.client.get_queued_resource(name=name, retry=self.retry())
        except exceptions.NotFound:
            return None

    def get_node(self, props: dict[str, Any], node_id: str) -> Any | None:
        """The ``tpu_v2.Node`` ``node_id`` of the QR of ``props``, or None when it does not exist."""
        from google.api_core import exceptions

        try:
            return self.client.get_node(name=f"{parent_of(props)}/nodes/{node_id}", retry=self.retry())
        except exceptions.NotFound:
            return None

    def node_views(self, props: dict[str, Any]) -> list[dict[str, Any]]:
        """One plain dict per node of ``props``: name, state, health, healthDescription,
        ipAddresses, inSync (state ``NOT_CREATED`` for a node that does not exist)."""
        views = []
        for node_id in node_ids(props):
            node = self.get_node(props, node_id)
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
                    "inSync": node_in_sync(node, props),
                }
            )
        return views

    def describe_failure(self, qr: Any, props: dict[str, Any]) -> str:
        """The QR's state, the API's reason and every node's state and health, one per line."""
        lines = [f"queued resource {props['queuedResourceId']!r} is {state_name(qr) if qr is not None else 'gone'}"]
        if qr is not None and "failed_data" in qr.state and qr.state.failed_data.error.message:
            err = qr.state.failed_data.error
            lines.append(f"  reason (code {err.code}): {err.message}")
        for view in self.node_views(props):
            health = f", health {view['health']}" if view["health"] else ""
            detail = f": {view['healthDescription']}" if view.get("healthDescription") else ""
            lines.append(f"  node {view['name']}: {view['state']}{health}{detail}")
        return "\n".join(lines)

    # Waits ------------------------------------------------------------------------------------

    def wait_for_state(self, props: dict[str, Any], target: str, timeout: float) -> StateWait:
        """Poll the QR until it reaches ``target`` (or later), fails, disappears, cannot be read
        (retries exhausted), or ``timeout`` seconds pass; states each new state."""
        from google.api_core import exceptions

        name, label = qr_name_of(props), props["queuedResourceId"]
        seen: Any = None  # the last QR read

        def observe() -> _Read:
            nonlocal seen
            try:
                seen = self.client.get_queued_resource(name=name, retry=self.retry())
            except exceptions.NotFound:
                return _Read(None, f"queued resource {label!r} disappeared", gone=True)
            except Exception as exc:  # retries exhausted: keep what exists recorded
                return _Read(seen, str(explain(exc, "waiting for", props)))
            return _Read(seen)

        def settled(read: _Read) -> bool:
            return bool(read.error) or state_name(read.qr) in FAILED_STATES or reached(state_name(read.qr), target)

        polled = poll_until(
            observe,
            done=settled,
            timeout=timeout,
            schedule=self.schedule,
            state=lambda read: None if read.error else state_name(read.qr),
            report=lambda state, elapsed: self.say(
                f"{label}: {state} after {duration_text(elapsed)} (waiting for {target}, timeout {duration_text(timeout)})"
            ),
        )
        read, elapsed = polled.value, polled.elapsed
        if read.gone:
            return StateWait(None, "NOT_FOUND", False, True, elapsed, read.error)
        state = state_name(read.qr) if read.qr is not None else "UNKNOWN"
        if read.error:
            return StateWait(read.qr, state, False, False, elapsed, read.error)
        return StateWait(read.qr, state, polled.done and state not in FAILED_STATES, state in FAILED_STATES, elapsed)

    def delete_and_wait(self, props: dict[str, Any], timeout: float) -> bool:
        """Force-delete the QR (its nodes go with it) and wait until it is gone.

        Returns:
          True when it is gone (or never existed) within ``timeout`` seconds.
        Raises:
          google.api_core.exceptions.GoogleAPICallError: the delete or a read failed after retries.
        """
        from google.api_core import exceptions
        from google.cloud import tpu_v2

        name, label = qr_name_of(props), props["queuedResourceId"]
        try:
            self.client.delete_queued_resource(
                request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True), retry=self.retry()
            )
        except exceptions.NotFound:
            return True
        polled = poll_until(
            lambda: self.get_queued_resource(name),
            done=lambda qr: qr is None,
            timeout=timeout,
            schedule=self.schedule,
            state=lambda qr: state_name(qr) if qr is not None else None,
            report=lambda state, elapsed: self.say(
                f"{label}: {state} after {duration_text(elapsed)} (deleting, timeout {duration_text(timeout)})"
            ),
        )
        if polled.done:
            self.say(f"{label}: deleted after {duration_text(polled.elapsed)}")
        return polled.done

    def delete_failed(self, qr: Any, props: dict[str, Any]) -> QueuedResourceFailed:
        """Describe a FAILED/SUSPENDED QR, force-delete it (it holds quota, and possibly ACTIVE
        slices), and return the error to raise: the failure, then how the cleanup went."""
        description = self.describe_failure(qr, props)
        timeout = float(props.get("deleteTimeoutSeconds") or 1200)
        try:
            gone = self.delete_and_wait(props, timeout)
            cleanup = (
                "It was deleted (a FAILED queued resource holds quota and possibly ACTIVE slices); "
                "run `pulumi up` again to queue a new one."
                if gone
                else f"Deleting it did not finish within {duration_text(timeout)}: check "
                f"`gcloud compute tpus queued-resources describe {props['queuedResourceId']} --zone {props['zone']} "
                f"--project {props['project']}` and delete it if it remains."
            )
        except Exception as exc:  # report the original failure either way
            cleanup = f"Deleting it failed ({explain(exc, 'deleting', props)}); delete it with gcloud."
        return QueuedResourceFailed(f"{description}\n{cleanup}")

"""The Cloud TPU API as the provider uses it: a ``tpu_v2.TpuClient`` with one retry policy, one
poll schedule and a progress sink, and the reads and waits every lifecycle step shares.

A :class:`TpuApi` lives for one provider call (clients cannot be pickled with the provider);
every google import happens inside its methods. Every wait and every retry of a lifecycle call
draws on one :class:`~infra.backends.queued_resource.provider.polling.Deadline`. REST reference:
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources and
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from infra.backends.queued_resource.provider.errors import (
    QueuedResourceError,
    QueuedResourceFailed,
    explain,
    is_retryable,
)
from infra.backends.queued_resource.provider.inputs import node_ids, parent_of, qr_name_of
from infra.backends.queued_resource.provider.nodes import (
    DEFAULT_CONCURRENCY,
    describe_nodes,
    live_node_ids,
    node_view,
    spec_metadata,
)
from infra.backends.queued_resource.provider.polling import Deadline, PollSchedule, duration_text, poll_until
from infra.backends.queued_resource.provider.states import FAILED_STATES, reached, state_name

#: Hosts a plain-http endpoint may name (a local fake).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")

#: Seconds one HTTP request may take (each attempt; retries and waits have their own deadline).
REQUEST_TIMEOUT_SECONDS = 60.0


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


def is_ours(qr: Any, props: dict[str, Any]) -> bool:
    """Whether a live QR is the one ``props`` describes: this stack's labels and accelerator
    type on every ``nodeSpec`` entry, and the nodes of ``props`` (their number, and the ids the
    QR names). Either shape of ``nodeSpec`` (:func:`~infra.backends.queued_resource.provider.nodes.live_node_ids`)."""
    specs = list(qr.tpu.node_spec)
    if not specs:
        return False
    wanted = props.get("labels") or {}
    if wanted.get("managed-by") != "pulumi":
        return False
    for spec in specs:
        labels = dict(spec.node.labels)
        if (
            labels.get("managed-by") != "pulumi"
            or labels.get("multislice-stack") != wanted.get("multislice-stack")
            or spec.node.accelerator_type != props["acceleratorType"]
        ):
            return False
    ids, expected = live_node_ids(qr), node_ids(props)
    return len(ids) == int(props["slices"]) == len(expected) and {i for i in ids if i is not None} <= set(expected)


@dataclass
class TpuApi:
    """A connected ``tpu_v2.TpuClient`` plus the provider's retry, poll and concurrency settings
    and the context its error messages need.

    Args:
      client: the ``tpu_v2.TpuClient`` (see :meth:`client_for`).
      schedule: delays between polls of waits and long-running operations.
      retry_initial_seconds, retry_deadline_seconds: backoff of retried API errors
        (:func:`~infra.backends.queued_resource.provider.errors.is_retryable`): first delay, doubling (with
        jitter) to 30 s, until the deadline (or the caller's :class:`Deadline`, if sooner).
      say: receives progress lines.
      project: the stack's ``gcp:project``; quota_project, quota_origin: where the requests are
        billed and which setting chose it; credentials: where the credentials came from.
      concurrency: node requests in flight at once (:mod:`~infra.backends.queued_resource.provider.nodes`).
    """

    client: Any
    schedule: PollSchedule
    retry_initial_seconds: float
    retry_deadline_seconds: float
    say: Callable[[str], None]
    project: str | None = None
    quota_project: str | None = None
    quota_origin: str = "gcp:project"
    credentials: str = "Application Default Credentials"
    concurrency: int = DEFAULT_CONCURRENCY

    @staticmethod
    def client_for(endpoint: str | None, credentials: Any = None) -> Any:
        """A REST ``tpu_v2.TpuClient`` with ``credentials`` (None: Application Default
        Credentials) at the public endpoint, or at ``endpoint``. A plain-http endpoint must be a
        loopback address (a local fake: nothing leaves the machine) and gets anonymous
        credentials unless ``credentials`` are given.

        Raises:
          QueuedResourceError: a plain-http endpoint that is not a loopback address.
        """
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import tpu_v2

        if not endpoint:
            return tpu_v2.TpuClient(transport="rest", credentials=credentials)
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        if parts.scheme == "http":
            if parts.hostname not in LOOPBACK_HOSTS:
                raise QueuedResourceError(f"plain-http TPU API endpoint {endpoint!r} must be a loopback address")
            credentials = credentials if credentials is not None else AnonymousCredentials()
        return tpu_v2.TpuClient(
            transport="rest", credentials=credentials, client_options=ClientOptions(api_endpoint=endpoint)
        )

    def retryable(self, exc: BaseException) -> bool:
        """:func:`~infra.backends.queued_resource.provider.errors.is_retryable` for this stack's project."""
        return is_retryable(exc, project=self.project, quota_project=self.quota_project)

    def retry(self, predicate: Callable[[BaseException], bool] | None = None, deadline: Deadline | None = None) -> Any:
        """A ``google.api_core.retry.Retry`` of ``predicate`` errors (default :meth:`retryable`)
        that states each retry and gives up at the retry deadline or ``deadline``."""
        from google.api_core import retry as retries

        def on_error(exc: BaseException) -> None:
            self.say(
                f"transient API error, retrying with backoff: {type(exc).__name__}: {getattr(exc, 'message', exc)}"
            )

        timeout = (
            self.retry_deadline_seconds if deadline is None else min(self.retry_deadline_seconds, deadline.remaining())
        )
        return retries.Retry(
            predicate=predicate or self.retryable,
            initial=self.retry_initial_seconds,
            maximum=30.0,
            multiplier=2.0,
            timeout=timeout,
            on_error=on_error,
        )

    def operation_polling(self, timeout: float) -> Any:
        """The ``polling=`` of ``Operation.result``: this schedule, ``timeout`` seconds."""
        return self.schedule.operation_polling(timeout)

    def explain(self, exc: BaseException, action: str, props: dict[str, Any]) -> QueuedResourceError:
        """:func:`~infra.backends.queued_resource.provider.errors.explain` with this API's credentials and
        quota project."""
        return explain(
            exc,
            action,
            props,
            credentials=self.credentials,
            quota_project=self.quota_project,
            quota_origin=self.quota_origin,
        )

    # Reads ------------------------------------------------------------------------------------

    def get_queued_resource(self, name: str, deadline: Deadline | None = None) -> Any | None:
        """The ``tpu_v2.QueuedResource`` called ``name``, or None when it does not exist."""
        from google.api_core import exceptions

        try:
            return self.client.get_queued_resource(
                name=name, retry=self.retry(deadline=deadline), timeout=REQUEST_TIMEOUT_SECONDS
            )
        except exceptions.NotFound:
            return None

    def list_nodes(self, props: dict[str, Any], deadline: Deadline | None = None) -> dict[str, Any]:
        """Node id → ``tpu_v2.Node`` for the nodes of the QR of ``props`` that exist: one
        ``ListNodes`` call per page of the zone's nodes (not one call per node)."""
        from google.cloud import tpu_v2

        wanted = set(node_ids(props))
        pages = self.client.list_nodes(
            request=tpu_v2.ListNodesRequest(parent=parent_of(props)),
            retry=self.retry(deadline=deadline),
            timeout=REQUEST_TIMEOUT_SECONDS,
        )
        found = {}
        for node in pages:
            node_id = node.name.rsplit("/", 1)[-1]
            if node_id in wanted:
                found[node_id] = node
        return found

    def node_views(
        self, props: dict[str, Any], live: dict[str, Any] | None = None, qr: Any | None = None
    ) -> list[dict[str, Any]]:
        """One plain dict per node of ``props`` (:func:`~infra.backends.queued_resource.provider.nodes.node_view`),
        from ``live`` (default: :meth:`list_nodes`); ``qr``, the live QR, gives each node's
        creation-time metadata (a node recreated from it is in sync: the release record)."""
        live = self.list_nodes(props) if live is None else live
        created = spec_metadata(qr)
        return [node_view(node_id, live.get(node_id), props, created.get(node_id)) for node_id in node_ids(props)]

    def describe_failure(self, qr: Any, props: dict[str, Any]) -> str:
        """The QR's state, the API's reason and its nodes' states (summarized when many)."""
        lines = [f"queued resource {props['queuedResourceId']!r} is {state_name(qr) if qr is not None else 'gone'}"]
        if qr is not None and "failed_data" in qr.state and qr.state.failed_data.error.message:
            err = qr.state.failed_data.error
            lines.append(f"  reason (code {err.code}): {err.message}")
        try:
            lines += describe_nodes(self.node_views(props))
        except Exception as exc:  # the failure itself matters more than the node list
            lines.append(f"  (could not list its nodes: {self.explain(exc, 'listing nodes of', props)})")
        return "\n".join(lines)

    # Waits ------------------------------------------------------------------------------------

    def wait_for_state(self, props: dict[str, Any], target: str, deadline: Deadline) -> StateWait:
        """Poll the QR until it reaches ``target`` (or later), fails, disappears, cannot be read
        (retries exhausted), or ``deadline`` passes; states each new state."""
        from google.api_core import exceptions

        name, label = qr_name_of(props), props["queuedResourceId"]
        seen: Any = None  # the last QR read

        def observe() -> _Read:
            nonlocal seen
            try:
                seen = self.client.get_queued_resource(
                    name=name, retry=self.retry(deadline=deadline), timeout=REQUEST_TIMEOUT_SECONDS
                )
            except exceptions.NotFound:
                return _Read(None, f"queued resource {label!r} disappeared", gone=True)
            except Exception as exc:  # retries exhausted: keep what exists recorded
                return _Read(seen, str(self.explain(exc, "waiting for", props)))
            return _Read(seen)

        def settled(read: _Read) -> bool:
            return bool(read.error) or state_name(read.qr) in FAILED_STATES or reached(state_name(read.qr), target)

        timeout = deadline.remaining()
        polled = poll_until(
            observe,
            done=settled,
            timeout=timeout,
            schedule=self.schedule,
            state=lambda read: None if read.error else state_name(read.qr),
            report=lambda state, elapsed: self.say(
                f"{label}: {state} after {duration_text(deadline.elapsed())} (waiting for {target}, "
                f"timeout {duration_text(deadline.seconds)})"
            ),
        )
        read, elapsed = polled.value, deadline.elapsed()
        if read.gone:
            return StateWait(None, "NOT_FOUND", False, True, elapsed, read.error)
        state = state_name(read.qr) if read.qr is not None else "UNKNOWN"
        if read.error:
            return StateWait(read.qr, state, False, False, elapsed, read.error)
        return StateWait(read.qr, state, polled.done and state not in FAILED_STATES, state in FAILED_STATES, elapsed)

    def delete_and_wait(self, props: dict[str, Any], deadline: Deadline) -> bool:
        """Force-delete the QR (its nodes go with it) and wait until it is gone; the delete
        request, its retries and the wait together take at most ``deadline``.

        Returns:
          True when it is gone (or never existed) before the deadline.
        Raises:
          google.api_core.exceptions.GoogleAPICallError: the delete or a read failed after retries.
        """
        from google.api_core import exceptions
        from google.cloud import tpu_v2

        name, label = qr_name_of(props), props["queuedResourceId"]
        try:
            self.client.delete_queued_resource(
                request=tpu_v2.DeleteQueuedResourceRequest(name=name, force=True),
                retry=self.retry(deadline=deadline),
                timeout=REQUEST_TIMEOUT_SECONDS,
            )
        except exceptions.NotFound:
            return True
        polled = poll_until(
            lambda: self.get_queued_resource(name, deadline),
            done=lambda qr: qr is None,
            timeout=deadline.remaining(),
            schedule=self.schedule,
            state=lambda qr: state_name(qr) if qr is not None else None,
            report=lambda state, elapsed: self.say(
                f"{label}: {state} after {duration_text(deadline.elapsed())} "
                f"(deleting, timeout {duration_text(deadline.seconds)})"
            ),
        )
        if polled.done:
            self.say(f"{label}: deleted after {duration_text(deadline.elapsed())}")
        return polled.done

    def delete_failed(self, qr: Any, props: dict[str, Any]) -> QueuedResourceFailed:
        """Describe a FAILED/SUSPENDED QR, force-delete it (it holds quota, and possibly ACTIVE
        slices) within ``deleteTimeoutSeconds``, and return the error to raise: the failure,
        then how the cleanup went."""
        description = self.describe_failure(qr, props)
        deadline = Deadline(float(props.get("deleteTimeoutSeconds") or 1200))
        try:
            gone = self.delete_and_wait(props, deadline)
            cleanup = (
                "It was deleted (a FAILED queued resource holds quota and possibly ACTIVE slices); "
                "run `pulumi up` again to queue a new one."
                if gone
                else f"Deleting it did not finish within {duration_text(deadline.seconds)}: check "
                f"`gcloud compute tpus queued-resources describe {props['queuedResourceId']} --zone {props['zone']} "
                f"--project {props['project']}` and delete it if it remains."
            )
        except Exception as exc:  # report the original failure either way
            cleanup = f"Deleting it failed ({self.explain(exc, 'deleting', props)}); delete it with gcloud."
        return QueuedResourceFailed(f"{description}\n{cleanup}")

"""The Multislice queued resource: a Pulumi dynamic provider over google-cloud-tpu ``tpu_v2``.

Why a dynamic provider: pulumi-gcp's ``gcp.tpu.V2QueuedResource`` has no multislice node
count, no metadata (startup script), no tags and no spot/reserved capacity
(https://www.pulumi.com/registry/packages/gcp/api-docs/tpu/v2queuedresource/).

Pickling contract: Pulumi serializes a dynamic provider with dill
(``pulumi.dynamic.dynamic.serialize_provider``; https://www.pulumi.com/docs/iac/concepts/resources/dynamic-providers/),
and dill pickles an importable class *by module reference*, so :class:`QueuedResourceProvider`
must stay importable as ``infra.queued_resource.QueuedResourceProvider`` with the same fields
forever (renaming it breaks update/delete of existing stacks). It is defined here, with the
backend it belongs to, and names :data:`PICKLED_MODULE` as its module; ``infra/queued_resource``
re-exports it under that name, so pickles written before and after the move are the same bytes.
It holds only plain values; the ``TpuClient``, the credentials and every google import are
created inside the methods. Bump :data:`PROVIDER_VERSION` when the provider's semantics change
(it is an input, so the change shows in ``pulumi preview``).

The package (``infra.backends.queued_resource.provider``), one concern per module: ``inputs``
(the properties and their kinds), ``errors`` (exception types, retried errors, messages),
``polling`` (bounded waits, the shared deadline), ``states`` (QR states), ``api`` (the TPU client,
reads and waits), ``nodes`` (node views, patches, the concurrent node update), ``create`` (create,
adopt, wait), ``refresh`` (read), ``completion`` (a run complete) and ``converge`` (update in
place); the provider (its
``check`` and the replace-vs-update rule of ``diff``) and the resource are here. Credentials
(:mod:`infra.credentials`, as the gcp provider takes them) arrive through ``configure``;
``check`` rejects missing or malformed ones at ``pulumi preview`` with one line and no network
call; requests are billed to ``gcp:project``.

Lifecycle (resource type ``pulumi-python:dynamic/tpu:QueuedResource``); each call has one
deadline for everything it does (API retries, operation polling, state waits): create and
update ``createTimeoutSeconds``, delete ``deleteTimeoutSeconds``:

* **create** – one ``CreateQueuedResource`` (a QR with this id that carries this stack's
  labels and shape, left by an interrupted earlier run, is adopted and converged instead),
  then a wait until the QR reaches ``waitFor`` (default ACTIVE) or a later state.
  FAILED / SUSPENDING / SUSPENDED: the QR is force-deleted (it holds QR quota, and a FAILED
  QR can hold ACTIVE slices) and the error describes its nodes and the API's reason. The
  deadline passes (typically WAITING_FOR_RESOURCES): create *succeeds* with ``ready: false``
  so the QR is recorded (never an orphan); the program then fails the update with a message
  saying so (``infra/__main__.py``), and the next ``pulumi up`` resumes waiting.
* **read** – live state: QR state, each node's state and health (one ``ListNodes`` per page),
  whether the nodes carry the recorded metadata/labels/tags, and the nodes of an ACTIVE QR
  that are gone (``lostNodes``). A QR that no longer exists reads as gone (empty id), unless
  its run completed (``COMPLETE`` for ``trainer.steps`` in the run directory: deleted by
  ``deleteOnComplete``, or by hand after the run): then it reads as ``deletedOnComplete``
  (converged,
  :mod:`~infra.backends.queued_resource.provider.completion`), and so does a DELETING one.
  ``Pulumi.yaml`` sets ``options.refresh: always`` (Pulumi CLI 3.14+,
  https://www.pulumi.com/docs/iac/concepts/projects/project-file/), so every ``pulumi up`` /
  ``preview`` / ``destroy`` reads first: a preempted Spot QR (SUSPENDED, nodes deleted; Spot
  TPUs cannot be restarted, only recreated: https://cloud.google.com/tpu/docs/spot) shows as a
  replacement, a deleted one as a create. (Not a live read in ``diff``: diff stays offline.)
* **diff** – replace (delete first: the ids are fixed) on accelerator type, slice count,
  runtime version, capacity, reservation, network, subnetwork, service account or zone, or a
  recorded FAILED/SUSPENDING/SUSPENDED state or lost nodes; a QR deleted on complete changes only when
  the inputs start a new run (a new ``runDir``, more ``trainer.steps``: replace, which creates
  it); update in place when only
  metadata, labels or tags change (and what describes the metadata); an update is also due
  while the recorded state is not ready or an earlier update left work. No network call.
* **update** – :mod:`~infra.backends.queued_resource.provider.converge`: ``UpdateNode`` on every node that
  differs, a few at a time, then ``ResetQueuedResource`` when the inputs' metadata changed (a node
  that is merely stale, such as a slice Cloud TPU recreated from the creation-time spec, is
  updated without a reset: the release record runs the current release); an update
  that stops part-way records what is left and the next ``pulumi up`` finishes it.
* **delete** – force delete, then wait until the QR is gone.

Errors (:mod:`~infra.backends.queued_resource.provider.errors`): HTTP 429 (rate limits) and 5xx are retried with
jittered exponential backoff by ``google.api_core.retry.Retry``; quota, permission (403) and
credential (401) errors are not retried and become one message saying what to fix.

Tuning (tests make these small): constructor arguments, else the environment variables
``MULTISLICE_TPU_API_ENDPOINT`` (e.g. ``http://127.0.0.1:PORT``: a plain-http endpoint must be
loopback; it gets anonymous credentials unless a token or credentials are configured),
``MULTISLICE_TPU_POLL_SECONDS`` (first poll interval, default 10; it grows ×1.5 to
``MULTISLICE_TPU_MAX_POLL_SECONDS``, default 60), ``MULTISLICE_TPU_RETRY_INITIAL_SECONDS``
(default 1), ``MULTISLICE_TPU_RETRY_DEADLINE_SECONDS`` (default 300) and
``MULTISLICE_TPU_CONCURRENCY`` (node requests in flight, default 8).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import pulumi
from pulumi.dynamic import (
    CheckFailure,
    CheckResult,
    ConfigureRequest,
    CreateResult,
    DiffResult,
    ReadResult,
    ResourceProvider,
    UpdateResult,
)

from infra import credentials as gcp_credentials
from infra.backends.queued_resource.provider.api import TpuApi
from infra.backends.queued_resource.provider.completion import deleted_on_complete_outputs, new_run_reason
from infra.backends.queued_resource.provider.converge import converge
from infra.backends.queued_resource.provider.create import create
from infra.backends.queued_resource.provider.errors import (
    CredentialsRejected,
    QueuedResourceError,
    QueuedResourceFailed,
    QuotaOrPermissionError,
)
from infra.backends.queued_resource.provider.inputs import (
    INPUT_KEYS,
    OUTPUT_KEYS,
    PROVIDER_VERSION,
    REPLACE_KEYS,
    QueuedResourceInputs,
    check_failures,
    content_view,
    differs,
    with_current_keys,
)
from infra.backends.queued_resource.provider.nodes import DEFAULT_CONCURRENCY
from infra.backends.queued_resource.provider.polling import Deadline, PollSchedule, duration_text
from infra.backends.queued_resource.provider.refresh import read
from infra.backends.queued_resource.provider.states import FAILED_STATES
from infra.vm_contract import STARTUP_SCRIPT_KEY, STORAGE_ENDPOINT_ENV, TPU_API_ENDPOINT_ENV

#: The module existing stacks pickled the provider under (``infra/queued_resource.py`` once, now a
#: re-export of this package): the provider and the resource class name it as theirs.
PICKLED_MODULE = "infra.queued_resource"

__all__ = [
    "PICKLED_MODULE",
    "PROVIDER_VERSION",
    "CredentialsRejected",
    "QueuedResource",
    "QueuedResourceError",
    "QueuedResourceFailed",
    "QueuedResourceInputs",
    "QueuedResourceProvider",
    "QuotaOrPermissionError",
]


@dataclass
class QueuedResourceProvider(ResourceProvider):
    """Dynamic provider of :class:`QueuedResource` (see the module docstring).

    All fields are optional plain values (pickled with the provider); ``None`` means "the
    environment variable, else the default". ``progress`` receives progress lines (default:
    stderr, which the Pulumi CLI shows for dynamic providers run with ``--logtostderr``/verbose
    and which is never relied on for correctness). The stack's ``gcp:*`` credential settings
    arrive through :meth:`configure`, in the provider process, and are never pickled.
    """

    api_endpoint: str | None = None
    poll_seconds: float | None = None
    max_poll_seconds: float | None = None
    retry_initial_seconds: float | None = None
    retry_deadline_seconds: float | None = None
    progress: Callable[[str], None] | None = field(default=None, repr=False)

    serialize_as_secret_always = False  # nothing secret is captured

    def __getstate__(self) -> dict[str, Any]:
        """The pickled fields: never what :meth:`configure` received (the stack's secrets)."""
        return {k: v for k, v in self.__dict__.items() if k != "_gcp_config"}

    # settings ---------------------------------------------------------------------------

    def configure(self, req: ConfigureRequest) -> None:
        """Keep the stack's ``gcp:*`` credential settings (the engine sends a dynamic provider
        the whole stack config, secrets decrypted; see :mod:`infra.credentials`)."""
        self._gcp_config = {key: req.config.get(key) for key in gcp_credentials.SOURCES}

    def _credential_settings(self) -> gcp_credentials.CredentialSettings:
        return gcp_credentials.CredentialSettings.resolve(getattr(self, "_gcp_config", {}), os.environ)

    def _endpoint(self) -> str | None:
        return self.api_endpoint or os.environ.get(TPU_API_ENDPOINT_ENV) or None

    def _local(self) -> bool:
        """Whether the API is a local fake (a plain-http endpoint, which must be loopback)."""
        endpoint = self._endpoint()
        return bool(endpoint) and urlsplit(endpoint).scheme == "http"

    def _setting(self, value: float | None, env: str, default: float) -> float:
        """``value``, else ``$env`` (a positive finite number), else ``default``.

        Raises:
          ValueError: ``$env`` set to anything else, naming the variable (never ignored).
        """
        if value is not None:
            return float(value)
        raw = os.environ.get(env)
        if not raw:
            return default
        try:
            number = float(raw)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ValueError(f"{env}={raw[:40]!r} is not a positive number; unset it for the default {default:g}")
        return number

    def _say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(message)
        else:
            print(f"[multislice queued-resource] {message}", file=sys.stderr, flush=True)

    def _credentials(self, props: dict[str, Any]) -> Any | None:
        """The stack's credentials billed to its project; None against a local fake without
        explicit credentials (a local fake never gets ADC).

        Raises:
          CredentialsRejected: the configured credentials cannot be loaded.
        """
        settings = self._credential_settings()
        project = props.get("project")
        if self._local() and not settings.explicit:
            return None
        try:
            return gcp_credentials.load(
                settings,
                quota_project=settings.quota_project(project) if project else None,
                iam_endpoint=self._endpoint() if self._local() else None,
            )
        except gcp_credentials.CredentialsError as exc:
            raise CredentialsRejected(f"{props.get('queuedResourceId', 'queued resource')}: {exc}") from None

    def _deleted_on_complete(self, props: dict[str, Any], qr: Any | None) -> dict[str, Any] | None:
        """The outputs of a QR gone (``qr`` None) or DELETING while its run is complete: deleted on
        complete, converged (``completion.deleted_on_complete_outputs``); else None."""
        credentials = None if os.environ.get(STORAGE_ENDPOINT_ENV) else self._credentials(props)
        return deleted_on_complete_outputs(props, qr, credentials, self._say)

    def _api(self, props: dict[str, Any]) -> TpuApi:
        """A :class:`TpuApi` for the QR of ``props`` with this provider's settings and the
        stack's credentials, billed to its project (created per call: never pickled).

        Raises:
          CredentialsRejected: the configured credentials cannot be loaded.
        """
        settings = self._credential_settings()
        project = props.get("project")
        quota = settings.quota_project(project) if project else None
        credentials = self._credentials(props)
        first = self._setting(self.poll_seconds, "MULTISLICE_TPU_POLL_SECONDS", 10.0)
        cap = max(first, self._setting(self.max_poll_seconds, "MULTISLICE_TPU_MAX_POLL_SECONDS", 60.0))
        return TpuApi(
            client=TpuApi.client_for(self._endpoint(), credentials),
            schedule=PollSchedule(first=first, maximum=cap, multiplier=1.5),
            retry_initial_seconds=self._setting(
                self.retry_initial_seconds, "MULTISLICE_TPU_RETRY_INITIAL_SECONDS", 1.0
            ),
            retry_deadline_seconds=self._setting(
                self.retry_deadline_seconds, "MULTISLICE_TPU_RETRY_DEADLINE_SECONDS", 300.0
            ),
            say=self._say,
            project=project,
            quota_project=quota if credentials is not None else None,
            quota_origin=settings.quota_origin(),
            credentials=settings.describe(),
            concurrency=max(1, int(self._setting(None, "MULTISLICE_TPU_CONCURRENCY", DEFAULT_CONCURRENCY))),
        )

    # ResourceProvider -----------------------------------------------------------------------

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> CheckResult:
        failures = check_failures(news)
        problem = gcp_credentials.problem(
            self._credential_settings(), os.environ, require_credentials=not self._local()
        )
        if problem:  # no property: the engine prints "... resource 'queued-resource' has a problem: <problem>"
            failures.append(CheckFailure("", problem))
        return CheckResult(news, failures)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        # The startup script compares by its release id (the uncompressed content), not its bytes.
        olds, news = content_view(with_current_keys(olds)), content_view(news)
        if olds.get("deletedOnComplete"):
            # Gone because its run completed: nothing to do unless the inputs start a new run.
            reason = new_run_reason(olds, news)
            return DiffResult(
                changes=reason is not None, replaces=[reason] if reason else [], delete_before_replace=True
            )
        replaces = [k for k in REPLACE_KEYS if differs(olds.get(k), news.get(k))]
        if olds.get("state") in FAILED_STATES:
            replaces.append("state")
        if olds.get("lostNodes"):
            replaces.append("lostNodes")
        changed = [k for k in INPUT_KEYS if differs(olds.get(k), news.get(k))]
        pending = (
            olds.get("ready") is False
            or bool(olds.get("pendingNodeSync"))
            or bool(olds.get("pendingReset"))
            or olds.get("nodesInSync") is False
        )
        return DiffResult(
            changes=bool(replaces or changed or pending),
            replaces=replaces,
            delete_before_replace=True,  # fixed ids: the old QR must go before the new one
        )

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(*create(self._api(props), props, self._say))

    def read(self, id_: str, props: dict[str, Any]) -> ReadResult:
        return ReadResult(*read(self._api(props), id_, props, lambda qr: self._deleted_on_complete(props, qr)))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        api = self._api(news)
        return UpdateResult(converge(api, id_, olds, news, Deadline(float(news.get("createTimeoutSeconds") or 1800))))

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        api = self._api(props)
        deadline = Deadline(float(props.get("deleteTimeoutSeconds") or 1200))
        self._say(f"{props.get('queuedResourceId', id_)}: deleting (force: its nodes go with it)")
        try:
            gone = api.delete_and_wait(props, deadline)
        except Exception as exc:
            raise api.explain(exc, "deleting", props) from None
        if not gone:
            raise QueuedResourceError(
                f"queued resource {props.get('queuedResourceId', id_)!r} is still being deleted after "
                f"{duration_text(deadline.seconds)}; it stays in the stack: run the command again to keep waiting"
            )


class QueuedResource(pulumi.dynamic.Resource, module="tpu", name="QueuedResource"):
    """A Multislice queued resource (type ``pulumi-python:dynamic/tpu:QueuedResource``).

    Args:
      resource_name: Pulumi name.
      inputs: its properties, built by the program (``infra/__main__.py``) from the stack.
      opts: resource options; the startup script's diff is always hidden.
    """

    queuedResourceName: pulumi.Output[str]
    state: pulumi.Output[str]
    ready: pulumi.Output[bool]
    statusMessage: pulumi.Output[str]
    nodeNames: pulumi.Output[list[str]]
    nodes: pulumi.Output[list[dict[str, Any]]]
    deletedOnComplete: pulumi.Output[bool]

    def __init__(self, resource_name: str, inputs: QueuedResourceInputs, opts: pulumi.ResourceOptions | None = None):
        hidden = pulumi.ResourceOptions(hide_diffs=[f'metadata["{STARTUP_SCRIPT_KEY}"]'])
        super().__init__(
            QueuedResourceProvider(),
            resource_name,
            {**inputs.to_props(), **{key: None for key in OUTPUT_KEYS}},
            pulumi.ResourceOptions.merge(hidden, opts),
        )


# What dill writes into every stack (see the module docstring); set after the class bodies ran,
# since ``dataclass`` reads the module of the class it decorates.
QueuedResourceProvider.__module__ = PICKLED_MODULE
QueuedResource.__module__ = PICKLED_MODULE

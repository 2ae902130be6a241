"""The trainer log lines of a deployed stack, read from Cloud Logging.

``entries.list`` (https://cloud.google.com/logging/docs/reference/v2/rest/v2/entries/list)
through the ``google-cloud-logging`` client over REST, with the filter of
:func:`infra.logs.filter.trainer_filter`, oldest first. The client's ``Client.list_entries``
silently adds "the last 24 hours" to a filter without a ``timestamp`` clause; this module
calls its ``logging_api.list_entries`` instead, so the filter sent is exactly the one built.

``--follow`` polls: each poll asks again for the entries from :data:`LOOKBACK` before the
newest one seen (Cloud Logging may index an entry after a newer one: "entries might be
delayed", https://cloud.google.com/logging/docs/view/logging-query-language) and skips those
already printed by their ``insertId``. Cloud Logging allows 60 ``entries.list`` calls a
minute per project (https://cloud.google.com/logging/quotas), hence :data:`POLL_SECONDS`.
Google libraries are imported inside functions.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from infra.config import StackConfig
from infra.logs.filter import stack_filter, trainer_filter
from infra.logs.lines import LogLine, strip_prefix
from infra.vm_contract import LOGGING_ENDPOINT_ENV

#: Environment variable naming another Cloud Logging endpoint (a loopback fake in tests).
ENDPOINT_ENV = LOGGING_ENDPOINT_ENV
#: Hosts a plain-http endpoint may name (nothing leaves the machine).
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: Seconds between two ``--follow`` polls (12 of the 60 calls a minute allowed).
POLL_SECONDS = 5.0
#: How far before the newest entry seen a ``--follow`` poll starts.
LOOKBACK = timedelta(seconds=60)
#: Entries per ``entries.list`` page (the API's maximum is 1000).
PAGE_SIZE = 1000
#: ``orderBy`` of every list call.
OLDEST_FIRST = "timestamp asc"


class CloudLogsError(RuntimeError):
    """Cloud Logging refused or failed a call; the one-line message says what to do."""


def is_loopback(endpoint: str | None) -> bool:
    """Whether ``endpoint`` is a plain-http loopback address (a local fake)."""
    if not endpoint:
        return False
    parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
    return parts.scheme == "http" and parts.hostname in LOOPBACK_HOSTS


def _config_map(path: Path) -> dict:
    """The stack file's config map as ``pulumi up`` hands it over (its ``gcp:*`` credential keys, a map as
    its JSON text, as pulumi-gcp gets it); empty if unreadable."""
    from infra.config import StackConfigError, pulumi_config_of_file

    try:
        return pulumi_config_of_file(path)
    except StackConfigError:
        return {}


def credentials_for(config: StackConfig, stack_path: Path, endpoint: str | None) -> Any:
    """The caller's Google credentials, as the provider takes them (infra/credentials.py, with
    the ``gcp:*`` keys of the stack file ``stack_path``); None for a loopback fake without
    configured credentials.

    Raises:
      infra.credentials.CredentialsError: there are none (one line naming what to set), or they cannot be loaded.
    """
    from infra import credentials as gcp

    settings = gcp.CredentialSettings.resolve(_config_map(stack_path), os.environ)
    local = is_loopback(endpoint)
    problem = gcp.problem(settings, os.environ, require_credentials=not local)
    if problem:
        raise gcp.CredentialsError(problem)
    if local and not settings.explicit:
        return None
    return gcp.load(settings, quota_project=settings.quota_project(config.project))


def client_for(project: str, credentials: Any = None, endpoint: str | None = None) -> Any:
    """A REST ``google.cloud.logging_v2.Client`` of ``project`` at the public endpoint, or at
    ``endpoint``. A plain-http endpoint must be a loopback address and gets anonymous
    credentials unless ``credentials`` are given.

    Raises:
      CloudLogsError: a plain-http endpoint that is not a loopback address.
    """
    from google.auth.credentials import AnonymousCredentials
    from google.cloud.logging_v2.client import Client

    options = None
    if endpoint:
        if endpoint.startswith("http://") and not is_loopback(endpoint):
            raise CloudLogsError(f"{ENDPOINT_ENV}={endpoint}: a plain-http endpoint must be a loopback address")
        if is_loopback(endpoint) and credentials is None:
            credentials = AnonymousCredentials()
        options = {"api_endpoint": endpoint}
    return Client(project=project, credentials=credentials, client_options=options, _use_grpc=False)


def explain(err: Exception, project: str) -> str:
    """One line for a failed Cloud Logging call (what to do about it when that is known)."""
    code = getattr(err, "code", None)
    message = getattr(err, "message", None) or str(err)
    message = " ".join(str(message).split())
    if code == 403:
        return (
            f"Cloud Logging refused to list entries in project {project} ({message}): the caller needs "
            "roles/logging.viewer there, and the Cloud Logging API must be enabled"
        )
    if code == 401:
        return f"Cloud Logging rejected the credentials ({message}); renew them (gcloud auth application-default login)"
    return f"Cloud Logging entries.list in project {project} failed: {type(err).__name__}: {message}"


def entry_line(entry: Any) -> LogLine | None:
    """The :class:`LogLine` of one ``LogEntry`` written by the VMs (None without slice/worker)."""
    labels = dict(entry.labels or {})
    resource_labels = dict(getattr(entry.resource, "labels", None) or {})
    try:
        slice_id = int(labels["slice"])
        worker = int(labels["worker"] if "worker" in labels else resource_labels["worker_id"])
    except (KeyError, TypeError, ValueError):
        return None
    payload = entry.payload
    text = payload if isinstance(payload, str) else json.dumps(payload, sort_keys=True, default=str)
    return LogLine(slice_id, worker, strip_prefix(str(text).rstrip("\n")), entry.timestamp)


@dataclass
class CloudTail:
    """The trainer's lines of ``config``'s run in Cloud Logging, poll by poll.

    Args:
      client: a ``google.cloud.logging_v2.Client`` (:func:`client_for`).
      slice_id, worker, since, run: as :func:`infra.logs.filter.trainer_filter`.
    """

    client: Any
    config: StackConfig
    slice_id: int | None = None
    worker: int | None = None
    since: datetime | None = None
    run: str | None = None
    #: The filter of the last call (what was sent).
    last_filter: str = ""
    _newest: datetime | None = None
    _seen: dict[str, datetime] = field(default_factory=dict)

    def poll(self) -> list[LogLine]:
        """The entries not returned before (every matching one, the first time), oldest first.

        Raises:
          CloudLogsError: the call failed (the message says why).
        """
        since = self.since
        if self._newest is not None:
            since = max(since, self._newest - LOOKBACK) if since is not None else self._newest - LOOKBACK
        self.last_filter = trainer_filter(
            self.config, slice_id=self.slice_id, worker=self.worker, since=since, run=self.run
        )
        lines = []
        for entry in self._list(self.last_filter):
            key = entry.insert_id or f"{entry.timestamp}/{entry.payload}"
            if key in self._seen:
                continue
            self._seen[key] = entry.timestamp
            line = entry_line(entry)
            if line is not None:
                lines.append(line)
            if entry.timestamp is not None and (self._newest is None or entry.timestamp > self._newest):
                self._newest = entry.timestamp
        if self._newest is not None:  # forget what can no longer come back
            horizon = self._newest - LOOKBACK
            self._seen = {k: t for k, t in self._seen.items() if t is None or t >= horizon}
        return lines

    def any_entry(self) -> bool:
        """Whether Cloud Logging has any entry at all of the stack's TPU nodes (of any log, at
        any time in its retention; on the compute-engine backend any trainer line of its run:
        :func:`infra.logs.filter.stack_filter`): False for a stack that was never deployed.

        Raises:
          CloudLogsError: the call failed.
        """
        return bool(self._list(stack_filter(self.config), limit=1))

    def _list(self, filter_: str, limit: int | None = None) -> list[Any]:
        from google.api_core import exceptions
        from google.auth import exceptions as auth_exceptions

        try:
            return list(
                self.client.logging_api.list_entries(
                    resource_names=[f"projects/{self.config.project}"],
                    filter_=filter_,
                    order_by=OLDEST_FIRST,
                    page_size=limit or PAGE_SIZE,
                    max_results=limit,
                )
            )
        except (exceptions.GoogleAPIError, auth_exceptions.GoogleAuthError, OSError) as err:
            raise CloudLogsError(explain(err, self.config.project)) from None

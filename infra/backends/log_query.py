"""What every backend's Cloud Logging filter shares: the trainer's log and time bounds.

The trainer's lines are written by ``training/log_shipping.py`` on every VM to the log
:data:`TRAINER_LOG`, with the entry labels ``slice``, ``worker`` and ``run`` (the run name), under
the monitored resource of the backend's VMs (each backend's filter: :mod:`infra.logs.filter`).
Filter syntax: https://cloud.google.com/logging/docs/view/logging-query-language (``timestamp``
compares as an RFC 3339 string).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from infra import vm_contract as contract

#: The log id of the trainer's lines (``projects/<project>/logs/<id>``); training/log_shipping.py
#: writes it (``LOG_NAME`` there; tests/training/test_log_shipping.py keeps the two equal).
TRAINER_LOG = contract.TRAINER_LOG


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def narrowed(
    base: str,
    slices: int,
    *,
    slice_id: int | None,
    worker: int | None,
    since: datetime | None,
    slice_clause: Callable[[int], str],
    worker_clause: Callable[[int], str],
) -> str:
    """``base`` narrowed to one slice and/or one worker (each backend's own clause for them) and
    to entries at or after ``since``.

    Raises:
      IndexError: ``slice_id`` is not one of the stack's ``slices``.
    """
    clauses = [base]
    if slice_id is not None:
        if not 0 <= slice_id < slices:
            raise IndexError(f"slice {slice_id} of {slices}")
        clauses.append(slice_clause(slice_id))
    if worker is not None:
        clauses.append(worker_clause(worker))
    if since is not None:
        clauses.append(f'timestamp>="{rfc3339(since)}"')
    return " AND ".join(clauses)

"""What every backend's Cloud Logging filter shares: the trainer's log and time bounds.

The trainer's lines are written by ``training/log_shipping.py`` on every VM to the log
:data:`TRAINER_LOG`, with the entry labels ``slice``, ``worker`` and ``run`` (the run name), under
the monitored resource of the backend's VMs (each backend's filter: :mod:`infra.logs.filter`).
Filter syntax: https://cloud.google.com/logging/docs/view/logging-query-language (``timestamp``
compares as an RFC 3339 string).
"""

from __future__ import annotations

from datetime import UTC, datetime

from infra.startup import contract

#: The log id of the trainer's lines (``projects/<project>/logs/<id>``); training/log_shipping.py
#: writes it (``LOG_NAME`` there; tests/training/test_log_shipping.py keeps the two equal).
TRAINER_LOG = contract.TRAINER_LOG


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

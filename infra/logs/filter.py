"""Cloud Logging filters for a stack's TPU VM logs (no Google import: the Pulumi program and
``multislice logs`` build the same text).

TPU VM logs have the monitored resource type ``tpu_worker`` with the labels ``project_id``,
``zone``, ``node_id`` and ``worker_id`` (https://cloud.google.com/logging/docs/api/v2/resource-list).
The trainer's lines are written by ``training/log_shipping.py`` on every VM to the log
:data:`TRAINER_LOG` with that resource (node = the VM's slice, worker = its worker number)
and the labels ``slice``, ``worker`` and ``run`` (the run name). Filter syntax:
https://cloud.google.com/logging/docs/view/logging-query-language (``timestamp`` compares as
an RFC 3339 string).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from infra.config import StackConfig
from infra.startup import contract

#: The log id of the trainer's lines (``projects/<project>/logs/<id>``); training/log_shipping.py
#: writes it (``LOG_NAME`` there; tests/training/test_log_shipping.py keeps the two equal).
TRAINER_LOG = contract.TRAINER_LOG


def resource_filter(project: str, zone: str, nodes: Sequence[str]) -> str:
    """The ``tpu_worker`` entries of ``nodes`` (TPU node ids) in ``project`` and ``zone``."""
    node_list = " OR ".join(f'"{node}"' for node in nodes)
    return (
        'resource.type="tpu_worker"'
        f' AND resource.labels.project_id="{project}"'
        f' AND resource.labels.zone="{zone}"'
        f" AND resource.labels.node_id=({node_list})"
    )


def logging_filter(config: StackConfig) -> str:
    """Cloud Logging filter for the VM logs of this stack's nodes (every worker of every slice;
    the trainer's lines start with ``[slice S worker W]`` on the VM's console and carry the
    labels ``slice``/``worker``/``run`` in Cloud Logging). The Pulumi program exports it as
    ``loggingFilter``."""
    return resource_filter(config.project, config.zone, config.node_ids)


def rfc3339(moment: datetime) -> str:
    """``moment`` in UTC as ``YYYY-MM-DDTHH:MM:SS.ffffffZ`` (a naive datetime is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def trainer_filter(
    config: StackConfig,
    *,
    slice_id: int | None = None,
    worker: int | None = None,
    since: datetime | None = None,
    run: str | None = None,
) -> str:
    """The trainer's lines of the stack's run ``run`` (default: the stack's run name), of one
    slice (its node) and/or one worker, at or after ``since``.

    The caller checks ``slice_id`` and ``worker`` against the stack (``IndexError`` otherwise).
    """
    nodes = config.node_ids if slice_id is None else [config.node_ids[slice_id]]
    clauses = [
        resource_filter(config.project, config.zone, nodes),
        f'logName="projects/{config.project}/logs/{TRAINER_LOG}"',
        f'labels.run="{run if run is not None else config.effective_run_name}"',
    ]
    if worker is not None:
        clauses.append(f'resource.labels.worker_id="{worker}"')
    if since is not None:
        clauses.append(f'timestamp>="{rfc3339(since)}"')
    return " AND ".join(clauses)

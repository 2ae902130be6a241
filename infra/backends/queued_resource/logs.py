"""The queued-resource backend's Cloud Logging filters.

TPU VM logs have the monitored resource type ``tpu_worker`` with the labels ``project_id``,
``zone``, ``node_id`` and ``worker_id`` (https://cloud.google.com/logging/docs/api/v2/resource-list);
the trainer's lines (:data:`infra.backends.log_query.TRAINER_LOG`) carry that resource (node = the VM's
slice, worker = its worker number) and the labels ``slice``, ``worker`` and ``run``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from infra.backends.log_query import TRAINER_LOG, rfc3339


def resource_filter(project: str, zone: str, nodes: Sequence[str]) -> str:
    """The ``tpu_worker`` entries of ``nodes`` (TPU node ids) in ``project`` and ``zone``."""
    node_list = " OR ".join(f'"{node}"' for node in nodes)
    return (
        'resource.type="tpu_worker"'
        f' AND resource.labels.project_id="{project}"'
        f' AND resource.labels.zone="{zone}"'
        f" AND resource.labels.node_id=({node_list})"
    )


def trainer_filter(
    config,
    *,
    slice_id: int | None = None,
    worker: int | None = None,
    since: datetime | None = None,
    run: str | None = None,
) -> str:
    """The trainer's lines of run ``run`` (default: the stack's run name) of one slice (its node)
    and/or one worker, at or after ``since``."""
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

"""Cloud Logging filters for a stack's TPU VM logs (no Google import: the Pulumi program and
``multislice logs`` build the same text).

TPU VM logs have the monitored resource type ``tpu_worker`` with the labels ``project_id``,
``zone``, ``node_id`` and ``worker_id`` (https://cloud.google.com/logging/docs/api/v2/resource-list).
The trainer's lines are written by ``training/log_shipping.py`` on every VM to the log
:data:`TRAINER_LOG` with that resource (node = the VM's slice, worker = its worker number)
and the labels ``slice``, ``worker`` and ``run`` (the run name). Filter syntax:
https://cloud.google.com/logging/docs/view/logging-query-language (``timestamp`` compares as
an RFC 3339 string).

On the compute-engine backend (``multislice:backend: compute-engine``) the VMs are Compute
Engine instances, whose monitored resource is ``gce_instance`` with the labels ``project_id``,
``instance_id`` (a number) and ``zone`` (the ``MonitoredResource`` reference:
https://cloud.google.com/monitoring/api/ref_v3/rest/Shared.Types/MonitoredResource, and
https://cloud.google.com/logging/docs/api/v2/resource-list). No documented resource label names
the instance, its group or the stack, and the instance ids are only known once the groups made
them, so the stack's trainer lines are told by the entry labels the trainer writes on every VM:
``run`` (the run name), ``slice`` and ``worker`` (:func:`compute_engine_filter`). The VMs'
log shipping must write the trainer's lines to :data:`TRAINER_LOG` with that resource and those
labels (training/log_shipping.py).
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


#: ``resource.type`` of a Compute Engine VM's entries (see the module docstring).
GCE_INSTANCE = "gce_instance"


def compute_engine_filter(config: StackConfig, run: str | None = None) -> str:
    """The trainer's lines of run ``run`` (default: the stack's run name) on the stack's Compute
    Engine VMs: ``gce_instance`` entries in the stack's project and zone, of the log
    :data:`TRAINER_LOG`, labelled with the run (see the module docstring)."""
    return " AND ".join(
        (
            f'resource.type="{GCE_INSTANCE}"',
            f'resource.labels.project_id="{config.project}"',
            f'resource.labels.zone="{config.zone}"',
            f'logName="projects/{config.project}/logs/{TRAINER_LOG}"',
            f'labels.run="{run if run is not None else config.effective_run_name}"',
        )
    )


def stack_filter(config: StackConfig) -> str:
    """Any entry of the stack's VMs: its TPU nodes' (:func:`resource_filter`), or on the
    compute-engine backend its run's trainer lines (:func:`compute_engine_filter`)."""
    if config.backend == "compute-engine":
        return compute_engine_filter(config)
    return resource_filter(config.project, config.zone, config.node_ids)


def logging_filter(config: StackConfig) -> str:
    """Cloud Logging filter for the VM logs of this stack's nodes (every worker of every slice;
    the trainer's lines start with ``[slice S worker W]`` on the VM's console and carry the
    labels ``slice``/``worker``/``run`` in Cloud Logging); on the compute-engine backend the
    trainer's lines of the stack's run (see the module docstring). The Pulumi program exports it
    as ``loggingFilter``."""
    return stack_filter(config)


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
    slice (its node; on the compute-engine backend its ``slice`` label) and/or one worker, at or
    after ``since``.

    The caller checks ``slice_id`` and ``worker`` against the stack (``IndexError`` otherwise).
    """
    if config.backend == "compute-engine":
        clauses = [compute_engine_filter(config, run)]
        if slice_id is not None:
            if not 0 <= slice_id < config.slices:
                raise IndexError(f"slice {slice_id} of {config.slices}")
            clauses.append(f'labels.slice="{slice_id}"')
        if worker is not None:
            clauses.append(f'labels.worker="{worker}"')
        if since is not None:
            clauses.append(f'timestamp>="{rfc3339(since)}"')
        return " AND ".join(clauses)
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

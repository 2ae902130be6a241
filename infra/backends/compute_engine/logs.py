"""The compute-engine backend's Cloud Logging filters.

The VMs are Compute Engine instances, whose monitored resource is ``gce_instance`` with the labels
``project_id``, ``instance_id`` (a number) and ``zone`` (the ``MonitoredResource`` reference:
https://cloud.google.com/monitoring/api/ref_v3/rest/Shared.Types/MonitoredResource, and
https://cloud.google.com/logging/docs/api/v2/resource-list). No documented resource label names
the instance, its group or the stack, and the instance ids are only known once the groups made
them, so the stack's trainer lines are told by the entry labels the trainer writes on every VM:
``run`` (the run name), ``slice`` and ``worker`` (:func:`compute_engine_filter`). The VMs' log
shipping writes the trainer's lines to :data:`~infra.backends.log_query.TRAINER_LOG` with that resource
and those labels (training/log_shipping.py).
"""

from __future__ import annotations

from datetime import datetime

from infra.backends.log_query import TRAINER_LOG, narrowed

#: ``resource.type`` of a Compute Engine VM's entries (see the module docstring).
GCE_INSTANCE = "gce_instance"


def compute_engine_filter(config, run: str | None = None) -> str:
    """The trainer's lines of run ``run`` (default: the stack's run name) on the stack's Compute
    Engine VMs: ``gce_instance`` entries in the stack's project and zone, of the log
    :data:`~infra.backends.log_query.TRAINER_LOG`, labelled with the run (see the module docstring)."""
    return " AND ".join(
        (
            f'resource.type="{GCE_INSTANCE}"',
            f'resource.labels.project_id="{config.project}"',
            f'resource.labels.zone="{config.zone}"',
            f'logName="projects/{config.project}/logs/{TRAINER_LOG}"',
            f'labels.run="{run if run is not None else config.effective_run_name}"',
        )
    )


def trainer_filter(
    config,
    *,
    slice_id: int | None = None,
    worker: int | None = None,
    since: datetime | None = None,
    run: str | None = None,
) -> str:
    """The trainer's lines of run ``run`` of one slice (its ``slice`` label) and/or one worker, at or
    after ``since``.

    Raises:
      IndexError: ``slice_id`` is not a slice of the stack.
    """
    return narrowed(
        compute_engine_filter(config, run),
        config.slices,
        slice_id=slice_id,
        worker=worker,
        since=since,
        slice_clause=lambda s: f'labels.slice="{s}"',
        worker_clause=lambda w: f'labels.worker="{w}"',
    )

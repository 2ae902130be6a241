"""Cloud Logging filters for a stack's TPU VM logs, whatever its backend (no Google import: the
Pulumi program and ``multislice logs`` build the same text).

The trainer's lines are written by ``training/log_shipping.py`` on every VM to the log
:data:`TRAINER_LOG` with the labels ``slice``, ``worker`` and ``run`` (the run name), under the
monitored resource of the backend's VMs: ``tpu_worker`` for a queued resource's
(:mod:`infra.backends.queued_resource.logs`), ``gce_instance`` for Compute Engine's
(:mod:`infra.backends.compute_engine.logs`). Each backend builds its own filter
(:meth:`infra.backends.interface.Backend.trainer_filter`); this module asks the stack's.
Filter syntax: https://cloud.google.com/logging/docs/view/logging-query-language.
"""

from __future__ import annotations

from datetime import datetime

from infra.backends.log_query import TRAINER_LOG, rfc3339
from infra.backends.operations import backend_of
from infra.config import StackConfig

__all__ = ["TRAINER_LOG", "logging_filter", "rfc3339", "stack_filter", "trainer_filter"]


def stack_filter(config: StackConfig) -> str:
    """Any entry of the stack's VMs (its backend's :meth:`~infra.backends.interface.Backend.logging_filter`)."""
    return backend_of(config).logging_filter(config)


def logging_filter(config: StackConfig) -> str:
    """Cloud Logging filter for the VM logs of this stack (every worker of every slice; the
    trainer's lines start with ``[slice S worker W]`` on the VM's console and carry the labels
    ``slice``/``worker``/``run`` in Cloud Logging). The Pulumi program exports it as ``loggingFilter``."""
    return stack_filter(config)


def trainer_filter(
    config: StackConfig,
    *,
    slice_id: int | None = None,
    worker: int | None = None,
    since: datetime | None = None,
    run: str | None = None,
) -> str:
    """The trainer's lines of the stack's run ``run`` (default: the stack's run name), of one
    slice and/or one worker, at or after ``since``.

    The caller checks ``slice_id`` and ``worker`` against the stack (``IndexError`` otherwise).
    """
    return backend_of(config).trainer_filter(config, slice_id=slice_id, worker=worker, since=since, run=run)

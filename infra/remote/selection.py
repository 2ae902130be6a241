"""Which workers a command runs on: every worker of the stack's queued resource, or those of
``--slice`` and ``--worker``, checked against the stack before anything starts."""

from __future__ import annotations

from dataclasses import dataclass


class RemoteError(Exception):
    """``exec`` / ``reset`` cannot go on: one line naming the cause, and the exit status (2 bad
    input or a stack in no state for it, 1 a failure on the way). Nothing was started."""

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Worker:
    """One TPU VM: its slice index, its worker index in the slice, and its slice's node id."""

    slice_id: int
    worker: int
    node: str

    @property
    def name(self) -> str:
        return f"slice {self.slice_id} worker {self.worker}"


def select_workers(config, slice_id: int | None = None, worker: int | None = None) -> list[Worker]:
    """The workers of ``config``'s queued resource (slices × workers per slice, node ids from
    ``StackConfig.node_ids``), in slice then worker order, narrowed to ``slice_id`` and
    ``worker`` when given.

    Raises:
      RemoteError: a slice or worker index the stack does not have (exit 2).
    """
    slices, workers = config.slices, config.workers_per_slice
    if slice_id is not None and not 0 <= slice_id < slices:
        raise RemoteError(
            f"--slice {slice_id}: stack {config.stack} has {slices} slice(s), "
            f"{'0' if slices == 1 else f'0-{slices - 1}'} ({config.accelerator_type} × {slices})"
        )
    if worker is not None and not 0 <= worker < workers:
        raise RemoteError(
            f"--worker {worker}: each slice of stack {config.stack} ({config.accelerator_type}) has {workers} "
            f"worker(s), {'0' if workers == 1 else f'0-{workers - 1}'}"
        )
    return [
        Worker(s, w, config.node_ids[s])
        for s in range(slices)
        for w in range(workers)
        if (slice_id is None or s == slice_id) and (worker is None or w == worker)
    ]

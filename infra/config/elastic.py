"""``multislice:elastic``: the slice counts a run may train on, and when it changes count.

A run whose stack sets ``minSlices`` below ``multislice:slices`` may go on with fewer slices while
one is lost, and return to the full count when it is back; unset, a lost slice stops the run
until it is back (the behaviour of every stack before this key).

The training stays the same at every count: the global batch, the step → data mapping and the
learning-rate schedule are the stack's. With ``n`` of ``N`` slices only the DCN data axis changes
(DCN fsdp, which shards the parameters, keeps its size), and each data-parallel replica runs its
share of the same global batch as equal microbatches no larger than the full count's (gradient
accumulation). So a count ``n`` is allowed where it is a multiple of ``parallelism.dcn`` fsdp×tensor
and the global batch splits evenly over the data-parallel size at ``n``: 3 slices of DCN data 3 may
train on 2 where the batch divides by 2 × the ICI data×fsdp. The rule is the trainer's own
(:func:`training.elastic.count_shape`), checked here before any resource exists. marin/levanter's
"limping multislice" keeps the global batch the same way (https://github.com/marin-community/marin,
``num_slices`` as a list of allowed counts).

Defaults: ``shrinkAfter`` 2 minutes (a Spot slice that the platform brings back sooner costs one
restart, not two) and ``growAfter`` 3 hours, marin's shortest interval between two scale-ups.

Bounds: ``shrinkAfter`` at least 30 s (:data:`MIN_SHRINK_AFTER_S`: a trainer's restart must not look
like a lost slice), each at most seven days (:data:`MAX_ELASTIC_WAIT_S`). While a lost slice is waited for, every
slice present is held, stopped and billed; and seven days is the longest run Google gives any TPU
capacity with a run limit (flex-start VMs and nodes "run for up to seven days":
https://cloud.google.com/compute/docs/instances/about-flex-start-vms, the limit of
``multislice:computeEngine.maxRunDuration`` and ``multislice:gke.maxRunDuration``), so a longer
``shrinkAfter`` is never shrinking (leave ``minSlices`` unset for that) and a longer ``growAfter``
never growing back within such a run. docs/faults.md, "Elastic slices", says the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from infra.durations import Duration, format_duration
from training import elastic as trainer_elastic
from training.config import TrainConfig
from training.validation import StrictModel, invalid

#: The longest ``shrinkAfter`` and ``growAfter``, seconds (module docstring).
MAX_ELASTIC_WAIT_S = 7 * 24 * 3600

#: The shortest ``shrinkAfter`` (seconds): the heartbeats' staleness window on a VM (three 10 s
#: intervals: training/heartbeats.py), which is also above a trainer's restart (systemd's
#: ``RestartSec`` 100 ms, the first backoff 1 s, the interpreter and imports up to the gate: 5–13 s on a
#: 2-core machine, benchmarks/restart_floor.py). Shorter, a member restarting into the next epoch is
#: taken for lost and the run changes count at every restart (docs/faults.md, "Elastic slices").
MIN_SHRINK_AFTER_S = 30

#: ``shrinkAfter``'s default (seconds).
DEFAULT_SHRINK_AFTER_S = 120
#: ``growAfter``'s default (seconds): marin's ``3h`` between scale-ups.
DEFAULT_GROW_AFTER_S = 3 * 3600


class ElasticSettings(StrictModel):
    """``multislice:elastic``: ``{minSlices, shrinkAfter, growAfter}`` (durations positive:
    :func:`infra.durations.parse_duration`, ``shrinkAfter`` at least :data:`MIN_SHRINK_AFTER_S`, each
    at most :data:`MAX_ELASTIC_WAIT_S`). Keys by their
    stack-file names only: ``min_slices`` is an unknown key that names ``minSlices``."""

    min_slices: int | None = Field(
        default=None,
        ge=1,
        alias="minSlices",
        description="Fewest slices the run trains on while others are lost; unset: every slice (not elastic).",
    )
    shrink_after: Duration = Field(
        default=DEFAULT_SHRINK_AFTER_S,
        alias="shrinkAfter",
        description="How long a lost slice may stay away before the others go on without it (30s to 7d).",
    )
    grow_after: Duration = Field(
        default=DEFAULT_GROW_AFTER_S,
        alias="growAfter",
        description="Least time after a change of count before the run grows back to a returned slice (≤ 7d).",
    )

    @field_validator("shrink_after", "grow_after")
    @classmethod
    def _within_bounds(cls, seconds: int, info: ValidationInfo) -> int:
        if info.field_name == "shrink_after" and seconds < MIN_SHRINK_AFTER_S:
            raise ValueError(
                f"{format_duration(seconds)} is shorter than {format_duration(MIN_SHRINK_AFTER_S)}, a heartbeat's "
                "staleness window and more than a trainer's restart: a slice restarting into the next epoch would "
                f"be taken for lost at every change; use {format_duration(MIN_SHRINK_AFTER_S)} or more"
            )
        if seconds <= MAX_ELASTIC_WAIT_S:
            return seconds
        why = (
            "the slices present wait that long for a lost one, held and billed; to never go on without it, leave "
            "minSlices unset"
            if info.field_name == "shrink_after"
            else "the run would never grow back within one; to train on fewer slices for good, lower multislice:slices"
        )
        raise ValueError(
            f"{format_duration(seconds)} is longer than 7d ({MAX_ELASTIC_WAIT_S} s), the longest run of any TPU "
            f"capacity with a run limit (flex-start): {why}"
        )


@dataclasses.dataclass(frozen=True)
class SliceCount:
    """One slice count a run may train on (:func:`training.elastic.count_shape`).

    Attributes:
      slices: the slices training together.
      microbatches: the trainer's microbatches per step at this count.
      microbatch_rows: sequences of one microbatch on one data-parallel replica (at most the full
        count's: the activations a chip holds do not grow).
      dcn_data: the DCN data axis at this count (DCN fsdp keeps its size).
      chips: chips training together.
    """

    slices: int
    microbatches: int
    microbatch_rows: int
    dcn_data: int
    chips: int


def slice_counts(training: TrainConfig, chips_per_slice: int, min_slices: int) -> list[SliceCount]:
    """The counts the trainer config ``training`` may train on, from its ``parallelism.dcn`` count down
    to ``min_slices``, most first (see the module docstring)."""
    counts = []
    for n in range(training.parallelism.dcn.product, min_slices - 1, -1):
        try:
            shape = trainer_elastic.count_shape(training, n)
        except trainer_elastic.NotACount:
            continue
        counts.append(SliceCount(n, shape.microbatches, shape.microbatch_rows, shape.dcn_data, n * chips_per_slice))
    return counts


def allowed(config: Any) -> list[SliceCount]:
    """The slice counts the stack ``config`` (a :class:`infra.config.StackConfig`) may train on: the
    full count alone unless ``multislice:elastic.minSlices`` is set."""
    minimum = config.slices if config.elastic.min_slices is None else config.elastic.min_slices
    return slice_counts(config.training, config.accelerator.chips, minimum)


def carried_out(config: Any) -> bool:
    """Whether the stack ``config``'s elastic settings are acted on: True for a stack that is not elastic;
    else where the trainer runs under a systemd unit (``BackendSpec.supervisor``), which restarts it as
    a job of the slices present (training/membership_gate.py); not in a container (gke: the JobSet's
    failure policy restarts every Job; docs/faults.md, "Elastic slices")."""
    if config.elastic.min_slices is None or config.elastic.min_slices >= config.slices:
        return True
    return config.backend_spec.supervisor == "systemd"


def check(config: Any) -> None:
    """Refuse a ``minSlices`` the stack cannot train on.

    Raises:
      PydanticCustomError: (:func:`training.validation.invalid`) at ``multislice:elastic.minSlices``:
        above ``multislice:slices``, below it with a workload command or on a backend that does not
        carry elastic slices out (:func:`carried_out`: gke), or a count the trainer cannot train on (not
        a multiple of DCN fsdp×tensor, or one the global batch does not split over), with the allowed counts.
    """
    minimum = config.elastic.min_slices
    if minimum is None:
        return
    key = "multislice:elastic.minSlices"
    if minimum > config.slices:
        raise invalid(key, f"{minimum} is above multislice:slices {config.slices}; use 1 to {config.slices}")
    if config.workload is not None and minimum < config.slices:
        raise invalid(
            key,
            f"{minimum}: elastic slices are carried out by the bundled trainer only; a workload command "
            "(multislice:workload) cannot be restarted as a job of fewer slices from our checkpoints: unset "
            'minSlices (docs/faults.md, "Elastic slices")',
        )
    if minimum < config.slices and not carried_out(config):
        raise invalid(
            key,
            f"{minimum}: elastic slices are not carried out on the {config.backend} backend: its trainer is a "
            "container's process, and a container that ends (on a lost peer, or to change the slice count) makes "
            "the JobSet restart every child Job, spending maxRestarts at each change; unset minSlices, and a lost "
            'slice stops the run until it is back (docs/faults.md, "Elastic slices")',
        )
    if config.workload is not None:
        return
    try:
        trainer_elastic.count_shape(config.training, minimum, prefix="multislice:training.")
    except trainer_elastic.NotACount as refused:
        counts = ", ".join(str(c.slices) for c in slice_counts(config.training, config.accelerator.chips, 1))
        raise invalid(
            key, f"{minimum}: {config.slices} slices cannot train as {minimum}: {refused}; allowed counts: {counts}"
        ) from None

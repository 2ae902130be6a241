"""The plan's slice counts (``multislice:elastic``): each count the run may train on, with its
gradient accumulation (microbatches per step and the sequences of one replica's microbatch) and
the tokens/s its chips can reach at most.

The ceiling is ``chips × peak FLOP/s per chip ÷ (6 × parameters)``: training costs about
``6N`` FLOPs per token for ``N`` parameters (forward and backward; Kaplan et al. 2020, "Scaling
Laws for Neural Language Models", arXiv:2001.08361, section 2.1; attention's share left out), so
at 100% MFU. A run reaches a fraction of it (its MFU: ``multislice status``); the ratio between
two counts is what the plan tells: fewer slices, proportionally fewer tokens/s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from infra.config import elastic

#: Where the ceiling's formula comes from (the plan's ``sources``).
PEAK_TOKENS_SOURCE = (
    "chips × peak_bf16_flops_per_chip ÷ (6 × parameters): 6N training FLOPs per token, Kaplan et al. 2020, "
    "arXiv:2001.08361 §2.1 (attention left out); at 100% MFU"
)


@dataclasses.dataclass(frozen=True)
class CountPlan:
    """One allowed slice count: ``slices``, ``dcn_data`` (the DCN data axis), ``microbatches`` (per
    step), ``microbatch_rows`` (sequences of one microbatch on one data-parallel replica), ``chips``
    and ``peak_tokens_per_s`` (tokens/s at 100% MFU, float)."""

    slices: int
    dcn_data: int
    microbatches: int
    microbatch_rows: int
    chips: int
    peak_tokens_per_s: float


@dataclasses.dataclass(frozen=True)
class ElasticPlan:
    """The counts the run may train on, most first, and (elastic stacks only) when it changes:
    ``shrink_after_s`` and ``grow_after_s`` in seconds, None for a stack that is not elastic."""

    counts: tuple[CountPlan, ...]
    shrink_after_s: int | None
    grow_after_s: int | None
    #: ``multislice:elastic.minSlices`` as the stack sets it (None: unset).
    min_slices: int | None = None


def elastic_plan(config: Any, parameters: int) -> ElasticPlan:
    """The :class:`ElasticPlan` of the validated stack ``config`` with ``parameters`` parameters."""
    peak = config.accelerator.generation.peak_bf16_flops_per_chip
    counts = tuple(
        CountPlan(c.slices, c.dcn_data, c.microbatches, c.microbatch_rows, c.chips, c.chips * peak / (6 * parameters))
        for c in elastic.allowed(config)
    )
    settings = config.elastic
    on = settings.min_slices is not None and settings.min_slices < config.slices
    return ElasticPlan(
        counts,
        settings.shrink_after if on else None,
        settings.grow_after if on else None,
        settings.min_slices,
    )


def _duration(seconds: int) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def describe(plan: ElasticPlan) -> str:
    """The plan's slice-count line."""
    shown = "; ".join(
        f"{c.slices} slice{'s' if c.slices > 1 else ''} (dcn data {c.dcn_data}): {c.microbatches} "
        f"microbatch{'es' if c.microbatches > 1 else ''} of {c.microbatch_rows} "
        f"sequence{'s' if c.microbatch_rows > 1 else ''} per replica, ≤ {c.peak_tokens_per_s:,.0f} tokens/s at 100% MFU"
        for c in plan.counts
    )
    if plan.shrink_after_s is None or plan.grow_after_s is None:
        why = (
            "multislice:elastic.minSlices is unset"
            if plan.min_slices is None
            else f"multislice:elastic.minSlices is {plan.min_slices}, every slice of the stack"
        )
        return f"slice counts: {shown} (not elastic: {why})"
    return (
        f"slice counts (multislice:elastic): {shown}; after {_duration(plan.shrink_after_s)} without a slice the "
        f"others go on, back to more at a checkpoint ≥ {_duration(plan.grow_after_s)} after the last change"
    )

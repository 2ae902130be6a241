"""The overview's batch inside HBM: which microbatch count and rematerialization policy let the
DCN minimum batch (:func:`infra.planner.dcn.min_tokens_per_replica`) fit a chip.

Data parallelism over DCN pays off only from a minimum batch per replica (Cloud TPU Multislice
overview, :data:`infra.planner.dcn.MULTISLICE_OVERVIEW`): for real models those tokens do not fit
HBM at once. The trainer's memory levers do not change the update (docs/model.md): gradient
accumulation over ``microbatches`` keeps one microbatch's activations (plus a float32 gradient
sum), and ``model.remat`` recomputes a layer's activations in the backward pass instead of
keeping them. :func:`dcn_batch_fit` prices the minimum batch with each ``remat`` in
:data:`REMAT_ORDER` and each microbatch count dividing the per-replica batch, with
:func:`infra.planner.memory.memory_per_chip`.

Cost order (cheapest first): microbatches add no FLOPs (the same rows, in smaller matmuls),
rematerialization adds recomputation (``dots_saveable``: the elementwise work between matmuls;
``full``: one more forward pass of every layer, about a third more FLOPs per step: the forward
is 2N of the 6N FLOPs per parameter and token, Chowdhery et al. 2022, arXiv:2204.02311,
Appendix B). So the choice is the first policy of :data:`REMAT_ORDER` that fits with some
microbatch count, with the fewest microbatches that fit. "Fits" is at most
:data:`infra.planner.memory.HBM_TIGHT_FRACTION` of HBM: the line the plan calls tight, since XLA
temporaries are not all in the estimate.
"""

from __future__ import annotations

import dataclasses
import math

from infra.planner.memory import HBM_TIGHT_FRACTION, memory_per_chip
from training.config import TrainConfig

__all__ = ["REMAT_ORDER", "BatchOption", "DcnBatchFit", "dcn_batch_fit"]

#: ``model.remat`` policies searched, cheapest (least recomputation) first.
REMAT_ORDER = ("none", "dots_saveable", "full")


@dataclasses.dataclass(frozen=True)
class BatchOption:
    """One setting for the minimum batch: ``remat`` and ``microbatches``, the estimate in bytes
    per chip (``memory_per_chip(...).total``) and whether it fits (≤ HBM_TIGHT_FRACTION × HBM)."""

    remat: str
    microbatches: int
    estimate_bytes_per_chip: int
    fits: bool


@dataclasses.dataclass(frozen=True)
class DcnBatchFit:
    """The DCN minimum batch against HBM.

    Attributes:
      global_batch_size: sequences per step: the minimum global tokens ÷ sequence_length,
        rounded up to a multiple of the data-parallel size (data × fsdp).
      per_replica_batch: sequences of one data-parallel shard (``global_batch_size ÷ (data ×
        fsdp)``), which ``microbatches`` must divide.
      at_stack_settings: the minimum batch at the stack's own ``remat`` and ``microbatches``
        (the stack's microbatch count if it divides the new per-replica batch, else 1).
      options: per policy of :data:`REMAT_ORDER`, the fewest microbatches that fit, or when none
        fits the most microbatches (its smallest estimate).
      choice: the cheapest option that fits (module docstring), or None when none does.
    """

    global_batch_size: int
    per_replica_batch: int
    at_stack_settings: BatchOption
    options: tuple[BatchOption, ...]
    choice: BatchOption | None


def _option(train: TrainConfig, capacity: int, remat: str, microbatches: int) -> BatchOption:
    model = train.model.model_copy(update={"remat": remat})
    variant = train.model_copy(update={"model": model, "microbatches": microbatches})
    total = memory_per_chip(variant, capacity).total
    return BatchOption(remat, microbatches, total, total <= HBM_TIGHT_FRACTION * capacity)


def dcn_batch_fit(train: TrainConfig, min_global_batch_tokens: float, hbm_capacity_bytes: int) -> DcnBatchFit:
    """Price the DCN minimum batch (``min_global_batch_tokens``, tokens per step over all
    replicas: ``DcnCheck.min_global_batch_tokens``) on ``train``'s mesh (see the module
    docstring).

    Raises:
      ValueError: a non-positive token count or capacity.
    """
    if not min_global_batch_tokens > 0:
        raise ValueError(f"min_global_batch_tokens must be positive; got {min_global_batch_tokens!r}")
    shards = train.parallelism.batch_shards
    batch = math.ceil(min_global_batch_tokens / train.sequence_length / shards) * shards
    per_replica = batch // shards
    at_batch = train.model_copy(update={"global_batch_size": batch})
    own = train.microbatches if per_replica % train.microbatches == 0 else 1
    stack_option = _option(at_batch, hbm_capacity_bytes, train.model.remat, own)
    divisors = [k for k in range(1, per_replica + 1) if per_replica % k == 0]
    options = []
    for remat in REMAT_ORDER:
        priced = None
        for k in divisors:
            priced = _option(at_batch, hbm_capacity_bytes, remat, k)
            if priced.fits:
                break
        assert priced is not None  # divisors holds 1 at least
        options.append(priced)
    choice = next((o for o in options if o.fits), None)
    return DcnBatchFit(batch, per_replica, stack_option, tuple(options), choice)

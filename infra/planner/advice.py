"""Advice on a plan: the Multislice overview's parallelism guidance, and preview warnings.

Source: the Cloud TPU Multislice overview (:data:`infra.planner.dcn.MULTISLICE_OVERVIEW`),
its parallelism rules and DCN arithmetic: tensor parallelism never crosses DCN; inside a slice
FSDP is almost always preferred to data parallelism (ICI is fast); over DCN start with pure
data parallelism, use FSDP over DCN to relieve memory (it costs DCN traffic and risks stalls
on a slow collective), and pipeline parallelism only when the other strategies would need a
too-large global batch (depth 2 with N/2 replicas, then 4 with N/4, until the DCN collectives
hide behind the backward compute); when adding slices, scale the global batch linearly.

Alternative meshes (FSDP instead of data parallelism) are built as whole stacks through
:class:`infra.config.StackConfig` validation, so every alternative the advice prices is one
the stack could use.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from infra import invocation
from infra.config import StackConfig
from infra.planner.dcn import operational_intensity
from infra.planner.levers import BatchOption, DcnBatchFit
from infra.planner.memory import HBM_TIGHT_FRACTION, memory_per_chip
from training.warning_text import WarningText, act, no_action

if TYPE_CHECKING:
    from infra.planner.result import Plan

__all__ = ["advisory_lines", "recommendations"]


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _variant(
    config: StackConfig, dcn: dict[str, int] | None = None, ici: dict[str, int] | None = None
) -> StackConfig | None:
    """``config`` with other DCN/ICI axis sizes, or None when that stack would be invalid."""
    par = config.training.parallelism
    training = config.training.model_dump() | {
        "parallelism": {"ici": par.ici.model_dump() | (ici or {}), "dcn": par.dcn.model_dump() | (dcn or {})}
    }
    try:
        return StackConfig.model_validate(config.model_dump(by_alias=True) | {"multislice:training": training})
    except ValueError:  # pydantic.ValidationError
        return None


def _round_up(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


def recommendations(p: Plan, config: StackConfig) -> tuple[str, ...]:
    """Advice for the plan ``p`` of ``config``, most urgent first: memory (over or tight on
    HBM), DCN (tensor = 1, pure data parallelism first, the batch the DCN check needs, the
    pipeline fallback), then ICI (FSDP over data parallelism)."""
    out: list[str] = []
    par, dcn, mem = p.parallelism, p.dcn, p.memory
    capacity = mem.capacity

    # Memory first: a job that does not fit does not run.
    if not mem.fits:
        out.append(
            f"over HBM: the estimate is {_gib(mem.total)} per chip against a capacity of {_gib(capacity)} "
            f"({mem.fraction:.0%}); {_memory_advice(p, config)}"
        )
    elif mem.fraction > HBM_TIGHT_FRACTION:
        out.append(
            f"tight on HBM: {mem.fraction:.0%} of {_gib(capacity)} before XLA temporaries; {_memory_advice(p, config)}"
        )

    # DCN: tensor parallelism never crosses DCN; start with pure data parallelism.
    out.append("dcn tensor parallelism is 1, as required (tensor parallelism never crosses DCN)")
    if p.slices > 1 and par.dcn.fsdp > 1:
        pure = _variant(config, dcn={"data": p.slices, "fsdp": 1})
        if pure is not None:
            pure_mem = memory_per_chip(pure.training, capacity)
            if pure_mem.fits:
                out.append(
                    f"start with pure data parallelism over DCN: dcn {{data: {p.slices}, fsdp: 1}} fits "
                    f"({_gib(pure_mem.total)} per chip); FSDP over DCN adds parameter all-gathers and gradient "
                    "reduce-scatters between slices (DCN traffic this plan does not model; risk of stalls on a "
                    "slow collective)"
                )
            else:
                out.append(
                    f"FSDP over DCN is justified by memory: pure data parallelism would need "
                    f"{_gib(pure_mem.total)} per chip; its DCN traffic is not modelled here"
                )
    if dcn.applies:
        # More than one replica: the global figures are set (DcnCheck.__post_init__).
        assert dcn.min_global_batch_tokens is not None and dcn.recommended_global_batch_tokens is not None
        replicas = dcn.replicas
        shards, seq = par.batch_shards, p.sequence_length
        need_seqs = _round_up(dcn.min_global_batch_tokens / seq, shards)
        margin_seqs = _round_up(dcn.recommended_global_batch_tokens / seq, shards)
        if dcn.dcn_bound:
            out.append(
                f"DCN-bound: {dcn.tokens_per_replica:,.0f} tokens per replica give an operational intensity of "
                f"{dcn.operational_intensity:,.0f} FLOP/bit < {dcn.arithmetic_intensity:,.0f} FLOP/bit; raise "
                f"global_batch_size to ≥ {need_seqs} sequences ({dcn.min_global_batch_tokens:,.0f} tokens global = "
                f"{dcn.min_tokens_per_replica:,.0f} per replica × {replicas} replicas), ≥ {margin_seqs} "
                f"({dcn.recommended_global_batch_tokens:,.0f} tokens global) with the Multislice overview's "
                f"{dcn.safety_margin:g}× margin; when adding slices, scale the global batch linearly"
            )
            if p.dcn_batch is not None:
                out.append(_dcn_batch_advice(p.dcn_batch, capacity))
            pipe = _pipeline_depth(p)
            if pipe:
                out.append(pipe)
        elif not dcn.meets_margin:
            out.append(
                f"compute-bound but below the Multislice overview's {dcn.safety_margin:g}× margin (DCN can drop "
                f"packets briefly): {dcn.tokens_per_replica:,.0f} tokens per replica, recommended ≥ "
                f"{dcn.recommended_tokens_per_replica:,.0f} per replica (global_batch_size ≥ {margin_seqs} "
                f"sequences, {dcn.recommended_global_batch_tokens:,.0f} tokens global)"
            )
        else:
            out.append(
                f"pure data parallelism over DCN is compute-bound with the Multislice overview's margin "
                f"({dcn.tokens_per_replica:,.0f} ≥ {dcn.recommended_tokens_per_replica:,.0f} tokens per replica)"
            )
    elif p.slices > 1:
        out.append(
            "no data parallelism over DCN (dcn.data = 1): the Multislice overview's DCN check does not apply; "
            "FSDP traffic over DCN is not modelled"
        )
    # ICI: FSDP is almost always preferred to data parallelism inside a slice.
    if par.ici.data > 1:
        out.append(
            f"inside a slice prefer FSDP to data parallelism (ICI is fast; ici.data is usually 1): try "
            f"ici {{data: 1, fsdp: {par.ici.data * par.ici.fsdp}, tensor: {par.ici.tensor}}}"
        )
    return tuple(out)


def _memory_advice(p: Plan, config: StackConfig) -> str:
    """How to get under HBM: more FSDP (ICI first, then over DCN), else smaller activations."""
    mem, par = p.memory, p.parallelism
    tips = []
    if par.ici.data > 1:
        v = _variant(config, ici={"data": 1, "fsdp": par.ici.data * par.ici.fsdp})
        if v is not None:
            tips.append(
                f"ici fsdp {par.ici.data * par.ici.fsdp} → {_gib(memory_per_chip(v.training, mem.capacity).total)}"
            )
    if p.slices > 1 and par.dcn.data > 1:
        for fsdp in range(2, par.dcn.data + 1):
            if par.dcn.data % fsdp:
                continue
            v = _variant(config, dcn={"data": par.dcn.data // fsdp, "fsdp": par.dcn.fsdp * fsdp})
            if v is not None and memory_per_chip(v.training, mem.capacity).fits:
                tips.append(
                    f"FSDP over DCN (the Multislice overview's second choice, to relieve memory): dcn {{data: "
                    f"{par.dcn.data // fsdp}, fsdp: {par.dcn.fsdp * fsdp}}} → "
                    f"{_gib(memory_per_chip(v.training, mem.capacity).total)}"
                )
                break
    if mem.activations > mem.total / 2:
        tips.append(
            f"activations dominate ({_gib(mem.activations)}): fewer sequences per chip or a shorter sequence_length"
        )
    return "; ".join(tips) or "a larger slice or a smaller model"


def _setting(o: BatchOption) -> str:
    return f"microbatches {o.microbatches} with remat {o.remat} → {_gib(o.estimate_bytes_per_chip)}"


def _dcn_batch_advice(fit: DcnBatchFit, capacity: int) -> str:
    """The DCN minimum batch against HBM: fits at the stack's settings, or the microbatch count
    and remat policy that fit it (:mod:`infra.planner.levers`), with the estimate for each."""
    own = fit.at_stack_settings
    head = (
        f"at the DCN minimum batch ({fit.global_batch_size} sequences, {fit.per_replica_batch} per data-parallel "
        f"shard) with the stack's {_setting(own)} per chip"
    )
    if own.fits:
        return f"{head}: fits in HBM ({_gib(capacity)})"
    options = "; ".join(_setting(o) + ("" if o.fits else " (does not fit)") for o in fit.options)
    if fit.choice is None:
        return (
            f"{head}: over HBM ({_gib(capacity)}), and no microbatch count dividing {fit.per_replica_batch} with "
            f"any remat policy fits ({options}): shard more (FSDP), use a larger slice or pipeline parallelism"
        )
    return (
        f"{head}: over HBM ({_gib(capacity)}); set microbatches: {fit.choice.microbatches} and model.remat: "
        f"{fit.choice.remat} (the cheapest that fits; per policy, the fewest microbatches that fit: {options})"
    )


def _pipeline_depth(p: Plan) -> str | None:
    """The overview's pipeline advice when the batch cannot grow: depth 2 with N/2 replicas,
    then 4 with N/4, until the per-replica batch clears the minimum."""
    replicas, tokens = p.dcn.replicas, p.global_batch_tokens
    depth = 2
    while depth <= replicas and replicas % depth == 0:
        left = replicas // depth
        if left < 2:
            return (
                f"only if the global batch cannot grow: pipeline parallelism over DCN (not implemented by this "
                f"trainer): depth {depth} makes the {replicas} replicas one pipeline, with no gradient all-reduce "
                "over DCN (only activations cross between stages; not modelled here)"
            )
        if operational_intensity(tokens / left, left) >= p.dcn.arithmetic_intensity:
            return (
                f"only if the global batch cannot grow: pipeline parallelism over DCN (not implemented by this "
                f"trainer) with depth {depth} and {left} replicas clears the minimum at the current batch"
            )
        depth *= 2
    return None


def advisory_lines(p: Plan) -> list[WarningText]:
    """Warnings for ``pulumi preview``/``up`` from the plan ``p``: one when the stack is predicted
    DCN-bound (no action needed: it trains, slower), one when the DCN minimum batch would not fit HBM
    at the stack's microbatches and remat (action needed if the batch is raised to it: the setting
    that fits, if any), one when its per-chip memory estimate exceeds HBM (action needed); empty when
    none. Each starts with the stack name and names the command that prints the full plan."""
    out: list[WarningText] = []
    plan = f"`{invocation.command('plan', p.stack)}`"
    if p.dcn.dcn_bound:
        out.append(
            no_action(
                f"stack {p.stack}: predicted DCN-bound: {p.dcn.tokens_per_replica:,.0f} tokens per DCN replica "
                f"(operational intensity {p.dcn.operational_intensity:,.0f} FLOP/bit) < the "
                f"{p.dcn.min_tokens_per_replica:,.0f} per replica needed on {p.accelerator_type} "
                f"(arithmetic intensity {p.dcn.arithmetic_intensity:,.0f} FLOP/bit)",
                f"it trains as declared, with DCN bounding its step time; {plan} says the "
                "multislice:training.global_batch_size that lifts the bound",
            )
        )
    fit = p.dcn_batch
    if fit is not None and not fit.at_stack_settings.fits:
        what = (
            f"stack {p.stack}: the DCN minimum batch ({fit.global_batch_size} sequences) would need an estimated "
            f"{_gib(fit.at_stack_settings.estimate_bytes_per_chip)} per chip at the stack's microbatches and remat"
        )
        when = "multislice:training.global_batch_size is raised to it"
        if fit.choice is not None:
            out.append(
                act(
                    what,
                    f"also set multislice:training.microbatches: {fit.choice.microbatches} and "
                    f"multislice:training.model.remat: {fit.choice.remat}, which bring it within HBM (an estimated "
                    f"{_gib(fit.choice.estimate_bytes_per_chip)} per chip; {plan})",
                    when=when,
                )
            )
        else:
            out.append(
                act(
                    f"{what}, and no microbatch count or remat policy brings it within HBM",
                    f"shard more (FSDP) or use a larger slice as {plan} says",
                    when=when,
                )
            )
    if not p.memory.fits:
        out.append(
            act(
                f"stack {p.stack}: predicted over HBM: an estimated {_gib(p.memory.total)} per chip > the "
                f"{_gib(p.memory.capacity)} HBM capacity of {p.accelerator_type}",
                f"bring the estimate within HBM before the run ({plan} says how)",
            )
        )
    return out

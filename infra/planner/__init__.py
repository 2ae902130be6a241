"""The sharding planner: will a stack scale over DCN, and does it fit in HBM?

Pure functions over a validated :class:`infra.config.StackConfig` and the TPU catalog
(:mod:`infra.accelerators`): no I/O, no devices. ``multislice plan`` prints :func:`plan`
(:mod:`infra.planner.render`), and the Pulumi program warns with :func:`advisories` during
``pulumi preview``/``up``.

Modules, each with the formulas and public sources of its figures:

* :mod:`infra.planner.dcn`: hardware and operational arithmetic intensity, the minimum batch
  and its margin, :class:`DcnCheck` (Cloud TPU Multislice overview, DCN arithmetic);
* :mod:`infra.planner.memory`: parameter shapes, activation bytes (Korthikanti et al. 2022,
  adapted), :class:`MemoryEstimate`;
* :mod:`infra.planner.levers`: the microbatch count and remat policy that fit the DCN minimum
  batch in HBM;
* :mod:`infra.planner.advice`: recommendations (the overview's parallelism rules) and the
  preview warnings;
* :mod:`infra.planner.render`: the rich rendering of a plan (imported by the CLI only).

* :mod:`infra.planner.result`: :class:`Plan`, the record of a plan, and its ``--json`` (made
  from the dataclass fields).

This module assembles them: :func:`plan` and :func:`advisories`. Both take a
:class:`~infra.config.StackConfig`, whose validation already guarantees what the arithmetic
relies on (1 ≤ slices ≤ 256, Multislice only on v4 and later, ICI product = chips per slice,
DCN product = slices, DCN tensor = 1, a global batch that splits over the mesh); nothing here checks those again.
"""

from __future__ import annotations

import dataclasses

from infra.components.apis import apis_for
from infra.config import StackConfig
from infra.planner import advice
from infra.planner.dcn import (
    BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN,
    MULTISLICE_OVERVIEW,
    SAFETY_MARGIN,
    DcnCheck,
    dcn_bits_per_parameter,
    dcn_check,
    hardware_arithmetic_intensity,
    min_tokens_per_replica,
    operational_intensity,
)
from infra.planner.elastic import PEAK_TOKENS_SOURCE, elastic_plan
from infra.planner.levers import dcn_batch_fit
from infra.planner.memory import (
    ACTIVATIONS_SOURCE,
    ESTIMATE_SOURCE,
    HBM_TIGHT_FRACTION,
    MemoryEstimate,
    activation_bytes_per_chip,
    memory_per_chip,
    parameter_shapes,
)
from infra.planner.result import Plan
from training.model.shapes import param_count
from training.warning_text import WarningText

__all__ = [
    "BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN",
    "HBM_TIGHT_FRACTION",
    "MULTISLICE_OVERVIEW",
    "SAFETY_MARGIN",
    "DcnCheck",
    "MemoryEstimate",
    "Plan",
    "activation_bytes_per_chip",
    "advisories",
    "dcn_bits_per_parameter",
    "dcn_check",
    "hardware_arithmetic_intensity",
    "memory_per_chip",
    "min_tokens_per_replica",
    "operational_intensity",
    "parameter_shapes",
    "plan",
]

_DCN_ARITHMETIC = f"{MULTISLICE_OVERVIEW} (DCN arithmetic)"
_PARALLELISM_RULES = f"{MULTISLICE_OVERVIEW} (parallelism rules)"


def plan(config: StackConfig, *, vocab_source: str | None = None) -> Plan:
    """The plan of the validated stack ``config``: its size and mesh, the per-chip memory
    estimate against the generation's HBM, the DCN check and the recommendations.

    ``vocab_source``: where ``training.model.vocab_size`` was filled in from when the stack
    leaves it unset (a prepared dataset's manifest: ``config`` is then
    :attr:`infra.config.dataset.DatasetCheck.config`); named in the plan's sources.

    Raises nothing for a valid ``StackConfig``: every rule the arithmetic needs is one of its
    validation rules (see the module docstring).
    """
    accelerator, train = config.accelerator, config.training
    gen = accelerator.generation
    src = gen.sources
    sources = {
        "peak_bf16_flops_per_chip": src["peak_bf16_flops_per_chip"],
        "dcn_bits_per_second_per_host": src["dcn_bits_per_second_per_host"]
        + (
            f"; per TPU VM of {accelerator.chips_per_host} chips: shared evenly by the physical host's "
            f"{gen.chips_per_physical_host} chips"
            if gen.chips_per_physical_host != accelerator.chips_per_host
            else ""
        ),
        "chips_per_host": src["chips_per_host"],
        "hbm_capacity_bytes_per_chip": src["hbm_bytes_per_chip"],
        "hbm_estimated_bytes_per_chip": ESTIMATE_SOURCE,
        "arithmetic_intensity": _DCN_ARITHMETIC + ": chips per host × peak FLOP/s per chip ÷ DCN bits/s per host",
        "operational_intensity": _DCN_ARITHMETIC
        + ": 4·B/32 (2 replicas) or 4·B/64 (more); B = tokens per replica (global batch tokens ÷ dcn.data)",
        "min_tokens_per_replica": _DCN_ARITHMETIC + ": AI × bits per parameter ÷ 4, the B at which 4·B/bits = AI; "
        "global: × replicas",
        "safety_margin": _DCN_ARITHMETIC
        + ': "≥ ~350,000 tokens per pod (two pods) to ~700,000 (many pods)" = 2 × the minimum tokens per replica',
        "activations": ACTIVATIONS_SOURCE,
        "parallelism_guidance": _PARALLELISM_RULES,
    }
    if vocab_source is not None:
        sources["vocab_size"] = f"{train.vocab_size:,} ids: {vocab_source}"
    dcn = dcn_check(accelerator, train.parallelism, train.global_batch_tokens)
    dcn_batch = None
    if dcn.dcn_bound:  # more than one replica: the minimum is set
        assert dcn.min_global_batch_tokens is not None
        dcn_batch = dcn_batch_fit(train, dcn.min_global_batch_tokens, gen.hbm_bytes_per_chip)
        sources["dcn_min_batch_in_hbm"] = (
            "the DCN minimum batch priced with each remat policy and microbatch count (infra/planner/levers.py), "
            f"fitting at most {HBM_TIGHT_FRACTION:.0%} of HBM"
        )
    parameters = param_count(train.model, train.vocab_size)
    if config.workload is None:
        sources["peak_tokens_per_s"] = PEAK_TOKENS_SOURCE
    partial = Plan(
        stack=config.stack,
        accelerator_type=accelerator.name,
        generation=gen.name,
        slices=config.slices,
        chips_per_slice=accelerator.chips,
        chips=config.slices * accelerator.chips,
        hosts_per_slice=accelerator.hosts,
        hosts=config.slices * accelerator.hosts,
        chips_per_host=accelerator.chips_per_host,
        parallelism=train.parallelism,
        parameters=parameters,
        sequence_length=train.sequence_length,
        global_batch_size=train.global_batch_size,
        global_batch_tokens=train.global_batch_tokens,
        dcn=dcn,
        memory=memory_per_chip(train, gen.hbm_bytes_per_chip),
        recommendations=(),
        sources=sources,
        dcn_batch=dcn_batch,
        capacity=config.backend_spec.capacity_plan(config),
        apis=apis_for(config.backend_spec.apis),
        elastic=None if config.workload is not None else elastic_plan(config, parameters),
    )
    return dataclasses.replace(partial, recommendations=advice.recommendations(partial, config))


def advisories(config: StackConfig) -> list[WarningText]:
    """Warnings for ``pulumi preview``/``up`` (:func:`infra.planner.advice.advisory_lines` of
    the stack's plan): one when the stack is predicted DCN-bound, one when the DCN minimum batch
    would not fit HBM, one when its per-chip memory estimate exceeds HBM; empty when none."""
    return advice.advisory_lines(plan(config))

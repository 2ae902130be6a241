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
* :mod:`infra.planner.advice`: recommendations (the overview's parallelism rules) and the
  preview warnings;
* :mod:`infra.planner.render`: the rich rendering of a plan (imported by the CLI only).

This module assembles them: :class:`Plan` (its ``--json`` made from the dataclass fields),
:func:`plan` and :func:`advisories`. Both take a :class:`~infra.config.StackConfig`, whose
validation already guarantees what the arithmetic relies on (1 ≤ slices ≤ 256, Multislice
only on v4 and later, ICI product = chips per slice, DCN product = slices, DCN tensor = 1, a
global batch that splits over the mesh); nothing here checks those again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

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
from infra.planner.memory import (
    ACTIVATIONS_SOURCE,
    ESTIMATE_SOURCE,
    HBM_TIGHT_FRACTION,
    MemoryEstimate,
    activation_bytes_per_chip,
    memory_per_chip,
    parameter_shapes,
)
from training.config import MESH_AXES, ParallelismConfig
from training.shapes import param_count

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


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything ``multislice plan`` reports about one stack.

    Attributes:
      stack, accelerator_type, generation: names.
      slices, chips_per_slice, chips, hosts_per_slice, hosts, chips_per_host: the job's size
        (hosts = TPU VMs, one process each).
      parallelism: the ICI and DCN axis sizes.
      mesh: derived from ``parallelism``: ``axis -> {"dcn": n, "ici": n, "size": n}`` for
        data, fsdp, tensor.
      parameters: parameter count (``training.shapes.param_count``).
      sequence_length, global_batch_size: sequences of tokens per step.
      global_batch_tokens: tokens per optimizer step over all slices.
      dcn: the DCN check.
      memory: per-chip memory estimate.
      recommendations: advice from the Multislice overview's parallelism guidance, most
        important first.
      sources: figure -> where it comes from.
    """

    stack: str
    accelerator_type: str
    generation: str
    slices: int
    chips_per_slice: int
    chips: int
    hosts_per_slice: int
    hosts: int
    chips_per_host: int
    parallelism: ParallelismConfig = dataclasses.field(metadata={"json": None})  # as "mesh"
    mesh: dict[str, dict[str, int]] = dataclasses.field(init=False)
    parameters: int
    sequence_length: int
    global_batch_size: int
    global_batch_tokens: int
    dcn: DcnCheck = dataclasses.field(metadata={"json": ""})
    memory: MemoryEstimate = dataclasses.field(metadata={"json": ""})
    recommendations: tuple[str, ...]
    sources: dict[str, str]

    def __post_init__(self) -> None:
        par = self.parallelism
        mesh = {
            axis: {"dcn": getattr(par.dcn, axis), "ici": getattr(par.ici, axis), "size": par.mesh_shape[axis]}
            for axis in MESH_AXES
        }
        object.__setattr__(self, "mesh", mesh)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``multislice plan --json``), made from the dataclass fields of the
        plan, of its :class:`DcnCheck` and of its :class:`MemoryEstimate` (see
        :func:`_json_document`)."""
        return _json_document(self)


def _json_document(obj: Any) -> dict[str, Any]:
    """The dataclass ``obj`` as a JSON-ready dict: one key per field, the field name or its
    ``metadata["json"]`` (a dotted key nests; None leaves the field out; ``""`` puts a nested
    dataclass's keys at this level). Nested dataclasses become objects, tuples become lists.

    Raises:
      ValueError: two fields map to the same key (a programming error).
    """
    out: dict[str, Any] = {}
    for path, value in _json_leaves(obj, ()):
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        if path[-1] in node:
            raise ValueError(f"two fields map to the JSON key {'.'.join(path)!r}")
        node[path[-1]] = value
    return out


def _json_leaves(obj: Any, prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Any]]:
    """``(key path, JSON value)`` of every field of the dataclass ``obj`` (see :func:`_json_document`)."""
    for field in dataclasses.fields(obj):
        key = field.metadata.get("json", field.name)
        if key is None:
            continue
        path = prefix + tuple(part for part in key.split(".") if part)
        value = getattr(obj, field.name)
        if dataclasses.is_dataclass(value):
            yield from _json_leaves(value, path)
        else:
            yield path, _json_value(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _json_value(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_json_value(item) for item in value]
    return value


def plan(config: StackConfig) -> Plan:
    """The plan of the validated stack ``config``: its size and mesh, the per-chip memory
    estimate against the generation's HBM, the DCN check and the recommendations.

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
        "safety_margin": _DCN_ARITHMETIC + ': "≥ ~350,000 tokens per pod (two pods) to ~700,000 (many pods)" = 2 × the minimum tokens per replica',
        "activations": ACTIVATIONS_SOURCE,
        "parallelism_guidance": _PARALLELISM_RULES,
    }
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
        parameters=param_count(train.model),
        sequence_length=train.sequence_length,
        global_batch_size=train.global_batch_size,
        global_batch_tokens=train.global_batch_tokens,
        dcn=dcn_check(accelerator, train.parallelism, train.global_batch_tokens),
        memory=memory_per_chip(train, gen.hbm_bytes_per_chip),
        recommendations=(),
        sources=sources,
    )
    return dataclasses.replace(partial, recommendations=advice.recommendations(partial, config))


def advisories(config: StackConfig) -> list[str]:
    """Warnings for ``pulumi preview``/``up`` (:func:`infra.planner.advice.advisory_lines` of
    the stack's plan): one line when the stack is predicted DCN-bound, one when its per-chip
    memory estimate exceeds HBM; empty when neither."""
    return advice.advisory_lines(plan(config))

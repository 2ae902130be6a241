"""The sharding planner: will a stack scale over DCN, and does it fit in HBM?

Pure functions over a validated :class:`infra.config.StackConfig` and the TPU catalog
(:mod:`infra.accelerators`): no I/O, no devices. ``multislice plan`` prints :func:`plan`,
and the Pulumi program warns with :func:`advisories` during ``pulumi preview``/``up``.

DCN arithmetic (SEED-NOTES.md, "DCN arithmetic", from the Cloud TPU Multislice overview)
-----------------------------------------------------------------------------------------

* Hardware arithmetic intensity ``AI = chips per host × peak FLOP/s per chip ÷ DCN
  bits/s per host`` (FLOP per bit). v4: 4 × 275e12 / 50e9 = 22,000. Every figure comes from
  the catalog: ``AcceleratorType.chips_per_host``, ``Generation.peak_bf16_flops_per_chip``
  and ``AcceleratorType.dcn_bits_per_second_per_host`` (their sources are in
  ``Generation.sources`` and are repeated in :attr:`Plan.sources`).
* With data parallelism over DCN, each step all-reduces every parameter's float32 gradient
  between the DCN replicas: 32 bits per parameter with 2 replicas, up to 64 with more
  (:func:`dcn_bits_per_parameter`).
* The backward pass costs 4·B FLOPs per parameter (of the 6·B·P of a transformer step), so
  the model's operational intensity is ``OI = 4·B / 32`` (2 replicas) or ``4·B / 64`` (more).
  The step is DCN-bound when ``OI < AI``; the minimum batch is ``AI × bits / 4`` tokens
  (v4: 176,000 for 2 slices, 352,000 for more), and the overview recommends a large margin
  because DCN can drop packets briefly: "data parallelism only at ≥ ~350,000 tokens per pod
  (two pods) to ~700,000 (many pods)", i.e. :data:`SAFETY_MARGIN` = 2 × the minimum.

**Which batch B is.** B is the number of tokens *one DCN replica* processes per step: the
global batch in tokens divided by ``parallelism.dcn.data`` (``global_batch_size ×
sequence_length / dcn.data``). With ``dcn.fsdp = 1`` a replica is one slice ("tokens per
pod" in the overview); with ``dcn.fsdp > 1`` it is a group of ``dcn.fsdp`` slices. This is the
only reading under which the Multislice overview's inequality compares like with like: a replica of n chips
computes ``4·B·P`` backward FLOPs in ``4·B·P / (n · peak)`` seconds while its n / chips-per-host
hosts move ``32·P`` bits in ``32·P / (n · DCN bits/s per chip)`` seconds, so compute hides the
all-reduce iff ``4·B/32 ≥ peak / DCN per chip = AI``. The *global* batch is B × replicas (the
seed's "scale the global batch linearly" with the number of slices). The number of replicas
taking part in the all-reduce (``dcn.data``) chooses 32 or 64 bits. The traffic of FSDP over
DCN (``dcn.fsdp > 1``: parameter all-gathers and gradient reduce-scatters between the slices
of a group) is not covered by the Multislice overview's formula and is not modelled; the plan says so.

Memory per chip
---------------

Parameters, gradients and optimizer state are float32 (``training.model``,
``training.optimizer``: AdamW keeps two float32 moments, ``mu`` and ``nu``, shaped like the
parameters; its int32 step counters are ignored). All three are sharded exactly like the
parameters: each dimension's logical axis (``training.model.logical_axes``) is split over the
mesh axes ``training.mesh.LOGICAL_AXIS_RULES`` assigns it (``embed`` over fsdp; ``heads``,
``mlp``, ``vocab`` over tensor), as ``training.train`` shards its state. Parameter shapes are
taken from ``training.model.init_params`` with ``jax.eval_shape`` (no arrays are made).

Activations are the tensors autodiff keeps for the backward pass (``training.train`` does no
rematerialization), adapted from Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models" (arXiv:2205.05198), §4.1: ``s·b·h·(34 + 5·a·s/h)`` bytes per layer
for 16-bit activations with dropout, ``s·b·h·(10 + 24/t + 5·a·s/(h·t))`` with t-way tensor
parallelism. This model has no dropout (the two dropout masks, ``2·s·b·h`` bytes, and the
dropout output go), computes the attention scores and the softmax in float32 and casts the
probabilities to ``compute_dtype``, and its MLP width is ``d_ff`` (not always 4h). With
``e`` bytes per element of ``compute_dtype``, ``b`` sequences per chip (``global_batch_size ÷
(data × fsdp)``), ``s`` = sequence_length, ``h`` = d_model, ``f`` = d_ff, ``a`` = heads and t the
tensor axis size, :func:`activation_bytes_per_chip` counts per layer

* replicated over tensor: ``4·e·s·b·h`` (the two norm inputs and the two norm outputs that
  feed the QKV and MLP-in matmuls);
* split over tensor: ``(4·e·s·b·h + 2·e·s·b·f + a·s²·b·(4 + e′)) / t`` (q and k after RoPE, v,
  the attention output feeding ``wo``; the GELU input and output; the float32 softmax output
  plus, when ``compute_dtype`` is not float32, its ``e′ = e``-byte cast);

and once for the output layer ``2·e·s·b·h + 2·4·s·b·V / t`` (final norm input, unembedding
input, float32 logits and log-probabilities over the V = 256 byte vocabulary). With
bfloat16 and f = 4h this is ``s·b·h·(8 + 24/t) + 6·a·s²·b/t`` per layer: the paper's
``10 + 24/t`` less the ``2·s·b·h`` of dropout masks, and ``6`` instead of ``5`` for the
float32 softmax. XLA's own temporaries, fragmentation and the runtime's reserve are not
counted: treat an estimate above :data:`HBM_TIGHT_FRACTION` of HBM as at risk.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from infra import accelerators
from infra.accelerators import AcceleratorType
from infra.config import StackConfig
from training.config import MESH_AXES, VOCAB_SIZE, ParallelismConfig, TrainConfig

__all__ = [
    "BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN",
    "HBM_TIGHT_FRACTION",
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
    "min_batch_tokens",
    "operational_intensity",
    "parameter_shapes",
    "plan",
    "plan_training",
]

#: The public source of the DCN arithmetic and parallelism guidance (summarized for the team
#: in ../shared/SEED-NOTES.md). User-facing output cites the public page.
MULTISLICE_OVERVIEW = "Cloud TPU Multislice overview, https://cloud.google.com/tpu/docs/multislice-introduction"
_SEED_DCN = f"{MULTISLICE_OVERVIEW} (DCN arithmetic)"
_SEED_PAR = f"{MULTISLICE_OVERVIEW} (parallelism rules)"
_KORTHIKANTI = (
    'Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", '
    "arXiv:2205.05198, §4.1 (per-layer activation memory), adapted (see infra/planner.py)"
)

#: Backward-pass FLOPs per parameter per token: "the backward pass is 4·B per parameter"
#: (of the 6·B·P FLOPs of a transformer step). Source: SEED-NOTES.md, "DCN arithmetic".
BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN = 4

#: DCN bits per parameter per step for an all-reduce between exactly 2 replicas, and the
#: upper bound the seed uses for more than 2 (float32 gradients; a ring all-reduce moves
#: 2·(n−1)/n × 32 bits, which tends to 64). Source: SEED-NOTES.md, "DCN arithmetic".
DCN_BITS_PER_PARAMETER_TWO_REPLICAS = 32
DCN_BITS_PER_PARAMETER_MANY_REPLICAS = 64

#: The seed's margin over the minimum batch: "use a large margin: data parallelism only at
#: ≥ ~350,000 tokens per pod (two pods) to ~700,000 (many pods)" against minimums of
#: 176,000 and 352,000, i.e. about 2×. Source: SEED-NOTES.md, "DCN arithmetic".
SAFETY_MARGIN = 2.0

#: Planner heuristic, not from a document: an estimate above this share of HBM is flagged as
#: tight because XLA temporaries and fragmentation are not in the estimate.
HBM_TIGHT_FRACTION = 0.9

_F32_BYTES = 4
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
_ADAM_MOMENTS = 2  # optax.adamw: mu and nu, float32, shaped like the parameters


# --- DCN arithmetic ------------------------------------------------------------------------


def hardware_arithmetic_intensity(accelerator: AcceleratorType) -> float:
    """FLOP per DCN bit the hardware can sustain: chips per host × peak bf16 FLOP/s per chip ÷
    DCN bits/s per host (TPU VM). v4: 4 × 275e12 / 50e9 = 22,000.

    For v5e/v6e multi-host slices the VM holds 4 of the physical host's 8 chips and the
    catalog shares the host's DCN evenly (``AcceleratorType.dcn_bits_per_second_per_host``),
    so the result equals ``Generation.flops_per_dcn_bit`` for every slice size.
    Source: SEED-NOTES.md, "DCN arithmetic"; figures from ``infra.accelerators``.
    """
    gen = accelerator.generation
    return accelerator.chips_per_host * gen.peak_bf16_flops_per_chip / accelerator.dcn_bits_per_second_per_host


def dcn_bits_per_parameter(replicas: int) -> int:
    """DCN bits per parameter per step of the gradient all-reduce between ``replicas`` DCN
    data-parallel replicas: 32 for 2, 64 for more (SEED-NOTES.md, "DCN arithmetic").

    Raises:
      ValueError: ``replicas`` < 2 (one replica sends no gradients over DCN).
    """
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 2:
        raise ValueError(f"replicas must be an int ≥ 2 (DCN data-parallel replicas); got {replicas!r}")
    return DCN_BITS_PER_PARAMETER_TWO_REPLICAS if replicas == 2 else DCN_BITS_PER_PARAMETER_MANY_REPLICAS


def operational_intensity(tokens_per_replica: float, replicas: int) -> float:
    """The model's FLOP per DCN bit under data parallelism over DCN: ``4·B / 32`` (2 replicas)
    or ``4·B / 64`` (more), B = tokens per step of one replica (per pod).

    Raises:
      ValueError: ``tokens_per_replica`` ≤ 0 or ``replicas`` < 2.
    """
    if not tokens_per_replica > 0:
        raise ValueError(f"tokens_per_replica must be positive; got {tokens_per_replica!r}")
    return BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN * tokens_per_replica / dcn_bits_per_parameter(replicas)


def min_batch_tokens(arithmetic_intensity: float, replicas: int) -> float:
    """Smallest tokens per replica (per pod) for which ``operational_intensity ≥
    arithmetic_intensity``: ``AI × bits / 4``. v4: 176,000 (2 replicas), 352,000 (more).

    Raises:
      ValueError: ``arithmetic_intensity`` ≤ 0 or ``replicas`` < 2.
    """
    if not arithmetic_intensity > 0:
        raise ValueError(f"arithmetic_intensity must be positive; got {arithmetic_intensity!r}")
    return arithmetic_intensity * dcn_bits_per_parameter(replicas) / BACKWARD_FLOPS_PER_PARAMETER_PER_TOKEN


@dataclasses.dataclass(frozen=True)
class DcnCheck:
    """The seed's DCN check for one stack.

    Attributes:
      replicas: DCN data-parallel replicas (``parallelism.dcn.data``).
      tokens_per_replica: B, tokens per step of one replica (global tokens ÷ replicas).
      arithmetic_intensity: hardware FLOP per DCN bit.
      bits_per_parameter: 32 or 64; None with a single replica.
      operational_intensity: 4·B / bits, FLOP per bit; None with a single replica.
      min_batch_tokens: minimum B (tokens per replica); None with a single replica.
      recommended_batch_tokens: ``SAFETY_MARGIN × min_batch_tokens``; None with one replica.
      dcn_bound: True when ``operational_intensity < arithmetic_intensity``.
      meets_margin: True when B ≥ the recommended batch (or no DCN all-reduce happens).
      dcn_fsdp: ``parallelism.dcn.fsdp`` (FSDP traffic over DCN is not modelled when > 1).
      chips_per_host, peak_flops_per_chip, dcn_bits_per_second_per_host: the catalog figures
        the arithmetic intensity is computed from (per TPU VM).
    """

    replicas: int
    tokens_per_replica: float
    arithmetic_intensity: float
    bits_per_parameter: int | None
    operational_intensity: float | None
    min_batch_tokens: float | None
    recommended_batch_tokens: float | None
    dcn_bound: bool
    meets_margin: bool
    dcn_fsdp: int
    chips_per_host: int
    peak_flops_per_chip: float
    dcn_bits_per_second_per_host: float

    @property
    def applies(self) -> bool:
        """Whether gradients cross DCN in a data-parallel all-reduce (more than one replica)."""
        return self.replicas > 1


def dcn_check(accelerator: AcceleratorType, parallelism: ParallelismConfig, global_batch_tokens: int) -> DcnCheck:
    """The DCN verdict for data parallelism over ``parallelism.dcn.data`` replicas.

    Args:
      accelerator: the slice type (catalog entry).
      parallelism: the mesh; ``dcn.data`` is the replica count.
      global_batch_tokens: tokens per optimizer step over all slices.

    Raises:
      ValueError: ``global_batch_tokens`` ≤ 0.
    """
    if not isinstance(global_batch_tokens, int) or global_batch_tokens <= 0:
        raise ValueError(f"global_batch_tokens must be a positive int; got {global_batch_tokens!r}")
    replicas = parallelism.dcn.data
    tokens = global_batch_tokens / replicas
    ai = hardware_arithmetic_intensity(accelerator)
    hardware = {
        "dcn_fsdp": parallelism.dcn.fsdp,
        "chips_per_host": accelerator.chips_per_host,
        "peak_flops_per_chip": accelerator.generation.peak_bf16_flops_per_chip,
        "dcn_bits_per_second_per_host": accelerator.dcn_bits_per_second_per_host,
    }
    if replicas < 2:
        return DcnCheck(replicas, tokens, ai, None, None, None, None, False, True, **hardware)
    oi = operational_intensity(tokens, replicas)
    minimum = min_batch_tokens(ai, replicas)
    return DcnCheck(
        replicas=replicas,
        tokens_per_replica=tokens,
        arithmetic_intensity=ai,
        bits_per_parameter=dcn_bits_per_parameter(replicas),
        operational_intensity=oi,
        min_batch_tokens=minimum,
        recommended_batch_tokens=SAFETY_MARGIN * minimum,
        dcn_bound=oi < ai,
        meets_margin=tokens >= SAFETY_MARGIN * minimum,
        **hardware,
    )


# --- memory ------------------------------------------------------------------------------


def parameter_shapes(train: TrainConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """Every parameter of the trainer's model: ``path -> (shape, logical axes)``.

    Shapes come from ``training.model.init_params`` through ``jax.eval_shape`` (abstract: no
    arrays, no device), axes from ``training.model.logical_axes``; paths are ``/``-joined
    tree keys, e.g. ``layers/wq``.
    """
    import jax

    from training import model

    abstract = jax.eval_shape(lambda: model.init_params(train.model, jax.random.key(0)))
    axes = model.logical_axes(train.model)
    out: dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]] = {}

    def walk(tree: Any, ax: Any, prefix: str) -> None:
        if isinstance(tree, Mapping):
            for key in tree:
                walk(tree[key], ax[key], f"{prefix}/{key}" if prefix else str(key))
        else:
            if len(ax) != len(tree.shape):
                raise ValueError(f"{prefix}: {len(tree.shape)} dimensions but {len(ax)} logical axes")
            out[prefix] = (tuple(int(d) for d in tree.shape), tuple(ax))

    walk(abstract, axes, "")
    return out


def _shard_elements(shape: tuple[int, ...], axes: tuple[str | None, ...], mesh_shape: Mapping[str, int]) -> int:
    """Elements of one device's shard: each dimension split over the mesh axes its logical
    axis maps to (training.mesh.LOGICAL_AXIS_RULES), rounded up like a padded shard."""
    from training.mesh import LOGICAL_AXIS_RULES

    elements = 1
    for dim, name in zip(shape, axes, strict=True):
        rule = LOGICAL_AXIS_RULES[name] if name is not None else None
        mesh_axes = () if rule is None else (rule,) if isinstance(rule, str) else tuple(rule)
        ways = math.prod(mesh_shape[a] for a in mesh_axes)
        elements *= -(-dim // ways)
    return elements


def activation_bytes_per_chip(train: TrainConfig) -> int:
    """Activation bytes one chip keeps for the backward pass at the configured batch and
    sequence length (formula and source: module docstring, "Memory per chip").

    Raises:
      ValueError: the batch does not split evenly over the data × fsdp axes.
    """
    par = train.parallelism
    shape = par.mesh_shape
    shards = par.batch_shards
    if train.global_batch_size % shards:
        raise ValueError(
            f"global_batch_size {train.global_batch_size} is not divisible by the data-parallel size {shards}"
        )
    b = train.global_batch_size // shards
    s, h, f = train.sequence_length, train.model.d_model, train.model.ff_width
    a, t, n = train.model.n_heads, shape["tensor"], train.model.n_layers
    e = _DTYPE_BYTES[train.model.compute_dtype]
    softmax = a * s * s * b * (_F32_BYTES + (e if e != _F32_BYTES else 0))
    per_layer = 4 * e * s * b * h + (4 * e * s * b * h + 2 * e * s * b * f + softmax) / t
    output = 2 * e * s * b * h + 2 * _F32_BYTES * s * b * VOCAB_SIZE / t
    return int(math.ceil(n * per_layer + output))


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per chip. ``parameters``, ``gradients`` and ``optimizer_state`` are float32 shards;
    ``activations`` is :func:`activation_bytes_per_chip`; ``capacity`` is the chip's HBM."""

    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    capacity: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.activations

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    @property
    def fraction(self) -> float:
        return self.total / self.capacity


def memory_per_chip(train: TrainConfig, hbm_capacity_bytes: int) -> MemoryEstimate:
    """Per-chip memory of training ``train`` on its mesh (see the module docstring).

    Args:
      train: the trainer config (model, batch, sequence length, parallelism).
      hbm_capacity_bytes: HBM of one chip (``Generation.hbm_bytes_per_chip``).

    Raises:
      ValueError: a non-positive capacity, or a batch that does not split over the mesh.
    """
    if not isinstance(hbm_capacity_bytes, int) or hbm_capacity_bytes <= 0:
        raise ValueError(f"hbm_capacity_bytes must be a positive int; got {hbm_capacity_bytes!r}")
    mesh_shape = train.parallelism.mesh_shape
    params = sum(
        _shard_elements(shape, axes, mesh_shape) * _F32_BYTES for shape, axes in parameter_shapes(train).values()
    )
    return MemoryEstimate(
        parameters=params,
        gradients=params,
        optimizer_state=_ADAM_MOMENTS * params,
        activations=activation_bytes_per_chip(train),
        capacity=hbm_capacity_bytes,
    )


# --- the plan ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything ``multislice plan`` reports about one stack.

    Attributes:
      stack, accelerator_type, generation: names.
      slices, chips_per_slice, chips, hosts_per_slice, hosts, chips_per_host: the job's size
        (hosts = TPU VMs, one process each).
      parallelism: the ICI and DCN axis sizes.
      parameters: parameter count (``training.model.param_count``).
      sequence_length, global_batch_size: sequences of tokens per step.
      global_batch_tokens: tokens per optimizer step over all slices.
      memory: per-chip memory estimate.
      dcn: the DCN check.
      recommendations: advice from the Multislice overview's parallelism guidance, most important first.
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
    parallelism: ParallelismConfig
    parameters: int
    sequence_length: int
    global_batch_size: int
    global_batch_tokens: int
    memory: MemoryEstimate
    dcn: DcnCheck
    recommendations: tuple[str, ...]
    sources: dict[str, str]

    @property
    def mesh(self) -> dict[str, dict[str, int]]:
        """``axis -> {"dcn": n, "ici": n, "size": n}`` for data, fsdp, tensor."""
        par = self.parallelism
        return {
            axis: {"dcn": getattr(par.dcn, axis), "ici": getattr(par.ici, axis), "size": par.mesh_shape[axis]}
            for axis in MESH_AXES
        }

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``multislice plan --json``)."""
        dcn, mem = self.dcn, self.memory
        return {
            "stack": self.stack,
            "accelerator_type": self.accelerator_type,
            "generation": self.generation,
            "slices": self.slices,
            "chips_per_slice": self.chips_per_slice,
            "chips": self.chips,
            "hosts_per_slice": self.hosts_per_slice,
            "hosts": self.hosts,
            "chips_per_host": self.chips_per_host,
            "mesh": self.mesh,
            "parameters": self.parameters,
            "sequence_length": self.sequence_length,
            "global_batch_size": self.global_batch_size,
            "global_batch_tokens": self.global_batch_tokens,
            "dcn_replicas": dcn.replicas,
            "tokens_per_replica": dcn.tokens_per_replica,
            "arithmetic_intensity": dcn.arithmetic_intensity,
            "peak_flops_per_chip": dcn.peak_flops_per_chip,
            "dcn_bits_per_second_per_host": dcn.dcn_bits_per_second_per_host,
            "dcn_bits_per_parameter": dcn.bits_per_parameter,
            "operational_intensity": dcn.operational_intensity,
            "min_batch_tokens": dcn.min_batch_tokens,
            "recommended_batch_tokens": dcn.recommended_batch_tokens,
            "safety_margin": SAFETY_MARGIN,
            "dcn_bound": dcn.dcn_bound,
            "meets_dcn_margin": dcn.meets_margin,
            "hbm_bytes_per_chip": mem.total,
            "hbm_capacity_bytes": mem.capacity,
            "hbm_fraction": mem.fraction,
            "fits_in_hbm": mem.fits,
            "memory_bytes_per_chip": {
                "parameters": mem.parameters,
                "gradients": mem.gradients,
                "optimizer_state": mem.optimizer_state,
                "activations": mem.activations,
            },
            "recommendations": list(self.recommendations),
            "sources": dict(self.sources),
        }


def plan(config: StackConfig) -> Plan:
    """The plan of a validated stack (see :func:`plan_training`)."""
    return plan_training(config.training, config.accelerator, config.slices, stack=config.stack)


def plan_training(train: TrainConfig, accelerator: AcceleratorType, slices: int, *, stack: str = "") -> Plan:
    """Plan training ``train`` on ``slices`` slices of ``accelerator``.

    ``StackConfig`` already checks these rules for stacks; this checks them again so the
    planner is safe on its own inputs.

    Raises:
      ValueError: ``slices`` not in 1..256, slices > 1 on a generation without Multislice, or
        the ICI/DCN products not matching the chips per slice / the slice count (the
        message names the ``parallelism`` key).
    """
    if not isinstance(slices, int) or isinstance(slices, bool) or not 1 <= slices <= accelerators.MAX_SLICES:
        raise ValueError(f"slices must be an int from 1 to {accelerators.MAX_SLICES}; got {slices!r}")
    gen = accelerator.generation
    if slices > 1 and not gen.supports_multislice:
        raise ValueError(f"slices: Multislice needs TPU v4 or later; {accelerator.name} allows only 1 slice")
    par = train.parallelism
    if par.ici.product != accelerator.chips:
        raise ValueError(
            f"parallelism.ici: data×fsdp×tensor = {par.ici.product} must equal the chips per slice of "
            f"{accelerator.name}: {accelerator.chips}"
        )
    if par.dcn.product != slices:
        raise ValueError(f"parallelism.dcn: data×fsdp×tensor = {par.dcn.product} must equal slices: {slices}")
    from training.model import param_count

    memory = memory_per_chip(train, gen.hbm_bytes_per_chip)
    dcn = dcn_check(accelerator, par, train.global_batch_tokens)
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
        "hbm_bytes_per_chip": src["hbm_bytes_per_chip"],
        "arithmetic_intensity": _SEED_DCN + ": chips per host × peak FLOP/s per chip ÷ DCN bits/s per host",
        "operational_intensity": _SEED_DCN + ": 4·B/32 (2 replicas) or 4·B/64 (more); B = tokens per replica",
        "safety_margin": _SEED_DCN + ': "≥ ~350,000 tokens per pod (two pods) to ~700,000 (many pods)" = 2 × minimum',
        "activations": _KORTHIKANTI,
        "parallelism_guidance": _SEED_PAR,
    }
    partial = Plan(
        stack=stack,
        accelerator_type=accelerator.name,
        generation=gen.name,
        slices=slices,
        chips_per_slice=accelerator.chips,
        chips=slices * accelerator.chips,
        hosts_per_slice=accelerator.hosts,
        hosts=slices * accelerator.hosts,
        chips_per_host=accelerator.chips_per_host,
        parallelism=par,
        parameters=param_count(train.model),
        sequence_length=train.sequence_length,
        global_batch_size=train.global_batch_size,
        global_batch_tokens=train.global_batch_tokens,
        memory=memory,
        dcn=dcn,
        recommendations=(),
        sources=sources,
    )
    return dataclasses.replace(partial, recommendations=tuple(_recommendations(partial, train)))


# --- guidance --------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _variant(train: TrainConfig, dcn: dict[str, int] | None = None, ici: dict[str, int] | None = None) -> TrainConfig | None:
    """``train`` with other DCN/ICI axis sizes, or None when that config would be invalid."""
    par = train.parallelism
    new = {
        "ici": par.ici.model_dump() | (ici or {}),
        "dcn": par.dcn.model_dump() | (dcn or {}),
    }
    try:
        return TrainConfig.model_validate(train.model_dump() | {"parallelism": new})
    except ValueError:
        return None


def _round_up(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple) * multiple)


def _recommendations(p: Plan, train: TrainConfig) -> list[str]:
    """Advice from SEED-NOTES.md "Parallelism rules" and "DCN arithmetic", most urgent first."""
    out: list[str] = []
    par, dcn, mem = p.parallelism, p.dcn, p.memory
    capacity = mem.capacity

    # Memory first: a job that does not fit does not run.
    if not mem.fits:
        out.append(
            f"over HBM: the estimate is {_gib(mem.total)} per chip against {_gib(capacity)} "
            f"({mem.fraction:.0%}); {_memory_advice(p, train)}"
        )
    elif mem.fraction > HBM_TIGHT_FRACTION:
        out.append(
            f"tight on HBM: {mem.fraction:.0%} of {_gib(capacity)} before XLA temporaries; "
            f"{_memory_advice(p, train)}"
        )

    # DCN: tensor parallelism never crosses DCN; start with pure data parallelism.
    out.append("dcn tensor parallelism is 1, as required (tensor parallelism never crosses DCN)")
    if p.slices > 1 and par.dcn.fsdp > 1:
        pure = _variant(train, dcn={"data": p.slices, "fsdp": 1})
        if pure is not None:
            pure_mem = memory_per_chip(pure, capacity)
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
        replicas = dcn.replicas
        need_tokens = dcn.min_batch_tokens * replicas
        margin_tokens = dcn.recommended_batch_tokens * replicas
        shards, seq = par.batch_shards, train.sequence_length
        need_seqs = _round_up(need_tokens / seq, shards)
        margin_seqs = _round_up(margin_tokens / seq, shards)
        if dcn.dcn_bound:
            out.append(
                f"DCN-bound: {dcn.tokens_per_replica:,.0f} tokens per replica give an operational intensity of "
                f"{dcn.operational_intensity:,.0f} FLOP/bit < {dcn.arithmetic_intensity:,.0f}; raise "
                f"global_batch_size to ≥ {need_seqs} sequences ({need_tokens:,.0f} tokens), ≥ {margin_seqs} with "
                f"the Multislice overview's {SAFETY_MARGIN:g}× margin; when adding slices, scale the global batch linearly"
            )
            pipe = _pipeline_depth(p, train)
            if pipe:
                out.append(pipe)
        elif not dcn.meets_margin:
            out.append(
                f"compute-bound but below the Multislice overview's {SAFETY_MARGIN:g}× margin (DCN can drop packets briefly): "
                f"{dcn.tokens_per_replica:,.0f} tokens per replica, recommended ≥ "
                f"{dcn.recommended_batch_tokens:,.0f} (global_batch_size ≥ {margin_seqs})"
            )
        else:
            out.append(
                f"pure data parallelism over DCN is compute-bound with the Multislice overview's margin "
                f"({dcn.tokens_per_replica:,.0f} ≥ {dcn.recommended_batch_tokens:,.0f} tokens per replica)"
            )
    elif p.slices > 1:
        out.append(
            "no data parallelism over DCN (dcn.data = 1): the Multislice overview's DCN check does not apply; FSDP traffic over "
            "DCN is not modelled"
        )
    # ICI: FSDP is almost always preferred to data parallelism inside a slice.
    if par.ici.data > 1:
        out.append(
            f"inside a slice prefer FSDP to data parallelism (ICI is fast; ici.data is usually 1): try "
            f"ici {{data: 1, fsdp: {par.ici.data * par.ici.fsdp}, tensor: {par.ici.tensor}}}"
        )
    return out


def _memory_advice(p: Plan, train: TrainConfig) -> str:
    """How to get under HBM: more FSDP (ICI first, then over DCN), else smaller activations."""
    mem, par = p.memory, p.parallelism
    tips = []
    if par.ici.data > 1:
        v = _variant(train, ici={"data": 1, "fsdp": par.ici.data * par.ici.fsdp})
        if v is not None:
            tips.append(f"ici fsdp {par.ici.data * par.ici.fsdp} → {_gib(memory_per_chip(v, mem.capacity).total)}")
    if p.slices > 1 and par.dcn.data > 1:
        for fsdp in range(2, par.dcn.data + 1):
            if par.dcn.data % fsdp:
                continue
            v = _variant(train, dcn={"data": par.dcn.data // fsdp, "fsdp": par.dcn.fsdp * fsdp})
            if v is not None and memory_per_chip(v, mem.capacity).fits:
                tips.append(
                    f"FSDP over DCN (the Multislice overview's second choice, to relieve memory): dcn {{data: "
                    f"{par.dcn.data // fsdp}, fsdp: {par.dcn.fsdp * fsdp}}} → "
                    f"{_gib(memory_per_chip(v, mem.capacity).total)}"
                )
                break
    if mem.activations > mem.total / 2:
        tips.append(
            f"activations dominate ({_gib(mem.activations)}): fewer sequences per chip or a shorter sequence_length"
        )
    return "; ".join(tips) or "a larger slice or a smaller model"


def _pipeline_depth(p: Plan, train: TrainConfig) -> str | None:
    """The seed's pipeline advice when the batch cannot grow: depth 2 with N/2 replicas, then 4
    with N/4, until the per-replica batch clears the minimum."""
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


def advisories(config: StackConfig) -> list[str]:
    """Warnings for ``pulumi preview``/``up``: one line when the stack is predicted DCN-bound,
    one when its per-chip memory estimate exceeds HBM; empty when neither. Each line starts
    with the stack name and ends with how to see the full plan."""
    p = plan(config)
    out = []
    hint = f"(see: multislice plan --stack {config.stack})"
    if p.dcn.dcn_bound:
        out.append(
            f"stack {config.stack}: predicted DCN-bound: {p.dcn.tokens_per_replica:,.0f} tokens per DCN replica "
            f"(operational intensity {p.dcn.operational_intensity:,.0f} FLOP/bit) < the "
            f"{p.dcn.min_batch_tokens:,.0f} needed on {p.accelerator_type} "
            f"(arithmetic intensity {p.dcn.arithmetic_intensity:,.0f} FLOP/bit) {hint}"
        )
    if not p.memory.fits:
        out.append(
            f"stack {config.stack}: predicted over HBM: {_gib(p.memory.total)} per chip > "
            f"{_gib(p.memory.capacity)} on {p.accelerator_type} {hint}"
        )
    return out

"""Memory per chip: float32 training state sharded like the parameters, plus activations.

Parameters, gradients and optimizer state are float32 (``training.model.transformer``,
``training.optimizer``: AdamW keeps two float32 moments, ``mu`` and ``nu``, shaped like the
parameters; its int32 step counters are ignored). All three are sharded exactly like the
parameters: each dimension's logical axis is split over the mesh axes
``training.model.shapes.LOGICAL_AXIS_RULES`` assigns it (``embed`` over fsdp; ``heads``, ``mlp``,
``vocab`` over tensor), as ``training.train`` shards its state. Parameter shapes and logical
axes are ``training.model.shapes``, the jax-free module ``training.model.transformer.init_params`` creates its
parameters from (tests/training/test_shapes.py checks both against ``jax.eval_shape`` of the real
init), so the arithmetic is exact and needs no jax.

Activations are the tensors autodiff keeps for the backward pass. The structure follows
Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
(arXiv:2205.05198), §4.1 (per layer: what each sublayer keeps, split over t-way tensor
parallelism or not); the counts are this model's own, read with
``jax.ad_checkpoint.print_saved_residuals`` of ``training.model.transformer.loss_fn`` (JAX's list of the
residuals autodiff saves, https://docs.jax.dev/en/latest/gradient-checkpointing.html) and
checked against XLA's compiled memory (``infra/planner/compiled.py``, docs/model.md). With
``e`` bytes per element of ``compute_dtype``, ``b`` sequences per chip and microbatch
(``global_batch_size ÷ (data × fsdp) ÷ microbatches``: the step runs one microbatch at a time),
``s`` = sequence_length, ``h`` = d_model, ``f`` = d_ff, ``a`` = query heads, ``g·k`` the width of k
and v (key/value heads × head dim: grouped-query attention) and t the tensor axis size,
:func:`activation_bytes_per_chip` counts per layer

* replicated over tensor: ``(16 + 2e)·s·b·h``: each of the two RMSNorms keeps its float32
  input and normalized value and its ``e``-byte output;
* split over tensor: ``(e·s·b·(2h + 2·g·k) + 6·e·s·b·f + a·s²·b·(4 + e)) / t``: q after RoPE and
  the attention output (h wide), k after RoPE and v (g·k wide); six f-wide MLP tensors (GELU's
  tanh form and SwiGLU alike); the float32 softmax and its ``e``-byte probabilities. A fused
  kernel (splash, cudnn; ``auto`` counts as TPU's choice, ``training.model.kernels.attention_kernel``)
  keeps a float32 log-sum-exp per query instead, ``4·a·s·b``;
* with a 16-bit ``compute_dtype``, each layer's weights cast to it (``e`` bytes per weight,
  sharded like the parameters; a float32 cast is the weight itself);

and once for the output layer ``(8 + e)·s·b·h + 2·4·s·b·V / t`` (the final norm as above;
float32 logits and log-probabilities over the model's vocabulary V). Korthikanti's 16-bit,
dropout-free MLP keeps 2 f-wide tensors and the softmax one: JAX's autodiff of this model keeps
more (the float32 norm internals, the GELU/SwiGLU intermediates), hence the larger counts.
``remat: full`` keeps each layer's input (``e·s·b·h``) plus one layer's activations, recomputed
in the backward pass; the dots policies keep the matmul outputs (q, k, v, the two output
projections, the MLP's input matmuls; ``dots_saveable`` also the attention's q·kᵀ scores in
float32 and probabilities·v) plus one layer's other tensors, recomputed. With FSDP (fsdp > 1)
the float32 embedding tables and one layer's weights are all-gathered whole over fsdp for their
matmuls and their gradients exist whole before the reduce-scatter: twice those bytes. With
``microbatches`` > 1 the gradients are counted twice (their float32 sum and one microbatch's).
XLA's other temporaries, fragmentation and the runtime's reserve are not counted: treat an
estimate above :data:`HBM_TIGHT_FRACTION` of HBM as at risk.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from training.config import TrainConfig
from training.model import shapes
from training.model.kernels import attention_kernel
from training.model.shapes import LOGICAL_AXIS_RULES

__all__ = [
    "ACTIVATIONS_SOURCE",
    "ESTIMATE_SOURCE",
    "HBM_TIGHT_FRACTION",
    "MemoryEstimate",
    "activation_bytes_per_chip",
    "memory_per_chip",
    "parameter_shapes",
]

#: Where the activation formula comes from (``Plan.sources["activations"]``).
ACTIVATIONS_SOURCE = (
    'Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", '
    "arXiv:2205.05198, §4.1 (per-layer activation memory), adapted: counts of the residuals JAX's autodiff saves "
    "for this model (jax.ad_checkpoint.print_saved_residuals; see infra/planner/memory.py)"
)

#: Where the per-chip estimate (``MemoryEstimate.total``, ``hbm_estimated_bytes_per_chip`` in
#: ``multislice plan --json``) comes from: this module's model, not the HBM capacity.
ESTIMATE_SOURCE = (
    "estimate of infra/planner/memory.py: float32 parameters, gradients and the two AdamW moments mu and nu "
    "(optax.adamw, https://optax.readthedocs.io/en/latest/api/optimizers.html#optax.adamw), each sharded like "
    "the parameters, plus activations (see activations); XLA temporaries not counted"
)

#: Planner heuristic, not from a document: an estimate above this share of HBM is flagged as
#: tight because XLA temporaries and fragmentation are not in the estimate.
HBM_TIGHT_FRACTION = 0.9

_F32_BYTES = 4
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
_ADAM_MOMENTS = 2  # optax.adamw: mu and nu, float32, shaped like the parameters
#: f-wide tensors the MLP saves per layer: GELU (tanh form) and SwiGLU alike (print_saved_residuals).
_MLP_SAVED = 6


def parameter_shapes(train: TrainConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """Every parameter of the trainer's model: ``path -> (shape, logical axes)``, from
    ``training.model.shapes.flat_params`` (paths are ``/``-joined tree keys, e.g. ``layers/wq``)."""
    return {
        path: (param.shape, param.axes) for path, param in shapes.flat_params(train.model, train.vocab_size).items()
    }


def _shard_elements(shape: tuple[int, ...], axes: tuple[str | None, ...], mesh_shape: Mapping[str, int]) -> int:
    """Elements of one device's shard: each dimension split over the mesh axes its logical
    axis maps to (training.model.shapes.LOGICAL_AXIS_RULES), rounded up like a padded shard."""
    elements = 1
    for dim, name in zip(shape, axes, strict=True):
        rule = LOGICAL_AXIS_RULES[name] if name is not None else None
        mesh_axes = () if rule is None else (rule,) if isinstance(rule, str) else tuple(rule)
        ways = math.prod(mesh_shape[a] for a in mesh_axes)
        elements *= -(-dim // ways)
    return elements


def _layer_weight_bytes_per_chip(train: TrainConfig, mesh_shape: Mapping[str, int], itemsize: int) -> int:
    """Bytes one chip holds of every layer's matmul weights (``layers/*`` without the norm
    scales) at ``itemsize`` bytes per element, sharded like the parameters."""
    return itemsize * sum(
        _shard_elements(shape, axes, mesh_shape)
        for path, (shape, axes) in parameter_shapes(train).items()
        if path.startswith("layers/") and "norm" not in axes
    )


def activation_bytes_per_chip(train: TrainConfig, platform: str = "tpu") -> int:
    """Activation bytes one chip keeps for the backward pass at the configured batch and
    sequence length (formula and source: the module docstring). ``platform`` decides what
    ``model.attention: auto`` runs (``training.model.kernels.attention_kernel``): ``tpu`` for a stack,
    ``cpu`` to compare with a compile on a virtual CPU mesh.

    ``train`` is validated: its global batch splits evenly over the data × fsdp axes and its
    per-replica batch over ``microbatches`` (``TrainConfig`` rejects one that does not).
    """
    par, model = train.parallelism, train.model
    b = train.global_batch_size // par.batch_shards // train.microbatches  # one microbatch at a time
    s, h, f = train.sequence_length, model.d_model, model.ff_width
    a, t, n = model.n_heads, par.mesh_shape["tensor"], model.n_layers
    kv = model.kv_heads * model.head_dim  # width of k and v (grouped-query attention)
    e = _DTYPE_BYTES[model.compute_dtype]
    fused = attention_kernel(model, platform, s) in ("splash", "cudnn")
    mlp_dots = 2 if model.mlp == "swiglu" else 1  # f-wide matmul outputs: W_in (and W_gate)
    # The tensors autodiff saves per layer (jax.ad_checkpoint.print_saved_residuals of the layer):
    norms = (2 * 2 * _F32_BYTES + 2 * e) * s * b * h  # each RMSNorm: its float32 input and normalized x, its output
    qkvo = e * s * b * (2 * h + 2 * kv)  # q and the attention output (h wide), k and v (kv wide)
    scores = a * s * b * _F32_BYTES if fused else a * s * s * b * (_F32_BYTES + e)  # logsumexp, or probs + cast
    mlp = _MLP_SAVED * e * s * b * f
    per_layer = norms + (qkvo + scores + mlp) / t
    # Weights cast to compute_dtype inside the layer are saved too (a float32 "cast" is the weight itself).
    casts = _layer_weight_bytes_per_chip(train, par.mesh_shape, e) if e != _F32_BYTES else 0
    if model.remat == "none":
        saved = n * per_layer + casts
    elif model.remat == "full":  # each layer's input; one layer's activations live again in the backward pass
        saved = n * e * s * b * h + per_layer + casts / n
    else:  # dots policies: the matmul outputs (dots_saveable also the attention's); one layer's others recomputed
        dots = e * s * b * (2 * h + h + 2 * kv + mlp_dots * f) / t  # wo, w_out; q, k, v; W_in (, W_gate)
        if model.remat == "dots_saveable" and not fused:
            dots += a * s * s * b * _F32_BYTES / t + e * s * b * h / t  # q·kᵀ scores, probabilities·v
        saved = n * dots + max(per_layer - dots, 0) + casts
    output = (2 * _F32_BYTES + e) * s * b * h + 2 * _F32_BYTES * s * b * train.vocab_size / t
    return int(math.ceil(saved + output + _fsdp_gathered_bytes(train)))


def _fsdp_gathered_bytes(train: TrainConfig) -> int:
    """With FSDP (fsdp > 1) a matmul needs its weight whole over the fsdp axis: the float32
    embedding (and unembedding) tables and one layer's weights are all-gathered, and their
    gradients exist whole before the reduce-scatter: twice their bytes without the fsdp split."""
    mesh_shape = train.parallelism.mesh_shape
    if mesh_shape["fsdp"] == 1:
        return 0
    whole = dict(mesh_shape) | {"fsdp": 1}
    tables = sum(
        _shard_elements(shape, axes, whole)
        for path, (shape, axes) in parameter_shapes(train).items()
        if not path.startswith("layers/") and "norm" not in axes
    )
    layer = _layer_weight_bytes_per_chip(train, whole, _F32_BYTES) // train.model.n_layers
    return 2 * (_F32_BYTES * tables + layer)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per chip. ``parameters``, ``gradients`` and ``optimizer_state`` are float32 shards;
    ``activations`` is :func:`activation_bytes_per_chip`; ``capacity`` is the chip's HBM
    capacity from the catalog (``Generation.hbm_bytes_per_chip``).

    Derived (not constructor arguments): ``total`` (bytes, the four parts), ``fraction``
    (``total / capacity``) and ``fits`` (``total ≤ capacity``).

    A field's ``metadata["json"]`` is its key in ``multislice plan --json`` (``Plan.to_json``;
    a dotted key nests: the four parts go under ``memory_bytes_per_chip``). The estimate and the
    capacity have distinct keys, ``hbm_estimated_bytes_per_chip`` and
    ``hbm_capacity_bytes_per_chip``, each with its own entry in ``Plan.sources``.
    """

    parameters: int = dataclasses.field(metadata={"json": "memory_bytes_per_chip.parameters"})
    gradients: int = dataclasses.field(metadata={"json": "memory_bytes_per_chip.gradients"})
    optimizer_state: int = dataclasses.field(metadata={"json": "memory_bytes_per_chip.optimizer_state"})
    activations: int = dataclasses.field(metadata={"json": "memory_bytes_per_chip.activations"})
    capacity: int = dataclasses.field(metadata={"json": "hbm_capacity_bytes_per_chip"})
    total: int = dataclasses.field(init=False, metadata={"json": "hbm_estimated_bytes_per_chip"})
    fraction: float = dataclasses.field(init=False, metadata={"json": "hbm_fraction"})
    fits: bool = dataclasses.field(init=False, metadata={"json": "fits_in_hbm"})

    def __post_init__(self) -> None:
        total = self.parameters + self.gradients + self.optimizer_state + self.activations
        object.__setattr__(self, "total", total)
        object.__setattr__(self, "fraction", total / self.capacity)
        object.__setattr__(self, "fits", total <= self.capacity)


def memory_per_chip(train: TrainConfig, hbm_capacity_bytes: int, platform: str = "tpu") -> MemoryEstimate:
    """Per-chip memory of training ``train`` on its mesh (see the module docstring).

    Args:
      train: the trainer config (model, batch, sequence length, parallelism), validated.
      hbm_capacity_bytes: HBM of one chip (``Generation.hbm_bytes_per_chip``).

    Raises:
      ValueError: a non-positive capacity.
    """
    if not isinstance(hbm_capacity_bytes, int) or hbm_capacity_bytes <= 0:
        raise ValueError(f"hbm_capacity_bytes must be a positive int; got {hbm_capacity_bytes!r}")
    mesh_shape = train.parallelism.mesh_shape
    params = sum(
        _shard_elements(shape, axes, mesh_shape) * _F32_BYTES for shape, axes in parameter_shapes(train).values()
    )
    return MemoryEstimate(
        parameters=params,
        gradients=params * (2 if train.microbatches > 1 else 1),  # the sum and one microbatch's gradients
        optimizer_state=_ADAM_MOMENTS * params,
        activations=activation_bytes_per_chip(train, platform),
        capacity=hbm_capacity_bytes,
    )

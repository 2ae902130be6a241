"""A decoder-only transformer in plain JAX (docs/model.md: options, presets, kernels).

Architecture (pre-norm): token embedding → ``n_layers`` × [RMSNorm → causal self-attention
with rotary position embeddings (``n_heads`` query heads, ``n_kv_heads`` key/value heads:
grouped-query attention, Ainslie et al. 2023, arXiv:2305.13245) → residual; RMSNorm → GELU or
SwiGLU MLP → residual] → RMSNorm → unembedding to the vocabulary's logits (its own matrix, or
the embedding table transposed: ``tie_embeddings``). Layers are stacked along a leading
``layers`` axis and run in one scan (``training.model.layer_scan``: one compiled layer body, fast
compiles); with ``remat`` the body is wrapped in ``jax.checkpoint`` with the named policy.

Parameters are float32; matmuls and activations use ``ModelConfig.compute_dtype``, the
weight matmuls accumulating in float32 (:func:`weight_dot`); the softmax and the loss are
computed in float32. Attention kernels: ``training.model.attention``.

Parameter shapes and logical axes: ``training.model.shapes`` (no jax; the planner reads it too).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import Mesh

from training.config import ModelConfig
from training.model import attention, layer_scan, shapes
from training.model.shapes import param_count as param_count  # re-exported (training.train)

Params = dict[str, Any]
#: ``constrain(x, logical axes) -> x`` with a sharding constraint (training.step), or the identity.
Constrain = Callable[[jax.Array, tuple[str | None, ...]], jax.Array]

INIT_STD = 0.02  # GPT-2 initialization (Radford et al. 2019)

#: ``checkpoint_name`` of every :func:`weight_dot` result. Both ``dots_*`` policies save it
#: besides the dots they see (the attention's): a weight matmul has no batch dimension.
DOT_NAME = "weight_dot"
#: ``model.remat`` -> the ``jax.checkpoint`` policy of each layer (None: recompute everything;
#: https://docs.jax.dev/en/latest/gradient-checkpointing.html). ``none`` is not wrapped.
REMAT_POLICIES: dict[str, Callable | None] = {
    "full": None,
    "dots_saveable": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_saveable, jax.checkpoint_policies.save_only_these_names(DOT_NAME)
    ),
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(DOT_NAME),
    ),
}


def logical_axes(cfg: ModelConfig, vocab_size: int) -> Params:
    """Logical axis names of every parameter dimension (same tree as :func:`init_params`)."""
    return jax.tree.map(lambda p: p.axes, shapes.params(cfg, vocab_size), is_leaf=lambda x: isinstance(x, shapes.Param))


def init_params(cfg: ModelConfig, vocab_size: int, key: jax.Array) -> Params:
    """Random float32 parameters shaped as ``training.model.shapes.params(cfg, vocab_size)``: unit
    norm scales, N(0, 0.02²) weights, output projections (wo, w_out) scaled by 1/√(2L) (GPT-2).

    Weights draw their keys in tree order from ``split(key, 7)`` then ``fold_in(key, i)`` for
    i ≥ 7, so the default model gets the same values as before the options existed."""
    weights = sum(p.axes[-1] != "norm" for p in shapes.flat_params(cfg, vocab_size).values())
    keys = iter([*jax.random.split(key, 7), *(jax.random.fold_in(key, i) for i in range(7, max(weights, 8)))])
    out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)

    def init(name: str, p: shapes.Param) -> jax.Array:
        if p.axes[-1] == "norm":
            return jnp.ones(p.shape, jnp.float32)
        std = out_std if name in ("wo", "w_out") else INIT_STD
        return std * jax.random.normal(next(keys), p.shape, jnp.float32)

    return {
        name: {n: init(n, p) for n, p in spec.items()} if isinstance(spec, dict) else init(name, spec)
        for name, spec in shapes.params(cfg, vocab_size).items()
    }


def flops_per_token(cfg: ModelConfig, sequence_length: int, vocab_size: int) -> float:
    """Training FLOPs per token: 6·N for the weight matmuls (forward 2N, backward 4N) plus
    12·L·H·K·S for attention scores and values (PaLM, Chowdhery et al. 2022, arXiv:2204.02311,
    Appendix B: ``6N + 12·L·H·Q·T``).

    N counts the weights used in matmuls (``training.model.shapes.matmul_params``: SwiGLU's three MLP
    matrices, grouped-query attention's narrower key/value projections, the unembedding even
    when tied; not norms nor the embedding gather). The attention term uses the query heads
    (H·K = d_model): key/value heads do not change the score and value FLOPs. Rematerialized
    work is not counted (MFU counts the model's FLOPs, not the recomputation).
    """
    matmul = shapes.matmul_params(cfg, vocab_size)
    return 6.0 * matmul + 12.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * sequence_length


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * scale).astype(x.dtype)


def _rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding over the last axis of ``[B, S, H, K]`` (K even), base
    wavelength ``theta`` (Su et al. 2021, "RoFormer", arXiv:2104.09864, eq. 15)."""
    seq, dim = x.shape[1], x.shape[-1]
    half = dim // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]  # [S, K/2]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return rotated.astype(x.dtype)


def weight_dot(equation: str, x: jax.Array, w: jax.Array, out_dtype: Any) -> jax.Array:
    """``jnp.einsum(equation, x, w)`` for the model's weight matmuls: accumulated in float32,
    returned in ``out_dtype``, and named :data:`DOT_NAME` for the remat policies.

    Args:
      equation: an einsum ``"lhs,rhs->out"`` in which every index appears in exactly two of the
        three terms (no sum within one operand, no batch dimension), e.g. ``"bsd,df->bsf"``.
      x: activations in the compute dtype (bfloat16 or float32).
      w: weights, already cast to the compute dtype.
      out_dtype: dtype of the result (the compute dtype, or float32 for the logits).

    In the backward pass the cotangent is rounded to ``x``'s dtype and each of its two matmuls
    (``dx``, ``dw``) also accumulates in float32 and is rounded to its operand's dtype. That is
    the arithmetic a plain einsum in bfloat16 has on a TPU (the MXU multiplies bfloat16 and
    accumulates in float32: https://cloud.google.com/tpu/docs/bfloat16) and on XLA's CPU
    backend (which runs a bfloat16 → bfloat16 dot as a float32 dot of upcast operands). Asking
    for the float32 accumulator explicitly (``preferred_element_type``) is what lets XLA's CPU
    backend use its bfloat16 dot kernels (AVX512-BF16) instead (docs/model.md "Throughput").
    The matmuls run inside a ``jax.custom_vjp``, whose ``dot_general`` the ``dots_*`` policies
    cannot see: hence the name, which :data:`REMAT_POLICIES` save.
    """
    return checkpoint_name(_accumulating_dot(equation, x, w, out_dtype), DOT_NAME)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3))
def _accumulating_dot(equation: str, x: jax.Array, w: jax.Array, out_dtype: Any) -> jax.Array:
    return jnp.einsum(equation, x, w, preferred_element_type=jnp.float32).astype(out_dtype)


def _accumulating_dot_fwd(
    equation: str, x: jax.Array, w: jax.Array, out_dtype: Any
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _accumulating_dot(equation, x, w, out_dtype), (x, w)


def _accumulating_dot_bwd(
    equation: str, out_dtype: Any, residuals: tuple[jax.Array, jax.Array], g: jax.Array
) -> tuple[jax.Array, jax.Array]:
    x, w = residuals
    inputs, out = equation.split("->")
    lhs, rhs = inputs.split(",")
    g = g.astype(x.dtype)
    dx = jnp.einsum(f"{out},{rhs}->{lhs}", g, w, preferred_element_type=jnp.float32).astype(x.dtype)
    dw = jnp.einsum(f"{lhs},{out}->{rhs}", x, g, preferred_element_type=jnp.float32).astype(w.dtype)
    return dx, dw


_accumulating_dot.defvjp(_accumulating_dot_fwd, _accumulating_dot_bwd)


def forward(
    params: Params,
    tokens: jax.Array,
    cfg: ModelConfig,
    constrain: Constrain = lambda x, axes: x,
    mesh: Mesh | None = None,
) -> jax.Array:
    """Logits for every position.

    Args:
      params: tree from :func:`init_params`.
      tokens: int32 ``[B, S]`` token ids in [0, vocabulary).
      cfg: model config.
      constrain: ``(array, logical_axes) -> array``; the trainer passes a sharding
        constraint so activations stay split over the batch axes.
      mesh: the mesh the arrays live on (the splash kernel runs per device on it); None: one device.

    Returns:
      float32 logits ``[B, S, V]`` (V: the embedding table's rows).
    """
    dtype = jnp.dtype(cfg.compute_dtype)
    eps, theta = cfg.norm_eps, cfg.rope_theta
    # FSDP: gather the embedding table's sharded width before the lookup (its gradient is
    # then reduce-scattered back), instead of resharding the activations.
    embed = constrain(params["embed"], ("vocab", "activation_embed"))
    x = embed[tokens].astype(dtype)
    x = constrain(x, ("batch", "sequence", "activation_embed"))

    def layer(x: jax.Array, p: Params) -> tuple[jax.Array, None]:
        bsd = ("batch", "sequence", "activation_embed")
        bshk = ("batch", "sequence", "heads", "head_dim")
        bsgk = ("batch", "sequence", "kv_heads", "head_dim")
        h = constrain(_rms_norm(x, p["ln1"], eps), bsd)
        q = constrain(_rope(weight_dot("bsd,dhk->bshk", h, p["wq"].astype(dtype), dtype), theta), bshk)
        k = constrain(_rope(weight_dot("bsd,dhk->bshk", h, p["wk"].astype(dtype), dtype), theta), bsgk)
        v = constrain(weight_dot("bsd,dhk->bshk", h, p["wv"].astype(dtype), dtype), bsgk)
        attn = constrain(attention.attend(q, k, v, cfg, mesh), bshk)
        x = constrain(x + weight_dot("bshk,hkd->bsd", attn, p["wo"].astype(dtype), dtype), bsd)
        h = constrain(_rms_norm(x, p["ln2"], eps), bsd)
        up = weight_dot("bsd,df->bsf", h, p["w_in"].astype(dtype), dtype)
        if cfg.mlp == "swiglu":  # SiLU(h·W_gate) ⊙ (h·W_in) (Shazeer 2020, arXiv:2002.05202, eq. 6)
            up = jax.nn.silu(weight_dot("bsd,df->bsf", h, p["w_gate"].astype(dtype), dtype)) * up
        else:
            up = jax.nn.gelu(up)
        h = constrain(up, ("batch", "sequence", "mlp"))
        x = x + weight_dot("bsf,fd->bsd", h, p["w_out"].astype(dtype), dtype)
        return constrain(x, ("batch", "sequence", "activation_embed")), None

    if cfg.remat != "none":  # prevent_cse=False: scan already keeps the recomputation apart
        layer = jax.checkpoint(layer, policy=REMAT_POLICIES[cfg.remat], prevent_cse=False)
    x = layer_scan.scan_layers(layer, x, params["layers"])
    x = _rms_norm(x, params["ln_f"], eps)
    if cfg.tie_embeddings:
        return weight_dot("bsd,vd->bsv", x, embed.astype(dtype), jnp.float32)
    return weight_dot("bsd,dv->bsv", x, params["unembed"].astype(dtype), jnp.float32)


def loss_fn(
    params: Params,
    batch: jax.Array,
    cfg: ModelConfig,
    constrain: Constrain = lambda x, axes: x,
    mesh: Mesh | None = None,
) -> jax.Array:
    """Mean next-token cross-entropy (nats/token) of a ``[B, S+1]`` int32 batch.

    Inputs are ``batch[:, :-1]``, targets ``batch[:, 1:]``. Returns a float32 scalar: per token
    ``logsumexp(logits) − logits[target]`` on the float32 logits
    (``optax.softmax_cross_entropy_with_integer_labels``), averaged. Same value as
    ``−log_softmax(logits)[target]``; its gradient compiles to fewer passes over the
    ``[B, S, V]`` logits than ``log_softmax`` followed by ``take_along_axis`` did on XLA's CPU
    backend (docs/model.md "Throughput").
    """
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = forward(params, inputs, cfg, constrain, mesh)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))

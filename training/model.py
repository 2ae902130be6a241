"""A byte-level decoder-only transformer in plain JAX.

Architecture (GPT-style, pre-norm): byte embedding → ``n_layers`` × [RMSNorm → causal
multi-head self-attention with rotary position embeddings → residual; RMSNorm → GELU MLP →
residual] → RMSNorm → unembedding to 256 byte logits. Layers are stacked along a leading
``layers`` axis and run with ``jax.lax.scan`` (one compiled layer body: fast compiles).

Parameters are float32; matmuls and activations use ``ModelConfig.compute_dtype``; the
softmax and the loss are computed in float32.

Parameter shapes and logical axes: ``training.shapes`` (no jax; the planner reads it too).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from training import shapes
from training.config import ModelConfig
from training.shapes import param_count as param_count  # re-exported (training.train)

Params = dict[str, Any]

#: RoPE base wavelength (Su et al. 2021, "RoFormer", eq. 15).
ROPE_THETA = 10_000.0
INIT_STD = 0.02  # GPT-2 initialization (Radford et al. 2019)


def logical_axes(cfg: ModelConfig) -> Params:
    """Logical axis names of every parameter dimension (same tree as :func:`init_params`)."""
    return jax.tree.map(lambda p: p.axes, shapes.params(cfg), is_leaf=lambda x: isinstance(x, shapes.Param))


def init_params(cfg: ModelConfig, key: jax.Array) -> Params:
    """Random float32 parameters shaped as ``training.shapes.params``: unit norm scales,
    N(0, 0.02²) weights, output projections (wo, w_out) scaled by 1/√(2L) (GPT-2)."""
    keys = iter([*jax.random.split(key, 7), jax.random.fold_in(key, 7)])
    out_std = INIT_STD / math.sqrt(2 * cfg.n_layers)

    def init(name: str, p: shapes.Param) -> jax.Array:
        if p.axes[-1] == "norm":
            return jnp.ones(p.shape, jnp.float32)
        std = out_std if name in ("wo", "w_out") else INIT_STD
        return std * jax.random.normal(next(keys), p.shape, jnp.float32)

    return {
        name: {n: init(n, p) for n, p in spec.items()} if isinstance(spec, dict) else init(name, spec)
        for name, spec in shapes.params(cfg).items()
    }


def flops_per_token(cfg: ModelConfig, sequence_length: int) -> float:
    """Training FLOPs per token: 6·N for the weight matmuls (forward 2N, backward 4N) plus
    12·L·D·S for attention scores and values (PaLM, Chowdhery et al. 2022, Appendix B).

    N counts the weights used in matmuls (all parameters except norms and the embedding
    gather, which costs no FLOPs; the unembedding is a matmul and counts).
    """
    d, f, n = cfg.d_model, cfg.ff_width, cfg.n_layers
    matmul_params = n * (4 * d * d + 2 * d * f) + d * cfg.vocab  # cfg.vocab: the resolved vocabulary
    return 6.0 * matmul_params + 12.0 * n * d * sequence_length


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (normed * scale).astype(x.dtype)


def _rope(x: jax.Array) -> jax.Array:
    """Rotary position embedding over the last axis of ``[B, S, H, K]`` (K even)."""
    seq, dim = x.shape[1], x.shape[-1]
    half = dim // 2
    freqs = ROPE_THETA ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * freqs[None, :]  # [S, K/2]
    sin, cos = jnp.sin(angles)[None, :, None, :], jnp.cos(angles)[None, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return rotated.astype(x.dtype)


def forward(
    params: Params,
    tokens: jax.Array,
    cfg: ModelConfig,
    constrain=lambda x, axes: x,
) -> jax.Array:
    """Logits for every position.

    Args:
      params: tree from :func:`init_params`.
      tokens: int32 ``[B, S]`` byte values in [0, 256).
      cfg: model config.
      constrain: ``(array, logical_axes) -> array``; the trainer passes a sharding
        constraint so activations stay split over the batch axes.

    Returns:
      float32 logits ``[B, S, 256]``.
    """
    dtype = jnp.dtype(cfg.compute_dtype)
    # FSDP: gather the embedding table's sharded width before the lookup (its gradient is
    # then reduce-scattered back), instead of resharding the activations.
    embed = constrain(params["embed"], ("vocab", "activation_embed"))
    x = embed[tokens].astype(dtype)
    x = constrain(x, ("batch", "sequence", "activation_embed"))
    seq = tokens.shape[1]
    mask = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scale = 1.0 / math.sqrt(cfg.head_dim)

    def layer(x, p):
        bsd = ("batch", "sequence", "activation_embed")
        bshk = ("batch", "sequence", "heads", "head_dim")
        h = constrain(_rms_norm(x, p["ln1"]), bsd)
        q = constrain(_rope(jnp.einsum("bsd,dhk->bshk", h, p["wq"].astype(dtype))), bshk)
        k = constrain(_rope(jnp.einsum("bsd,dhk->bshk", h, p["wk"].astype(dtype))), bshk)
        v = constrain(jnp.einsum("bsd,dhk->bshk", h, p["wv"].astype(dtype)), bshk)
        scores = jnp.einsum("bqhk,bthk->bhqt", q, k).astype(jnp.float32) * scale
        scores = jnp.where(mask[None, None], scores, jnp.finfo(jnp.float32).min)
        weights = jax.nn.softmax(scores, axis=-1).astype(dtype)
        attn = constrain(jnp.einsum("bhqt,bthk->bqhk", weights, v), bshk)
        x = constrain(x + jnp.einsum("bshk,hkd->bsd", attn, p["wo"].astype(dtype)), bsd)
        h = constrain(_rms_norm(x, p["ln2"]), bsd)
        h = constrain(jax.nn.gelu(jnp.einsum("bsd,df->bsf", h, p["w_in"].astype(dtype))), ("batch", "sequence", "mlp"))
        x = x + jnp.einsum("bsf,fd->bsd", h, p["w_out"].astype(dtype))
        return constrain(x, ("batch", "sequence", "activation_embed")), None

    x, _ = jax.lax.scan(layer, x, params["layers"])
    x = _rms_norm(x, params["ln_f"])
    return jnp.einsum("bsd,dv->bsv", x, params["unembed"].astype(dtype)).astype(jnp.float32)


def loss_fn(params: Params, batch: jax.Array, cfg: ModelConfig, constrain=lambda x, axes: x) -> jax.Array:
    """Mean next-byte cross-entropy (nats/byte) of a ``[B, S+1]`` int32 batch.

    Inputs are ``batch[:, :-1]``, targets ``batch[:, 1:]``. Returns a float32 scalar.
    """
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = forward(params, inputs, cfg, constrain)
    logprobs = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logprobs, targets[..., None], axis=-1)[..., 0]
    return -jnp.mean(picked)

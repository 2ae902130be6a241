"""Causal self-attention, through the kernel ``model.attention`` names (docs/model.md).

* ``reference``: the plain formulation, which materializes the float32 scores
  ``[batch, heads, seq, seq]``: softmax(q·kᵀ/√K + causal mask)·v.
* ``xla`` and ``cudnn``: ``jax.nn.dot_product_attention`` with ``implementation="xla"`` or
  ``"cudnn"`` (cuDNN's fused flash attention, NVIDIA GPUs only)
  (https://docs.jax.dev/en/latest/_autosummary/jax.nn.dot_product_attention.html).
* ``splash``: the Pallas splash-attention TPU kernel that ships with JAX
  (``jax.experimental.pallas.ops.tpu.splash_attention``), one kernel per device under
  ``jax.shard_map`` (batch over data × fsdp, heads over tensor). Elsewhere than on a TPU it runs
  in Pallas' interpret mode: the same kernel, correct but slow (a warning says so).
* ``auto``: ``training.model.kernels.attention_kernel`` picks per platform at trace time.

Grouped-query attention: ``G`` key/value heads each serve ``H/G`` consecutive query heads
(query head ``h`` reads key/value head ``h // (H/G)``), as ``jax.nn.dot_product_attention``
and the splash kernel both define it.
"""

from __future__ import annotations

import functools
import logging
import math
import typing

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from training import mesh as mesh_lib
from training.config import ModelConfig
from training.model.kernels import attention_kernel
from training.warning_text import emit, no_action

log = logging.getLogger(__name__)

#: Splash block sizes tried, largest first: the largest that divides the sequence length is
#: used for every forward and backward block (the kernel's defaults are 128; its tests use
#: 128-512).
SPLASH_BLOCKS = (512, 256, 128)


def attend(q: jax.Array, k: jax.Array, v: jax.Array, cfg: ModelConfig, mesh: Mesh | None = None) -> jax.Array:
    """Causal attention of ``q`` ``[B, S, H, K]`` over ``k``, ``v`` ``[B, S, G, K]`` (compute
    dtype, G divides H), scaled by 1/√K; returns ``[B, S, H, K]`` in ``q``'s dtype.

    ``mesh``: the device mesh the arrays are laid out on (the splash kernel runs per device
    under ``shard_map`` on it); None: one device.

    Raises:
      ValueError: cudnn on a backend without cuDNN (from JAX), or a kernel that cannot take
        the shapes (``training.model.kernels.kernel_problem`` refuses those at validation).
    """
    kernel = attention_kernel(cfg, jax.default_backend(), q.shape[1])
    scale = 1.0 / math.sqrt(q.shape[-1])
    if kernel == "reference":
        return reference(q, k, v, scale)
    if kernel == "splash":
        return splash(q, k, v, scale, mesh)
    implementation = "cudnn" if kernel == "cudnn" else "xla"
    return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=True, implementation=implementation)


def reference(q: jax.Array, k: jax.Array, v: jax.Array, scale: float) -> jax.Array:
    """The materializing formulation: float32 scores and softmax, weights cast back to the
    compute dtype for the product with ``v``."""
    b, s, h, d = q.shape
    g = k.shape[2]
    grouped = q.reshape(b, s, g, h // g, d)
    scores = jnp.einsum("bqgrk,btgk->bgrqt", grouped, k).astype(jnp.float32) * scale
    mask = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bgrqt,btgk->bqgrk", weights, v).reshape(b, s, h, d)


def splash(q: jax.Array, k: jax.Array, v: jax.Array, scale: float, mesh: Mesh | None) -> jax.Array:
    """The Pallas splash-attention kernel (causal mask), per device under ``shard_map`` when
    ``mesh`` is given; interpret mode off TPU. Sequence length: a multiple of 128."""
    from jax.experimental.pallas.ops.tpu.splash_attention import (  # noqa: PLC0415 (TPU kernels: loaded when used)
        splash_attention_kernel as kernel_lib,
        splash_attention_mask as mask_lib,
    )

    seq = q.shape[1]
    block = next(b for b in SPLASH_BLOCKS if seq % b == 0)
    interpret = jax.default_backend() != "tpu"
    if interpret:
        _warn_interpret()
    sizes = kernel_lib.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        block_q_dq=block,
        block_kv_dq=block,
    )

    def local(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:  # [b, H, S, K] and [b, G, S, K] on one device
        mask = mask_lib.MultiHeadMask([mask_lib.CausalMask((seq, seq)) for _ in range(q.shape[1])])
        kernel = kernel_lib.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
        return typing.cast(jax.Array, jax.vmap(kernel)(q, k, v))  # no residuals: save_residuals is off

    q = (q * scale).astype(k.dtype).swapaxes(1, 2)  # [B, H, S, K]; the kernel does not scale
    k, v = k.swapaxes(1, 2), v.swapaxes(1, 2)
    if mesh is None:
        out = local(q, k, v)
    else:
        q_spec = mesh_lib.logical_to_spec(("batch", "heads", "sequence", "head_dim"))
        kv_spec = mesh_lib.logical_to_spec(("batch", "kv_heads", "sequence", "head_dim"))
        out = jax.shard_map(local, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec), out_specs=q_spec, check_vma=False)(
            q, k, v
        )
    return jnp.swapaxes(out, 1, 2)


@functools.cache
def _warn_interpret() -> None:
    warning = no_action(
        f"model.attention: splash on {jax.default_backend()} runs in Pallas interpret mode (correct but slow)",
        "on TPUs it is compiled",
    )
    emit(warning, log.warning)

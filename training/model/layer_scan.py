"""The layer stack's scan, with its backward pass's residuals stacked as bit patterns.

:func:`scan_layers` computes ``jax.lax.scan(layer, x, stacked)[0]`` and has the same
gradients (the same pullbacks; XLA may fuse the program differently and sum a float32
accumulation in another order: tests/training/test_layer_scan.py): its forward scan runs
``jax.vjp`` of each layer and stacks the pullback's residuals, its backward scan runs the
pullbacks in reverse. The one difference is how a residual is stacked: a bfloat16 or float16
residual is stacked as its ``uint16`` bit pattern (``jax.lax.bitcast_convert_type``, free: no
arithmetic, same bytes) and turned back into the float in the backward scan.

Why: XLA's CPU compiler converts bfloat16 operations to float32 ones so that its backend needs
no bfloat16 lowering for most operations (its ``FloatNormalization`` pass, as the comment above
it in ``xla/service/cpu/cpu_compiler.cc`` says; the ``FloatSupport`` it
uses keeps bfloat16 only in calls, conditionals, custom calls, tuples, while loops,
optimization barriers and converts, ``xla/service/float_support.cc``, besides the dots it
hands to a library: https://github.com/openxla/xla; the pass shows up as
``float-normalization-bf16`` in ``XLA_FLAGS=--xla_dump_hlo_pass_re=.*`` dumps).
Data movement is normalized too, so the ``dynamic-update-slice`` that writes one layer's
bfloat16 residual into its ``[n_layers, ...]`` stack becomes a convert of the *whole* stack to
float32, the update, and a convert back: every layer rewrites every stack, O(n_layers²) memory
traffic, no longer in place; and the backward pass converts whole stacks again. Integers are
not normalized, so a ``uint16`` stack is updated in place. On XLA's CPU backend those updates
and converts were a large share of a bfloat16 step (measured: docs/model.md, "The layer scan against").

Other backends keep bfloat16 data movement as it is (TPU and GPU support it natively), so there
the bit pattern changes nothing but the stack's declared type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

#: Float dtypes stacked as their bit pattern, and the integer type of that pattern.
PACKED_DTYPES: dict[Any, Any] = {jnp.dtype(jnp.bfloat16): jnp.uint16, jnp.dtype(jnp.float16): jnp.uint16}


def _pack(residual: jax.Array) -> jax.Array:
    bits = PACKED_DTYPES.get(jnp.dtype(residual.dtype))
    return residual if bits is None else jax.lax.bitcast_convert_type(residual, bits)


def _unpack(stacked: jax.Array, dtype: Any) -> jax.Array:
    if jnp.dtype(stacked.dtype) == jnp.dtype(dtype):
        return stacked
    return jax.lax.bitcast_convert_type(stacked, dtype)


def scan_layers(layer: Callable[[jax.Array, Any], tuple[jax.Array, Any]], x: jax.Array, stacked: Any) -> jax.Array:
    """``jax.lax.scan(layer, x, stacked)[0]``, differentiable in ``x`` and ``stacked``.

    Args:
      layer: ``(x, p) -> (x, ignored)``, one layer (a ``jax.checkpoint``-wrapped one saves what
        its policy saves: the pullback's residuals are exactly those). It must not close over
        traced arrays: pass them in ``stacked``.
      x: the carry, e.g. ``[B, S, d_model]`` activations in the compute dtype.
      stacked: a pytree of arrays with a leading layer axis (the stacked parameters).

    Returns:
      the carry after the last layer (shape and dtype of ``x``).

    Gradients are those of ``jax.lax.scan``'s own differentiation; the residuals of each layer
    are kept (stacked, as in ``jax.lax.scan``), bfloat16/float16 ones as ``uint16`` (module
    docstring). Residuals that do not depend on the layer (constants of the body) are stacked
    once per layer too, which ``jax.lax.scan``'s partial evaluation can avoid: in the model, the
    rotary tables (``[1, S, 1, K/2]`` float32, two) and the causal mask that
    ``jax.nn.dot_product_attention`` saves broadcast to ``[B, G, H/G, S, S]`` booleans, one byte
    per score beside the two float32 and one bfloat16 copies of the scores it also saves (11 bytes
    per score per layer). In float32, where no stack is normalized, that makes XLA's compiled
    memory of the step slightly larger than with ``jax.lax.scan``; in bfloat16 it is smaller
    (measured: docs/model.md, "The layer scan against"). Reverse mode
    only: a ``jax.custom_vjp`` has no forward-mode derivative (``jax.jvp``, ``jax.hessian``
    raise), which the trainer never takes.
    """
    structure: dict[str, Any] = {}

    @jax.custom_vjp
    def run(x: jax.Array, stacked: Any) -> jax.Array:
        return jax.lax.scan(layer, x, stacked)[0]

    def run_fwd(x: jax.Array, stacked: Any) -> tuple[jax.Array, list[jax.Array]]:
        def body(x: jax.Array, p: Any) -> tuple[jax.Array, list[jax.Array]]:
            y, pullback = jax.vjp(lambda x, p: layer(x, p)[0], x, p)
            # pullback is a jax.tree_util.Partial: its leaves are the residual arrays.
            leaves, treedef = jax.tree.flatten(pullback)
            structure["treedef"], structure["dtypes"] = treedef, [leaf.dtype for leaf in leaves]
            return y, [_pack(leaf) for leaf in leaves]

        return jax.lax.scan(body, x, stacked)

    def run_bwd(residuals: list[jax.Array], g: jax.Array) -> tuple[jax.Array, Any]:
        def body(g: jax.Array, stacked_residuals: list[jax.Array]) -> tuple[jax.Array, Any]:
            leaves = [_unpack(r, d) for r, d in zip(stacked_residuals, structure["dtypes"], strict=True)]
            return jax.tree.unflatten(structure["treedef"], leaves)(g)

        return jax.lax.scan(body, g, residuals, reverse=True)

    run.defvjp(run_fwd, run_bwd)
    return run(x, stacked)

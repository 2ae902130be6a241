"""training.model.layer_scan: the layer stack's scan with bit-pattern residuals, against JAX's own
differentiation of ``jax.lax.scan`` (the reference: the model with ``scan_layers`` swapped for
``jax.lax.scan``)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from training import aot
from training.config import ModelConfig, TrainConfig
from training.model import layer_scan, transformer as model


def lax_scan_layers(layer, x, stacked):
    return jax.lax.scan(layer, x, stacked)[0]


def loss_and_grads(cfg: ModelConfig, params, batch):
    return jax.jit(jax.value_and_grad(lambda p, b: model.loss_fn(p, b, cfg)))(params, batch)


@pytest.mark.parametrize(
    ("dtype", "remat"),
    # remat full and dots_with_no_batch_dims_saveable: tests/training/test_step.py compares every
    # policy with none through this scan, and none is compared with lax.scan's here.
    [("float32", "none"), ("bfloat16", "none"), ("bfloat16", "dots_saveable")],
)
def test_loss_and_gradients_equal_lax_scans(monkeypatch, dtype, remat):
    # Same pullbacks, same arithmetic: only the residuals' stacked type differs. XLA may fuse
    # the two programs differently and so sum float32 accumulations in another order (seen:
    # one bfloat16 case, relative 1.2e-5 on a gradient element of 3e-11): each gradient within
    # 1e-4 relative or 1e-6 of its largest element, the loss within 1e-6 relative.
    cfg = ModelConfig(
        d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, mlp="swiglu", d_ff=64, compute_dtype=dtype, remat=remat
    )
    params = model.init_params(cfg, 256, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (2, 17), 0, 256)
    loss, grads = loss_and_grads(cfg, params, batch)
    monkeypatch.setattr(layer_scan, "scan_layers", lax_scan_layers)
    ref_loss, ref_grads = loss_and_grads(cfg, params, batch)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(ref_grads), strict=True):
        b = np.asarray(b)
        np.testing.assert_allclose(
            np.asarray(a), b, rtol=1e-4, atol=1e-6 * float(np.abs(b).max()), err_msg=jax.tree_util.keystr(path)
        )


def test_a_layer_with_bfloat16_residuals_differentiates_like_lax_scan():
    # A layer outside the model: a bfloat16 carry, a float32 stacked weight cast inside.
    def layer(x, p):
        h = jnp.tanh(jnp.dot(x, p["w"].astype(jnp.bfloat16)))
        return (h * p["b"].astype(jnp.bfloat16) + x).astype(jnp.bfloat16), None

    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (4, 8), jnp.bfloat16)
    stacked = {"w": jax.random.normal(keys[1], (5, 8, 8)) * 0.3, "b": jax.random.normal(keys[2], (5, 8))}

    def loss(scan, x, stacked):
        return jnp.sum(scan(layer, x, stacked).astype(jnp.float32) ** 2)

    ours = jax.jit(jax.value_and_grad(lambda x, s: loss(layer_scan.scan_layers, x, s), argnums=(0, 1)))(x, stacked)
    ref = jax.jit(jax.value_and_grad(lambda x, s: loss(lax_scan_layers, x, s), argnums=(0, 1)))(x, stacked)
    assert ours[1][0].dtype == jnp.bfloat16 and ours[1][1]["w"].dtype == jnp.float32
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


_DEFINITION = re.compile(r"%([\w.\-]+) = (\w+)\[([\d,]*)\]")
_CONVERT = re.compile(r"%[\w.\-]+ = f32\[([\d,]*)\]\S* convert\(%([\w.\-]+)\)")


def whole_stack_upcasts(hlo: str, n_layers: int) -> list[str]:
    """The converts in ``hlo`` (XLA's compiled HLO text) of a bfloat16 ``[n_layers, a, b, ...]``
    array (rank 3 or more: a stack of activations, not of per-layer vectors) to float32."""
    types = {name: (dtype, dims) for name, dtype, dims in _DEFINITION.findall(hlo)}
    found = []
    for dims, operand in _CONVERT.findall(hlo):
        shape = [int(d) for d in dims.split(",") if d]
        if len(shape) >= 3 and shape[0] == n_layers and types.get(operand, ("", ""))[0] == "bf16":
            found.append(f"f32[{dims}] convert(%{operand})")
    return found


def test_the_compiled_step_updates_bfloat16_residual_stacks_in_place(monkeypatch):
    # XLA's CPU compiler normalizes bfloat16 data movement to float32 (training.model.layer_scan): with
    # jax.lax.scan every residual stack is converted whole to float32 and back; with the
    # bit-pattern stacks, none is.
    config = TrainConfig.model_validate(
        {
            "model": {"d_model": 64, "n_layers": 3, "n_heads": 4, "mlp": "swiglu", "d_ff": 128}
            | {"compute_dtype": "bfloat16"},
            "sequence_length": 32,
            "global_batch_size": 4,
        }
    )
    assert whole_stack_upcasts(aot.lower_train_step(config).compile().as_text(), 3) == []
    monkeypatch.setattr(layer_scan, "scan_layers", lax_scan_layers)
    assert whole_stack_upcasts(aot.lower_train_step(config).compile().as_text(), 3) != []

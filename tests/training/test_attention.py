"""training.model.attention: every kernel equals the materializing reference, with and without
grouped-query attention, in the forward pass and its gradients; splash (the Pallas TPU kernel)
runs here in Pallas' interpret mode, alone and per device under shard_map on the 8-device mesh.
cuDNN needs an NVIDIA GPU and is not run here (docs/model.md).

Tolerances (float32 inputs of unit scale): outputs within 2e-5 absolute, gradients within
1e-4 absolute; bfloat16 inputs within 2e-2 (bfloat16 keeps 8 significant bits, ~4e-3
relative, and the kernels round at different points)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from training import mesh as mesh_lib
from training.config import ModelConfig, ParallelismConfig, TrainConfig, load_train_config
from training.model import attention, transformer as model
from training.model.kernels import attention_kernel

F32_OUT, F32_GRAD, BF16 = 2e-5, 1e-4, 2e-2


def qkv(b: int, s: int, h: int, g: int, k: int, dtype=jnp.float32):
    kq, kk, kv = jax.random.split(jax.random.key(0), 3)
    return (
        jax.random.normal(kq, (b, s, h, k), jnp.float32).astype(dtype),
        jax.random.normal(kk, (b, s, g, k), jnp.float32).astype(dtype),
        jax.random.normal(kv, (b, s, g, k), jnp.float32).astype(dtype),
    )


def run(kernel: str, q, k, v, mesh=None):
    cfg = ModelConfig(d_model=q.shape[2] * q.shape[3], n_heads=q.shape[2], n_kv_heads=k.shape[2], attention=kernel)

    # One compiled program for the output and its gradients, as the model runs the kernels (under
    # jit); op by op, every small op would be compiled on its own.
    @jax.jit
    def out_and_grads(q, k, v):
        out = attention.attend(q, k, v, cfg, mesh)
        grads = jax.grad(lambda q, k, v: jnp.sum(jnp.sin(attention.attend(q, k, v, cfg, mesh))), argnums=(0, 1, 2))
        return out, grads(q, k, v)

    return out_and_grads(q, k, v)


@functools.cache
def reference(b: int, s: int, h: int, g: int, k: int, dtype=jnp.float32):
    """The reference kernel's output and gradients on :func:`qkv`'s inputs of these sizes:
    computed once, for every test that compares a kernel with it on those inputs."""
    return run("reference", *qkv(b, s, h, g, k, dtype))


def naive(q, k, v):
    """Attention written out head by head in float64 numpy: the reference's reference."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b, s, h, d = q.shape
    group = h // k.shape[2]
    out = np.zeros_like(q)
    for head in range(h):
        scores = np.einsum("bqd,btd->bqt", q[:, :, head], k[:, :, head // group]) / np.sqrt(d)
        scores = np.where(np.tril(np.ones((s, s), bool)), scores, -np.inf)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        out[:, :, head] = np.einsum("bqt,btd->bqd", weights, v[:, :, head // group])
    return out


@pytest.mark.parametrize("groups", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_the_reference_is_attention(groups):
    q, k, v = qkv(2, 16, 4, groups, 8)
    np.testing.assert_allclose(np.asarray(reference(2, 16, 4, groups, 8)[0]), naive(q, k, v), atol=F32_OUT)


@pytest.mark.parametrize("groups", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_xla_equals_the_reference(groups):
    q, k, v = qkv(2, 16, 4, groups, 8)
    out, grads = run("xla", q, k, v)
    ref_out, ref_grads = reference(2, 16, 4, groups, 8)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), atol=F32_OUT)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=F32_GRAD)


def test_xla_equals_the_reference_in_bfloat16():
    q, k, v = qkv(2, 16, 4, 2, 8, jnp.bfloat16)
    out, _ = run("xla", q, k, v)
    ref, _ = run("reference", q, k, v)
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), atol=BF16)


@pytest.mark.parametrize("groups", [4, 2], ids=["mha", "gqa"])
def test_splash_in_interpret_mode_equals_the_reference(groups):
    q, k, v = qkv(1, 128, 4, groups, 128)  # the kernel's head dim and block: 128
    out, grads = run("splash", q, k, v)
    ref_out, ref_grads = reference(1, 128, 4, groups, 128)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref_out), atol=F32_OUT)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=F32_GRAD)


def test_splash_per_device_under_shard_map_equals_the_reference():
    # Batch over data × fsdp (4 ways), query and key/value heads over tensor (2 ways): each
    # device runs the kernel on its rows and its heads.
    mesh = mesh_lib.build_mesh(
        ParallelismConfig.model_validate({"ici": {"data": 2, "fsdp": 2, "tensor": 2}}), workers_per_slice=1
    )
    q, k, v = qkv(4, 128, 4, 2, 128)
    out, _ = jax.jit(lambda q, k, v: run("splash", q, k, v, mesh))(q, k, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(run("reference", q, k, v)[0]), atol=F32_OUT)


#: The model's loss and gradients as one compiled program per model config (op by op, every
#: small op of the model and of splash's interpreted kernel would be compiled on its own).
LOSS_AND_GRADS = jax.jit(jax.value_and_grad(model.loss_fn), static_argnums=2)


@pytest.mark.parametrize("kernel", ["xla", "splash"])
def test_a_gqa_swiglu_model_gives_the_references_loss_and_gradients_with_each_kernel(kernel):
    cfg = ModelConfig(
        d_model=256, n_layers=2, n_heads=2, n_kv_heads=1, mlp="swiglu", compute_dtype="float32", attention="reference"
    )
    params = model.init_params(cfg, 256, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (2, 129), 0, 256)
    ref_loss, ref_grads = LOSS_AND_GRADS(params, batch, cfg)  # compiled once, for both kernels
    loss, grads = LOSS_AND_GRADS(params, batch, cfg.model_copy(update={"attention": kernel}))
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5)


def test_auto_picks_the_platforms_fused_kernel_where_it_takes_the_shapes():
    wide = ModelConfig(d_model=512, n_heads=4)  # head dim 128
    narrow = ModelConfig(d_model=256, n_heads=4)  # head dim 64
    assert attention_kernel(wide, "tpu", 256) == "splash"
    assert attention_kernel(narrow, "tpu", 256) == "xla"  # splash wants 128-lane head dims
    assert attention_kernel(wide, "tpu", 200) == "xla"  # and whole 128-token blocks
    assert attention_kernel(narrow, "gpu", 256) == attention_kernel(narrow, "cuda", 256) == "cudnn"
    assert attention_kernel(narrow.model_copy(update={"compute_dtype": "float32"}), "gpu", 256) == "xla"
    assert attention_kernel(wide, "cpu", 256) == "xla"
    assert attention_kernel(wide.model_copy(update={"attention": "reference"}), "tpu", 256) == "reference"
    assert TrainConfig().model.attention == "auto"


@pytest.mark.parametrize(
    ("model_keys", "sequence_length", "message"),
    [
        (
            {"attention": "splash"},
            256,
            "model.attention: splash takes head dimensions that are multiples of 128; d_model/n_heads = 256/4 = 64; "
            "use auto, xla or reference",
        ),
        (
            {"attention": "splash", "d_model": 512},
            200,
            "model.attention: splash takes sequence lengths that are multiples of 128; got 200; "
            "use auto, xla or reference",
        ),
        (
            {"attention": "cudnn", "d_model": 1280, "n_heads": 4},
            256,
            "model.attention: cudnn takes head dimensions that are multiples of 8 up to 256; d_model/n_heads = 1280/4 "
            "= 320; use auto, xla or reference",
        ),
        (
            {"attention": "cudnn", "d_model": 40, "n_heads": 4},
            256,
            "model.attention: cudnn takes head dimensions that are multiples of 8 up to 256; d_model/n_heads = 40/4 "
            "= 10; use auto, xla or reference",
        ),
        (
            {"attention": "cudnn", "compute_dtype": "float32"},
            256,
            "model.attention: cudnn needs compute_dtype bfloat16 (cuDNN flash attention takes 16-bit inputs); got "
            "float32; use auto, xla or reference",
        ),
    ],
)
def test_a_head_dimension_the_kernel_cannot_take_is_one_line_naming_the_key(model_keys, sequence_length, message):
    with pytest.raises(ValueError) as err:
        load_train_config({"model": model_keys, "sequence_length": sequence_length})
    assert str(err.value) == f"invalid trainer config:\n  {message}"

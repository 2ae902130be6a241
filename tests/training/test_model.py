"""training.model.transformer and training.optimizer on CPU."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from training.config import ModelConfig, OptimizerConfig
from training.model import transformer as model
from training.optimizer import learning_rate_schedule, make_optimizer

CFG = ModelConfig(d_model=32, n_layers=2, n_heads=4, compute_dtype="float32")


def test_param_count_matches_the_arrays():
    params = model.init_params(CFG, 256, jax.random.key(0))
    counted = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(params))
    assert model.param_count(CFG, 256) == counted


def test_logical_axes_cover_every_dimension():
    params = model.init_params(CFG, 256, jax.random.key(0))
    axes = model.logical_axes(CFG, 256)
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    pairs = jax.tree.leaves(jax.tree.map(lambda a, p: (len(a), p.ndim), axes, params, is_leaf=is_axes), is_leaf=is_axes)
    assert pairs and all(n_axes == ndim for n_axes, ndim in pairs)


def test_flops_per_token_counts_matmul_weights():
    # Direct count: per layer q,k,v,o are D×D and the MLP is 2·D·F; the unembedding D×256.
    d, f, n, s = 32, 128, 2, 64
    weights = n * (4 * d * d + 2 * d * f) + d * 256
    assert model.flops_per_token(CFG, s, 256) == 6 * weights + 12 * n * d * s


def test_initial_loss_is_near_uniform():
    params = model.init_params(CFG, 256, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (4, 17), 0, 256)
    loss = float(model.loss_fn(params, batch, CFG))
    assert abs(loss - math.log(256)) < 0.1


def test_forward_is_causal():
    params = model.init_params(CFG, 256, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
    changed = tokens.at[:, 10:].set((tokens[:, 10:] + 1) % 256)
    a = model.forward(params, tokens, CFG)
    b = model.forward(params, changed, CFG)
    assert a.shape == (2, 16, 256) and a.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(a[:, :10]), np.asarray(b[:, :10]))
    assert not np.allclose(np.asarray(a[:, 10:]), np.asarray(b[:, 10:]))


def test_a_few_adamw_steps_reduce_the_loss_on_repeated_text():
    params = model.init_params(CFG, 256, jax.random.key(0))
    text = np.frombuffer((b"the quick brown fox jumps over the lazy dog. " * 8)[: 8 * 33], dtype=np.uint8)
    batch = jnp.asarray(text.reshape(8, 33).astype(np.int32))
    opt, _ = make_optimizer(OptimizerConfig(peak_learning_rate=1e-2, warmup_steps=0, schedule="constant"), 50)
    state = opt.init(params)

    @jax.jit
    def step(params, state):
        loss, grads = jax.value_and_grad(model.loss_fn)(params, batch, CFG)
        updates, state = opt.update(grads, state, params)
        return jax.tree.map(lambda p, u: p + u, params, updates), state, loss

    losses = []
    for _ in range(30):
        params, state, loss = step(params, state)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_schedule_warms_up_then_decays_to_the_end_fraction(schedule):
    cfg = OptimizerConfig(peak_learning_rate=1.0, warmup_steps=10, schedule=schedule, end_learning_rate_fraction=0.1)
    lr = learning_rate_schedule(cfg, 110)
    assert float(lr(0)) == 0.0
    assert float(lr(5)) == pytest.approx(0.5)
    assert float(lr(10)) == pytest.approx(1.0)
    assert float(lr(110)) == pytest.approx(1.0 if schedule == "constant" else 0.1)


def test_weight_decay_skips_norm_scales():
    params = {"w": jnp.ones((2, 2)), "scale": jnp.ones((2,))}
    opt, _ = make_optimizer(
        OptimizerConfig(
            peak_learning_rate=1.0, warmup_steps=0, schedule="constant", weight_decay=0.5, grad_clip_norm=None
        ),
        10,
    )
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = opt.update(zero, opt.init(params), params)
    assert float(jnp.abs(updates["scale"]).max()) == 0.0
    assert float(jnp.abs(updates["w"]).max()) == pytest.approx(0.5)


def test_flops_per_token_counts_swiglu_gqa_and_the_tied_unembedding():
    # Per layer: q and o D×D, k and v D×(G·K), three D×F MLP matrices; the unembedding D×V is a
    # matmul even when it shares the embedding table. Attention: 12·L·(H·K)·S.
    d, f, n, s, h, g = 64, 96, 2, 32, 8, 2
    cfg = ModelConfig(d_model=d, n_layers=n, n_heads=h, n_kv_heads=g, d_ff=f, mlp="swiglu", tie_embeddings=True)
    k = d // h
    weights = n * (2 * d * d + 2 * d * g * k + 3 * d * f) + d * 1000
    assert model.flops_per_token(cfg, s, 1000) == 6 * weights + 12 * n * d * s


def test_tied_embeddings_unembed_with_the_embedding_table():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4, tie_embeddings=True, compute_dtype="float32")
    params = model.init_params(cfg, 300, jax.random.key(0))
    assert "unembed" not in params and params["embed"].shape == (300, 32)
    logits = model.forward(params, jnp.zeros((1, 4), jnp.int32), cfg)
    assert logits.shape == (1, 4, 300)
    bumped = {**params, "embed": params["embed"].at[7].add(1.0)}  # row 7 also moves logit 7
    delta = model.forward(bumped, jnp.ones((1, 4), jnp.int32), cfg) - model.forward(
        params, jnp.ones((1, 4), jnp.int32), cfg
    )
    assert float(jnp.abs(delta[..., 7]).min()) > 0 and float(jnp.abs(delta[..., 8]).max()) == 0


# --- the weight matmuls: float32 accumulation, compute-dtype operands -----------------------

#: (equation, x shape, w shape, output dtype): a projection, a head merge, the tied unembedding.
DOTS = [
    ("bsd,dhk->bshk", (2, 8, 32), (32, 4, 8), None),
    ("bshk,hkd->bsd", (2, 8, 4, 8), (4, 8, 32), None),
    ("bsd,vd->bsv", (2, 8, 32), (300, 32), "float32"),
]


def _dot_and_grads(fn, equation, x, w, out_dtype, r):
    """Value and (dx, dw) of sum(fn(equation, x, w) · r), in float32."""

    def loss(x, w):
        return jnp.sum(fn(equation, x, w, out_dtype).astype(jnp.float32) * r)

    value, grads = jax.value_and_grad(loss, argnums=(0, 1))(x, w)
    return value, [np.asarray(g, np.float32) for g in grads]


@pytest.mark.parametrize("equation,x_shape,w_shape,out", DOTS)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weight_dot_gives_the_einsum_and_its_gradients(equation, x_shape, w_shape, out, dtype):
    kx, kw, kr = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(kx, x_shape, jnp.float32).astype(dtype)
    w = jax.random.normal(kw, w_shape, jnp.float32).astype(dtype)
    out_dtype = out or dtype
    r = jax.random.normal(kr, jax.eval_shape(lambda: jnp.einsum(equation, x, w)).shape, jnp.float32)

    def plain(eq, a, b, od):  # the einsum on the same (rounded) operands, all in float32
        return jnp.einsum(eq, a.astype(jnp.float32), b.astype(jnp.float32)).astype(od)

    value, grads = _dot_and_grads(model.weight_dot, equation, x, w, out_dtype, r)
    expected, expected_grads = _dot_and_grads(plain, equation, x, w, out_dtype, r)
    # float32: the same sums in another order; bfloat16: the result and the cotangent are
    # rounded to 8 significant bits (relative error 2⁻⁸ each).
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(float(value), float(expected), rtol=tol, atol=tol)
    for got, want in zip(grads, expected_grads, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * float(np.abs(want).max()))


@pytest.mark.parametrize("equation,x_shape,w_shape,out", DOTS)
def test_weight_dot_runs_every_matmul_on_bfloat16_operands_with_a_float32_accumulator(equation, x_shape, w_shape, out):
    # The point of weight_dot: forward and both backward matmuls take compute-dtype operands
    # (XLA's CPU backend then uses its bfloat16 kernels) and accumulate in float32, even when
    # the output (the logits) is float32 and so its cotangent arrives in float32.
    x = jnp.ones(x_shape, jnp.bfloat16)
    w = jnp.ones(w_shape, jnp.bfloat16)
    out_dtype = out or "bfloat16"

    def loss(x, w):
        return jnp.sum(model.weight_dot(equation, x, w, out_dtype).astype(jnp.float32))

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w)

    def dots(j):  # every dot_general, in nested jaxprs too
        for eqn in j.eqns:
            if eqn.primitive.name == "dot_general":
                yield eqn
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)  # a ClosedJaxpr's Jaxpr
                if hasattr(inner, "eqns"):
                    yield from dots(inner)

    found = list(dots(jaxpr.jaxpr))
    assert len(found) == 3, jaxpr  # forward, dx, dw
    for eqn in found:
        assert [str(v.aval.dtype) for v in eqn.invars] == ["bfloat16", "bfloat16"], eqn
        assert eqn.params["preferred_element_type"] == jnp.float32, eqn


def test_loss_is_the_mean_negative_log_softmax_of_the_targets():
    # Computed independently in float64 with numpy from the model's logits.
    params = model.init_params(CFG, 256, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (3, 17), 0, 256)
    logits = np.asarray(model.forward(params, batch[:, :-1], CFG), dtype=np.float64)
    targets = np.asarray(batch[:, 1:])
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    expected = -np.take_along_axis(log_softmax, targets[..., None], axis=-1).mean()
    assert float(model.loss_fn(params, batch, CFG)) == pytest.approx(expected, rel=1e-6)

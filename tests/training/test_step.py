"""training.step: the jitted train and eval steps on a tiny model over the 8 CPU devices
(data 2 x fsdp 2 x tensor 2), checked against a direct evaluation of training.model.transformer."""

from __future__ import annotations

import functools
import json
import math

import jax
import numpy as np
import optax
import pytest

from tests.helpers.train_step import CONFIG
from training import mesh as mesh_lib, optimizer as optimizer_lib, state as state_lib, step as step_lib
from training.config import TrainConfig, load_train_config
from training.model import transformer as model


@pytest.fixture(scope="module")
def setup():
    mesh = mesh_lib.build_mesh(CONFIG.parallelism, workers_per_slice=1)
    opt, _ = optimizer_lib.make_optimizer(CONFIG.optimizer, CONFIG.steps)
    shardings = state_lib.shardings(CONFIG, mesh, opt)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    rows = np.random.default_rng(0).integers(
        0, 256, (CONFIG.global_batch_size, CONFIG.sequence_length + 1), dtype=np.int32
    )
    batch = jax.device_put(rows, batch_sharding)
    return mesh, opt, shardings, batch_sharding, batch


#: The model's loss and gradients, evaluated directly (one compiled program per model config
#: and batch shape, shared by the tests here).
LOSS_AND_GRADS = jax.jit(jax.value_and_grad(model.loss_fn), static_argnums=2)


def fresh_state(opt, shardings):
    params = model.init_params(CONFIG.model, CONFIG.vocab_size, jax.random.key(CONFIG.seed))
    return jax.device_put({"params": params, "opt_state": opt.init(params)}, shardings)


def test_train_step_loss_and_grad_norm_are_the_models_and_the_loss_falls(setup):
    mesh, opt, shardings, batch_sharding, batch = setup
    step = step_lib.make_train_step(CONFIG.model, opt, mesh, shardings, batch_sharding)
    state = fresh_state(opt, shardings)
    losses = []
    for _ in range(4):
        params = jax.device_get(state["params"])  # the step donates the state
        direct, grads = LOSS_AND_GRADS(params, np.asarray(batch), CONFIG.model)
        state, metrics = step(state, batch)
        np.testing.assert_allclose(float(metrics["loss"]), float(direct), rtol=1e-5)
        np.testing.assert_allclose(
            float(metrics["grad_norm"]),
            math.sqrt(sum(float(np.sum(np.square(g))) for g in jax.tree.leaves(grads))),
            rtol=1e-4,
        )
        losses.append(float(metrics["loss"]))
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
    assert jax.tree.map(lambda a: a.sharding, state) == shardings  # the layout is kept


def test_eval_step_is_the_models_loss_and_leaves_the_params(setup):
    mesh, opt, shardings, batch_sharding, batch = setup
    state = fresh_state(opt, shardings)
    before = jax.device_get(state["params"])
    eval_step = step_lib.make_eval_step(CONFIG.model, mesh, shardings["params"], batch_sharding)
    loss = eval_step(state["params"], batch)
    assert loss.dtype == np.float32 and loss.shape == ()
    np.testing.assert_allclose(float(loss), float(model.loss_fn(before, np.asarray(batch), CONFIG.model)), rtol=1e-5)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state["params"]), before)


# --- gradient accumulation and rematerialization ----------------------------------------

ACCUMULATE = CONFIG.model_copy(update={"global_batch_size": 16})  # 4 rows per data × fsdp shard


@functools.cache  # one_update(1) is every accumulation test's reference
def one_update(microbatches: int, model_cfg=CONFIG.model):
    """Params, loss and grad norm after one step of ACCUMULATE's batch from the seed's state."""
    mesh = mesh_lib.build_mesh(ACCUMULATE.parallelism, workers_per_slice=1)
    # Plain SGD with learning rate 1: the update is the (mean) gradient itself. AdamW's first
    # update is about lr·sign(gradient), which turns the last bit of a gradient near zero into a
    # whole step: it compares summation orders, not accumulation.
    opt = optax.sgd(1.0)
    shardings = state_lib.shardings(ACCUMULATE, mesh, opt)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    rows = np.random.default_rng(1).integers(0, 256, (16, ACCUMULATE.sequence_length + 1), dtype=np.int32)
    step = step_lib.make_train_step(model_cfg, opt, mesh, shardings, batch_sharding, microbatches=microbatches)
    params = model.init_params(model_cfg, 256, jax.random.key(0))
    state = jax.device_put({"params": params, "opt_state": opt.init(params)}, shardings)
    state, metrics = step(state, jax.device_put(rows, batch_sharding))
    assert jax.tree.map(lambda a: a.sharding, state) == shardings  # the accumulation keeps the layout
    return jax.device_get(state["params"]), float(metrics["loss"]), float(metrics["grad_norm"])


@pytest.mark.parametrize("microbatches", [2, 4])
def test_k_microbatches_of_b_over_k_give_the_update_of_one_batch_of_b(microbatches):
    # float32: the loss, the gradient norm and every updated parameter within 1e-6 relative
    # (plus 1e-8 absolute for values near zero): the two differ only in summation order.
    params, loss, norm = one_update(1)
    acc_params, acc_loss, acc_norm = one_update(microbatches)
    assert acc_loss == pytest.approx(loss, rel=1e-6)
    assert acc_norm == pytest.approx(norm, rel=1e-6)
    for a, b in zip(jax.tree.leaves(acc_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-8)


def test_microbatches_that_do_not_divide_the_per_replica_batch_are_refused():
    with pytest.raises(ValueError) as err:
        load_train_config({**json.loads(ACCUMULATE.model_dump_json()), "microbatches": 3})
    assert (
        "microbatches: 3 does not divide the per-replica batch 4 (global_batch_size 16 ÷ data-parallel size 4); "
        in (str(err.value))
    )


@pytest.mark.parametrize("policy", ["full", "dots_saveable", "dots_with_no_batch_dims_saveable"])
def test_remat_gives_the_loss_and_gradients_of_no_remat(policy):
    # float32: recomputing the forward in the backward pass changes nothing but the order of
    # evaluation: the loss within 1e-6 relative, gradients within 1e-6 absolute.
    cfg = CONFIG.model.model_copy(update={"n_layers": 2, "d_model": 16})
    params = model.init_params(cfg, 256, jax.random.key(0))
    batch = jax.random.randint(jax.random.key(1), (2, 9), 0, 256)
    loss, grads = LOSS_AND_GRADS(params, batch, cfg)  # compiled once for every policy
    remat = cfg.model_copy(update={"remat": policy})
    r_loss, r_grads = LOSS_AND_GRADS(params, batch, remat)
    assert float(r_loss) == pytest.approx(float(loss), rel=1e-6)
    for a, b in zip(jax.tree.leaves(r_grads), jax.tree.leaves(grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
    # The policy is in the compiled program: a checkpoint (remat) appears in the jaxpr.
    jaxpr = str(jax.make_jaxpr(jax.grad(model.loss_fn), static_argnums=2)(params, batch, remat))
    assert "checkpoint" in jaxpr or "remat" in jaxpr
    assert "remat" not in str(jax.make_jaxpr(jax.grad(model.loss_fn), static_argnums=2)(params, batch, cfg))


def test_the_dots_policies_keep_the_weight_matmuls_in_the_compiled_step():
    # XLA's own buffer plan of the real train step (training.aot): full remat keeps the least,
    # dots_with_no_batch_dims_saveable also keeps the weight matmuls' outputs, dots_saveable
    # the attention's batched dots too. The weight matmuls run inside a custom_vjp
    # (model.weight_dot): without their checkpoint_name no dots policy would see them.
    from training import aot

    def temp(policy: str) -> int:
        config = TrainConfig.model_validate(
            {
                "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "mlp": "swiglu", "d_ff": 128}
                | {"compute_dtype": "bfloat16", "remat": policy},
                "sequence_length": 32,
                "global_batch_size": 8,
            }
        )
        return aot.compiled_memory(config).temp

    assert temp("full") < temp("dots_with_no_batch_dims_saveable") < temp("dots_saveable")

"""training.step: the jitted train and eval steps on a tiny model over the 8 CPU devices
(data 2 x fsdp 2 x tensor 2), checked against a direct evaluation of training.model."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest

from training import mesh as mesh_lib, model, optimizer as optimizer_lib, state as state_lib, step as step_lib
from training.config import TrainConfig

CONFIG = TrainConfig.model_validate(
    {
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
        "sequence_length": 16,
        "global_batch_size": 8,
        "steps": 20,
        "optimizer": {"warmup_steps": 0, "schedule": "constant"},
        "parallelism": {"ici": {"data": 2, "fsdp": 2, "tensor": 2}},
    }
)


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
        direct, grads = jax.value_and_grad(model.loss_fn)(params, np.asarray(batch), CONFIG.model)
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

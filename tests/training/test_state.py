"""training.state: shardings of the train state, and restore-or-init against a real Orbax
checkpoint in a local run directory (tiny model, 8 CPU devices)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from tests.helpers.train_step import CONFIG
from training import mesh as mesh_lib, optimizer as optimizer_lib, state as state_lib
from training.checkpoint import manager as checkpointing
from training.model import transformer as model
from training.model.shapes import Param, params as param_shapes
from training.run_dir import RunDir


@pytest.fixture(scope="module")
def parts():
    mesh = mesh_lib.build_mesh(CONFIG.parallelism, workers_per_slice=1)
    opt, _ = optimizer_lib.make_optimizer(CONFIG.optimizer, CONFIG.steps)
    return mesh, opt, state_lib.shardings(CONFIG, mesh, opt)


def test_params_are_sharded_by_their_logical_axes(parts):
    mesh, _, shardings = parts
    expected = jax.tree.map(
        lambda p: mesh_lib.sharding_for(mesh, p.axes),
        param_shapes(CONFIG.model, CONFIG.vocab_size),
        is_leaf=lambda x: isinstance(x, Param),
    )
    assert shardings["params"] == expected
    assert any(s.spec != mesh_lib.sharding_for(mesh, ()).spec for s in jax.tree.leaves(expected))  # not all replicated


def test_a_new_run_starts_at_step_0_from_the_seed(parts, tmp_path):
    _, opt, shardings = parts
    manager = checkpointing.make_manager(RunDir(str(tmp_path)), CONFIG)
    step, state, restored = state_lib.restore_or_init(CONFIG, opt, shardings, manager, is_writer=True)
    manager.close()
    assert (step, restored) == (0, False)
    expected = model.init_params(CONFIG.model, CONFIG.vocab_size, jax.random.key(CONFIG.seed))
    jax.tree.map(
        lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6),
        jax.device_get(state["params"]),
        jax.device_get(expected),
    )
    assert jax.tree.map(lambda a: a.sharding, state) == shardings


def test_an_existing_checkpoint_is_restored_onto_the_shardings(parts, tmp_path):
    _, opt, shardings = parts
    run_dir = RunDir(str(tmp_path))
    params = jax.tree.map(lambda p: p + 1.0, model.init_params(CONFIG.model, CONFIG.vocab_size, jax.random.key(7)))
    saved = jax.device_put({"params": params, "opt_state": opt.init(params)}, shardings)
    manager = checkpointing.make_manager(run_dir, CONFIG)
    checkpointing.save(manager, 3, saved)
    manager.wait_until_finished()
    manager.close()
    manager = checkpointing.make_manager(run_dir, CONFIG)
    step, state, restored = state_lib.restore_or_init(CONFIG, opt, shardings, manager, is_writer=True)
    manager.close()
    assert (step, restored) == (3, True)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state), jax.device_get(saved))
    assert jax.tree.map(lambda a: a.sharding, state) == shardings

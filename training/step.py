"""The jitted train and eval steps over the mesh's shardings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import Mesh, NamedSharding

from training import mesh as mesh_lib, model
from training.config import ModelConfig


def _constrain(mesh: Mesh) -> Callable:
    return lambda x, axes: jax.lax.with_sharding_constraint(x, mesh_lib.sharding_for(mesh, axes))


def make_train_step(
    cfg: ModelConfig, optimizer: optax.GradientTransformation, mesh: Mesh, shardings: Any, batch_sharding: NamedSharding
) -> Callable:
    """``step(state, batch) -> (state, {"loss", "grad_norm"})``: ``state`` is ``{"params",
    "opt_state"}`` laid out as ``shardings`` (donated), ``batch`` int32 ``[global_batch,
    sequence_length + 1]`` bytes; ``loss`` is :func:`training.model.loss_fn` at the params
    before the update, ``grad_norm`` its gradient's global L2 norm (float32 scalars)."""
    constrain = _constrain(mesh)

    def train_step(state, batch):
        loss, grads = jax.value_and_grad(model.loss_fn)(state["params"], batch, cfg, constrain)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return jax.jit(
        train_step, in_shardings=(shardings, batch_sharding), out_shardings=(shardings, None), donate_argnums=0
    )


def make_eval_step(cfg: ModelConfig, mesh: Mesh, param_shardings: Any, batch_sharding: NamedSharding) -> Callable:
    """``eval_step(params, batch) -> loss``: :func:`training.model.loss_fn` (float32 scalar)."""
    constrain = _constrain(mesh)

    def eval_step(params, batch):
        return model.loss_fn(params, batch, cfg, constrain)

    return jax.jit(eval_step, in_shardings=(param_shardings, batch_sharding))

"""The jitted train and eval steps over the mesh's shardings, with gradient accumulation.

With ``microbatches`` k > 1 the step splits its global batch into k microbatches and sums the
float32 gradients of each in a ``jax.lax.scan`` before the one optimizer update: the same
update as one batch (the mean loss over equal-sized microbatches is the mean over the batch),
with the activations of one microbatch at a time. Microbatch j holds rows ``i·k + j`` of the
batch: every device's block of rows ``[r·B/n, (r+1)·B/n)`` (n = data × fsdp) contributes B/(n·k)
rows to each microbatch, so the split is a local reshape, no data moves between devices, and
the batch of each step is still the rows the data gives for that step (training.data.text, training.data.tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding

from training import mesh as mesh_lib
from training.config import ModelConfig
from training.model import transformer as model


def _constrain(mesh: Mesh) -> Callable:
    return lambda x, axes: jax.lax.with_sharding_constraint(x, mesh_lib.sharding_for(mesh, axes))


def make_train_step(
    cfg: ModelConfig,
    optimizer: optax.GradientTransformation,
    mesh: Mesh,
    shardings: Any,
    batch_sharding: NamedSharding,
    microbatches: int = 1,
) -> Callable:
    """``step(state, batch) -> (state, {"loss", "grad_norm"})``: ``state`` is ``{"params",
    "opt_state"}`` laid out as ``shardings`` (donated), ``batch`` int32 ``[global_batch,
    sequence_length + 1]`` tokens; ``loss`` is :func:`training.model.transformer.loss_fn` at the params
    before the update (the mean over the ``microbatches``), ``grad_norm`` its gradient's global
    L2 norm (float32 scalars). ``microbatches`` must divide each device's rows of the batch
    (``TrainConfig`` checks it as ``microbatches``)."""
    constrain = _constrain(mesh)
    grad_fn = jax.value_and_grad(lambda params, rows: model.loss_fn(params, rows, cfg, constrain, mesh))

    def loss_and_grads(params: Any, batch: jax.Array) -> tuple[jax.Array, Any]:
        if microbatches == 1:
            return grad_fn(params, batch)
        rows, width = batch.shape
        split = batch.reshape(rows // microbatches, microbatches, width).swapaxes(0, 1)  # [k, B/k, S+1]
        split = constrain(split, (None, "batch", "sequence"))

        def accumulate(carry: tuple[jax.Array, Any], rows: jax.Array) -> tuple[tuple[jax.Array, Any], None]:
            loss, grads = grad_fn(params, rows)
            return jax.tree.map(jnp.add, carry, (loss, grads)), None

        zeros = jax.tree.map(jnp.zeros_like, params)
        zeros = jax.lax.with_sharding_constraint(zeros, shardings["params"])
        (loss, grads), _ = jax.lax.scan(accumulate, (jnp.zeros((), jnp.float32), zeros), split)
        return jax.tree.map(lambda x: x / microbatches, (loss, grads))

    def train_step(state: dict[str, Any], batch: jax.Array) -> tuple[dict[str, Any], dict[str, jax.Array]]:
        loss, grads = loss_and_grads(state["params"], batch)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    return jax.jit(
        train_step, in_shardings=(shardings, batch_sharding), out_shardings=(shardings, None), donate_argnums=0
    )


def make_eval_step(cfg: ModelConfig, mesh: Mesh, param_shardings: Any, batch_sharding: NamedSharding) -> Callable:
    """``eval_step(params, batch) -> loss``: :func:`training.model.transformer.loss_fn` (float32 scalar)."""
    constrain = _constrain(mesh)

    def eval_step(params: Any, batch: jax.Array) -> jax.Array:
        return model.loss_fn(params, batch, cfg, constrain, mesh)

    return jax.jit(eval_step, in_shardings=(param_shardings, batch_sharding))

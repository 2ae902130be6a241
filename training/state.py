"""The train state ``{"params", "opt_state"}``: its shardings, and its restore or init."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import optax
from jax.sharding import Mesh

from training import mesh as mesh_lib
from training.checkpoint import integrity as checkpoint_integrity, manager as checkpointing
from training.config import TrainConfig
from training.model import transformer as model


def shardings(cfg: TrainConfig, mesh: Mesh, optimizer: optax.GradientTransformation) -> Any:
    """The state's ``NamedSharding`` tree: params by their logical axes
    (:func:`training.model.transformer.logical_axes`), optimizer moments as their params, the rest
    (step counts) replicated."""
    axes = model.logical_axes(cfg.model, cfg.vocab_size)
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)  # noqa: E731
    param_shardings = jax.tree.map(lambda a: mesh_lib.sharding_for(mesh, a), axes, is_leaf=is_axes)
    abstract_params = jax.eval_shape(lambda: model.init_params(cfg.model, cfg.vocab_size, jax.random.key(0)))
    abstract_opt = jax.eval_shape(optimizer.init, abstract_params)
    replicated = mesh_lib.sharding_for(mesh, ())
    opt_shardings = optax.tree_map_params(
        optimizer,
        lambda _, sharding: sharding,
        abstract_opt,
        param_shardings,
        transform_non_params=lambda _: replicated,
    )
    return {"params": param_shardings, "opt_state": opt_shardings}


def initializer(cfg: TrainConfig, optimizer: optax.GradientTransformation) -> Callable[[], Any]:
    """``init_state() -> {"params", "opt_state"}``: the model's initial parameters (seed
    ``cfg.seed``) and ``optimizer``'s state for them (call it under ``jax.jit`` or
    ``jax.eval_shape``)."""

    def init_state():
        params = model.init_params(cfg.model, cfg.vocab_size, jax.random.key(cfg.seed))
        return {"params": params, "opt_state": optimizer.init(params)}

    return init_state


def abstract(cfg: TrainConfig, optimizer: optax.GradientTransformation, state_shardings: Any) -> Any:
    """The train state's shapes, dtypes and shardings (``jax.ShapeDtypeStruct`` leaves, laid
    out as ``state_shardings``): what a checkpoint restores onto, computed without any FLOP."""
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        jax.eval_shape(initializer(cfg, optimizer)),
        state_shardings,
    )


def restore_or_init(
    cfg: TrainConfig,
    optimizer: optax.GradientTransformation,
    state_shardings: Any,
    manager: Any,
    *,
    is_writer: bool,
    on_fallback: Callable[[checkpointing.Fallback], None] | None = None,
) -> tuple[int, Any, bool]:
    """``(step, state, restored)``: the newest checkpoint of ``manager`` that every process
    can read and whose state passes training.checkpoint.integrity's checks (the checksums its
    save recorded, finite values) (:func:`training.checkpoint.manager.restore`; ``on_fallback``
    gets each newer step skipped), else step 0 and params from ``cfg.seed``; laid out as
    ``state_shardings``.
    Raises checkpointing.CheckpointRestoreError, agreement.AgreementError."""

    init_state = initializer(cfg, optimizer)
    abstract_state = abstract(cfg, optimizer, state_shardings)

    def check(step: int, state: Any) -> str:  # a collective first, then this process's read of the record
        summary = checkpoint_integrity.summarize(state)
        return checkpoint_integrity.problems(summary, manager.custom_metadata(step))

    restored = checkpointing.restore(manager, abstract_state, is_writer=is_writer, on_fallback=on_fallback, check=check)
    if restored is None:
        return 0, jax.jit(init_state, out_shardings=state_shardings)(), False
    return (*restored, True)

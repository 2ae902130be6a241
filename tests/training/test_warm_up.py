"""training.setup.warm_up, the start-up warm-up: the restore's checksums and the train and eval steps,
compiled from the state's shapes in a thread while the main thread restores, leave nothing to
compile when they are first called on the restored state; a run that never evaluates traces and
compiles no eval step."""

from __future__ import annotations

import jax
import numpy as np

from tests.helpers.train_runs import SINGLE
from training import mesh as mesh_lib, optimizer as optimizer_lib, state as state_lib, step as step_lib
from training.checkpoint import integrity as checkpoint_integrity
from training.config import TrainConfig
from training.model import transformer as model
from training.run_dir import RunDir
from training.setup import setup_train_loop, warm_up

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
CONFIG = TrainConfig.model_validate(
    {
        "model": {"d_model": 24, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
        "sequence_length": 12,
        "global_batch_size": 8,
        "steps": 10,
        "parallelism": {"ici": {"data": 2, "fsdp": 4}},
    }
)


def test_the_first_calls_after_the_warm_up_compile_nothing():
    mesh = mesh_lib.build_mesh(CONFIG.parallelism, workers_per_slice=1)
    opt, _ = optimizer_lib.make_optimizer(CONFIG.optimizer, CONFIG.steps)
    shardings = state_lib.shardings(CONFIG, mesh, opt)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    train_step = step_lib.make_train_step(CONFIG.model, opt, mesh, shardings, batch_sharding)
    eval_step = step_lib.make_eval_step(CONFIG.model, mesh, shardings["params"], batch_sharding)
    shape = (CONFIG.global_batch_size, CONFIG.sequence_length + 1)
    spec = jax.ShapeDtypeStruct(shape, np.int32, sharding=batch_sharding)
    warm_up(train_step, eval_step, state_lib.abstract(CONFIG, opt, shardings), spec).result()

    # A "restored" state and a batch, as the loop has them (their own transfers compile nothing).
    def init():
        params = model.init_params(CONFIG.model, CONFIG.vocab_size, jax.random.key(0))
        return {"params": params, "opt_state": opt.init(params)}

    state = jax.jit(init, out_shardings=shardings)()
    batch = jax.device_put(np.ones(shape, np.int32), batch_sharding)
    jax.block_until_ready((state, batch))
    compiles: list[float] = []
    listening = [True]
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiles.append(seconds) if listening[0] and event == COMPILE_EVENT else None
    )
    try:
        checkpoint_integrity.summarize(state)
        float(eval_step(state["params"], batch))
        _, metrics = train_step(state, batch)
        float(metrics["loss"])
    finally:
        listening[0] = False
    assert compiles == []


def test_a_run_that_never_evaluates_builds_no_eval_step(tmp_path, monkeypatch):
    """``eval_every_steps: 0`` (the default): each start skips the eval step's tracing and
    compilation; with evaluation on, the warm-up compiles it (the test above)."""
    built: list[int] = []
    make_eval_step = step_lib.make_eval_step
    monkeypatch.setattr(step_lib, "make_eval_step", lambda *args: built.append(1) or make_eval_step(*args))
    never = CONFIG.model_copy(update={"eval_every_steps": 0})
    setup = setup_train_loop(never, RunDir(str(tmp_path / "never")), SINGLE)
    setup.warmed.result()
    assert setup.eval_step is None and built == []
    every = CONFIG.model_copy(update={"eval_every_steps": 5})
    setup = setup_train_loop(every, RunDir(str(tmp_path / "every")), SINGLE)
    setup.warmed.result()
    assert setup.eval_step is not None and built == [1]

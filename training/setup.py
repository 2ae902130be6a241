"""Everything the training loop needs before its first step (MaxText's ``setup_train_loop``):
the hybrid mesh, the data set and its rows for this process, the optimizer, the state's
shardings, the jitted train and eval steps (compiled in a thread while the checkpoint is read:
:func:`warm_up`), the checkpoint manager, and the state restored from the newest finalized
checkpoint every process can read and trust, or initialized from the seed.

:func:`setup_train_loop` returns them as one :class:`TrainSetup`; ``training.train`` runs the
loop over it. Start-up order and what overlaps what: docs/goodput.md, "Start-up".
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from typing import Any

import jax
import numpy as np
import optax

from training import (
    cluster,
    elastic,
    mesh as mesh_lib,
    optimizer as optimizer_lib,
    state as state_lib,
    step as step_lib,
)
from training.checkpoint import integrity as checkpoint_integrity, manager as checkpointing
from training.config import TrainConfig
from training.data.base import Dataset
from training.data.sources import open_dataset, with_vocabulary
from training.run_dir import RunDir

log = logging.getLogger("training")


@dataclasses.dataclass
class TrainSetup:
    """What :func:`setup_train_loop` built for one start of the run.

    Attributes:
      config: the run's config with ``model.vocab_size`` resolved from the data.
      recorded_config: the config as the stack gives it (``vocab_size`` possibly None): what the
        run directory records.
      mesh: the hybrid (DCN × ICI) device mesh.
      dataset: the data set (bytes or a prepared one).
      rows: ``(start, stop)``, the rows of every global batch this process reads.
      batch_sharding: the global batch's sharding over ``mesh``.
      global_shape: ``(global_batch_size, sequence_length + 1)``, int32 token ids.
      schedule: the learning-rate schedule (step -> float).
      train_step: ``train_step(state, batch) -> (state, metrics)``, jitted.
      eval_step: ``eval_step(params, batch) -> loss``, jitted; None when the run never
        evaluates (``eval_every_steps`` 0).
      warmed: the warm-up's future (:func:`warm_up`); its errors are the first step's.
      manager: the run's checkpoint manager.
      state: the train state ``{"params", "opt_state"}``, restored or initialized.
      start_step: the step ``state`` is at (0 when initialized).
      restored: whether ``state`` came from a checkpoint.
      restore_s: seconds spent restoring or initializing.
      fallbacks: the checkpoints the restore passed over, newest first (each one a
        ``restore_fallback`` event).
    """

    config: TrainConfig
    recorded_config: TrainConfig
    mesh: jax.sharding.Mesh
    dataset: Dataset
    rows: tuple[int, int]
    batch_sharding: jax.sharding.NamedSharding
    global_shape: tuple[int, int]
    schedule: optax.Schedule
    train_step: Any
    eval_step: Any | None
    warmed: concurrent.futures.Future[None]
    manager: checkpointing.CheckpointManager
    state: Any
    start_step: int
    restored: bool
    restore_s: float
    fallbacks: list[checkpointing.Fallback]

    def global_batch(self, local_rows: np.ndarray) -> jax.Array:
        """This process's rows (int32 ``[stop - start, S + 1]``) as the global batch array."""
        return jax.make_array_from_process_local_data(self.batch_sharding, local_rows, self.global_shape)


def setup_train_loop(
    config: TrainConfig,
    run_dir: RunDir,
    identity: cluster.ClusterIdentity,
    dataset_future: concurrent.futures.Future[Dataset] | None = None,
) -> TrainSetup:
    """Build the mesh, data, steps and state of one start (the module docstring lists them).

    Args:
      config: the trainer config.
      run_dir: the run directory, shared by all processes.
      identity: this process's place in the job.
      dataset_future: the data set opened while the peers joined (``training.train.run``); None
        opens it here.

    Raises:
      checkpointing.RunConfigMismatch: the run directory holds a run of another shape.
      DataError: the data cannot be read or its vocabulary does not fit the config.
      mesh_lib.MeshError: the devices cannot form the configured mesh.
      checkpointing.CheckpointRestoreError: no checkpoint of the run can be restored.
    """
    is_writer = jax.process_index() == 0
    checkpointing.check_run_config(run_dir, config)

    stacks = config
    config = elastic.for_slices(config, identity.num_slices)  # fewer slices: more microbatches, same batch
    if config is not stacks:
        log.info(
            "elastic: training on %d of %d slices: dcn data %d, %d microbatches per step (global batch %d)",
            identity.num_slices,
            stacks.parallelism.dcn.product,
            config.parallelism.dcn.data,
            config.microbatches,
            config.global_batch_size,
        )
    mesh = mesh_lib.build_mesh(config.parallelism, workers_per_slice=identity.workers_per_slice)
    # bytes, or a prepared dataset read by row with prefetch (opened while peers joined)
    dataset = dataset_future.result() if dataset_future is not None else open_dataset(config)
    recorded_config, config = stacks, with_vocabulary(config, dataset.vocab_size)  # the stack's, at any count
    batch_sharding = mesh_lib.batch_sharding(mesh)
    rows = mesh_lib.process_batch_rows(mesh, config.global_batch_size, config.sequence_length + 1)
    global_shape = (config.global_batch_size, config.sequence_length + 1)

    opt, schedule = optimizer_lib.make_optimizer(config.optimizer, config.steps)
    shardings = state_lib.shardings(config, mesh, opt)
    train_step = step_lib.make_train_step(
        config.model, opt, mesh, shardings, batch_sharding, microbatches=config.microbatches
    )
    eval_step = (
        step_lib.make_eval_step(config.model, mesh, shardings["params"], batch_sharding)
        if config.eval_every_steps
        else None  # never called: nothing to trace or compile at each start
    )
    batch_spec = jax.ShapeDtypeStruct(global_shape, np.int32, sharding=batch_sharding)
    warmed = warm_up(train_step, eval_step, state_lib.abstract(config, opt, shardings), batch_spec)

    manager = checkpointing.make_manager(run_dir, config)
    fallbacks: list[checkpointing.Fallback] = []
    restoring = time.time()
    start_step, state, restored = state_lib.restore_or_init(
        config, opt, shardings, manager, is_writer=is_writer, on_fallback=fallbacks.append
    )
    restore_s = time.time() - restoring
    if is_writer:
        checkpointing.record_run_config(run_dir, recorded_config)  # vocab_size as the stack gives it
    return TrainSetup(
        config=config,
        recorded_config=recorded_config,
        mesh=mesh,
        dataset=dataset,
        rows=rows,
        batch_sharding=batch_sharding,
        global_shape=global_shape,
        schedule=schedule,
        train_step=train_step,
        eval_step=eval_step,
        warmed=warmed,
        manager=manager,
        state=state,
        start_step=start_step,
        restored=restored,
        restore_s=restore_s,
        fallbacks=fallbacks,
    )


def warm_up(
    train_step: Any, eval_step: Any | None, abstract_state: Any, batch_spec: jax.ShapeDtypeStruct
) -> concurrent.futures.Future[None]:
    """Compile (or load from the compilation cache) the restore's checksums, the train step and
    the eval step (unless None: a run that never evaluates) from the state's shapes, in a
    thread, while the main thread creates the checkpoint manager and restores (reading the
    checkpoint, waiting for its peers): their first calls then only run (JAX's in-memory caches
    hold what ``lower(...).compile()`` traced and compiled). docs/goodput.md, "Start-up"."""

    def compile_all() -> None:
        checkpoint_integrity.prepare(abstract_state)
        train_step.lower(abstract_state, batch_spec).compile()
        if eval_step is not None:
            eval_step.lower(abstract_state["params"], batch_spec).compile()

    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="warm-up")
    warmed = pool.submit(compile_all)
    pool.shutdown(wait=False)
    return warmed

"""The resilient training loop.

``run(config, run_dir, identity)`` does, on every process of the job:

1. exit 0 at once if ``<run_dir>/COMPLETE`` exists (a VM that reboots after the run ended);
2. JAX's persistent compilation cache in the run directory (training.compile_cache), then
   ``jax.distributed.initialize`` from the identity (training.cluster);
3. build the hybrid mesh (training.mesh), shard parameters and optimizer state;
4. restore the newest finalized checkpoint, or initialize from the seed;
5. train: the batch of step ``s`` is a pure function of ``s`` (training.data), so a resumed
   run computes exactly what an uninterrupted one would;
6. save per :class:`training.checkpointing.CheckpointPolicy`; on a preemption notice
   (SIGTERM) every process saves the same agreed step and exits ``EXIT_PREEMPTED``;
7. after the last step's checkpoint is finalized, process 0 writes ``COMPLETE``.

Exit codes (the startup script's supervisor acts on them): ``EXIT_COMPLETE`` 0,
``EXIT_FAILED`` 1 (restart), ``EXIT_PREEMPTED`` 75 (state saved; restart resumes),
``EXIT_CONFIG`` 78 (the configuration can never work here; restarting will not help).

With several processes, an error in one leaves the others blocked in collectives; so any
exception ends the process with ``os._exit`` (no shutdown barrier, which would hang), and
the supervisor/auto-repair restarts the job from the last checkpoint (docs/jax-on-cpu.md,
"Failures").
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import sys
import time
from typing import Any

import jax
import numpy as np
import optax

from training import checkpointing, cluster, compile_cache, data, mesh as mesh_lib, model, optimizer as optimizer_lib
from training.config import TrainConfig
from training.run_log import JsonlLog, TensorBoardLog, join

log = logging.getLogger("training")

EXIT_COMPLETE = 0
EXIT_FAILED = 1
EXIT_PREEMPTED = 75
EXIT_CONFIG = 78


@dataclasses.dataclass
class RunResult:
    exit_code: int
    step: int
    loss: float | None = None


class _SigtermFlag:
    """Preemption notice for a single process (jax.distributed handles it for several)."""

    def __init__(self):
        self.received = False

    def install(self) -> None:
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def uninstall(self) -> None:
        if hasattr(self, "_previous"):
            signal.signal(signal.SIGTERM, self._previous)

    def _handle(self, signum, frame) -> None:
        del signum, frame
        self.received = True


def _state_shardings(cfg: TrainConfig, mesh, optimizer, abstract_params) -> Any:
    axes = model.logical_axes(cfg.model)
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)  # noqa: E731
    param_shardings = jax.tree.map(lambda a: mesh_lib.sharding_for(mesh, a), axes, is_leaf=is_axes)
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


def run(config: TrainConfig, run_dir: str, identity: cluster.ClusterIdentity) -> RunResult:
    """Train until ``config.steps`` or a preemption notice; see the module docstring.

    Args:
      config: the trainer config.
      run_dir: run directory (local path or ``gs://`` URI), shared by all processes.
      identity: this process's place in the job.

    Returns:
      The exit code to use and the last completed step.

    Raises:
      checkpointing.RunConfigMismatch, data.DataError, mesh_lib.MeshError: unusable config.
    """
    check_run_dir(run_dir)
    done = checkpointing.is_complete(run_dir, config.steps)
    if done is not None:
        log.info("run %s is already complete (step %d); nothing to do", run_dir, done["step"])
        return RunResult(EXIT_COMPLETE, done["step"], done["loss"])

    compile_cache.enable(run_dir)  # before the first compilation: a restart loads the train step
    cluster.initialize(identity)
    sigterm = _SigtermFlag()
    if identity.num_processes == 1:
        sigterm.install()
    try:
        return _train(config, run_dir, identity, sigterm)
    finally:
        sigterm.uninstall()


def _train(config: TrainConfig, run_dir: str, identity: cluster.ClusterIdentity, sigterm: _SigtermFlag) -> RunResult:
    is_writer = jax.process_index() == 0
    checkpointing.check_run_config(run_dir, config)

    mesh = mesh_lib.build_mesh(config.parallelism, workers_per_slice=identity.workers_per_slice)
    dataset = data.TextDataset(
        config.data.source, config.sequence_length, config.data.eval_fraction, config.data.seed
    )
    batch_sharding = mesh_lib.batch_sharding(mesh)
    rows = mesh_lib.process_batch_rows(mesh, config.global_batch_size, config.sequence_length + 1)
    global_shape = (config.global_batch_size, config.sequence_length + 1)

    def global_batch(local_rows: np.ndarray) -> jax.Array:
        return jax.make_array_from_process_local_data(batch_sharding, local_rows, global_shape)

    opt, schedule = optimizer_lib.make_optimizer(config.optimizer, config.steps)
    abstract_params = jax.eval_shape(lambda: model.init_params(config.model, jax.random.key(0)))
    shardings = _state_shardings(config, mesh, opt, abstract_params)

    def init_state():
        params = model.init_params(config.model, jax.random.key(config.seed))
        return {"params": params, "opt_state": opt.init(params)}

    def constrain(x, axes):
        return jax.lax.with_sharding_constraint(x, mesh_lib.sharding_for(mesh, axes))

    def train_step(state, batch):
        loss, grads = jax.value_and_grad(model.loss_fn)(state["params"], batch, config.model, constrain)
        updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
        params = optax.apply_updates(state["params"], updates)
        return {"params": params, "opt_state": opt_state}, {"loss": loss, "grad_norm": optax.tree.norm(grads)}

    def eval_step(params, batch):
        return model.loss_fn(params, batch, config.model, constrain)

    train_step_jit = jax.jit(
        train_step, in_shardings=(shardings, batch_sharding), out_shardings=(shardings, None), donate_argnums=0
    )
    eval_step_jit = jax.jit(eval_step, in_shardings=(shardings["params"], batch_sharding))

    manager = checkpointing.make_manager(run_dir, config)
    abstract_state = jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), jax.eval_shape(init_state), shardings
    )
    restored = checkpointing.restore(manager, abstract_state, is_writer=is_writer)
    if restored is None:
        start_step, state = 0, jax.jit(init_state, out_shardings=shardings)()
    else:
        start_step, state = restored
    if is_writer:
        checkpointing.record_run_config(run_dir, config)
    metrics_log = JsonlLog(join(run_dir, "metrics.jsonl"), enabled=is_writer)
    events_log = JsonlLog(join(run_dir, "events.jsonl"), enabled=is_writer)
    tensorboard = TensorBoardLog(run_dir, start_step, enabled=is_writer)
    events_log.append(
        {
            "event": "start",
            "step": start_step,
            "restored": restored is not None,
            "processes": identity.num_processes,
            "devices": jax.device_count(),
            "time": time.time(),
        }
    )
    log.info(
        "%s at step %d/%d: %d processes, %d devices, mesh %s, %.2fM parameters, rows [%d, %d) of %d",
        "resuming" if restored else "starting",
        start_step,
        config.steps,
        identity.num_processes,
        jax.device_count(),
        dict(mesh.shape),
        model.param_count(config.model) / 1e6,
        rows[0],
        rows[1],
        config.global_batch_size,
    )

    policy = checkpointing.CheckpointPolicy(config.checkpoint.interval_steps, config.steps)
    flops_per_step = model.flops_per_token(config.model, config.sequence_length) * config.global_batch_tokens
    last_loss: float | None = None
    pending: tuple[int, dict[str, jax.Array]] | None = None
    last_time = time.perf_counter()
    first_record = True

    def record(step: int, metrics: dict[str, jax.Array]) -> None:
        nonlocal last_time, last_loss, first_record
        loss = float(metrics["loss"])  # blocks until that step finished
        now = time.perf_counter()
        step_time = now - last_time
        last_time = now
        last_loss = loss
        if not math.isfinite(loss):
            raise FloatingPointError(f"loss is {loss} at step {step}")
        entry = {
            "step": step,
            "loss": loss,
            "grad_norm": float(metrics["grad_norm"]),
            "learning_rate": float(schedule(step - 1)),
            "step_time_s": _significant(step_time),
            "tokens_per_s": _significant(config.global_batch_tokens / step_time),
            "tflops_per_device": _significant(flops_per_step / step_time / jax.device_count() / 1e12),
        }
        if first_record:
            entry["includes_compile"] = True
            cache = compile_cache.stats()
            entry["compile_cache_hits"] = cache.hits
            log.info("compilation cache: %d executables loaded, %.1f s of compilation saved", cache.hits, cache.seconds_saved)
            first_record = False
        metrics_log.append(entry)
        tensorboard.scalars(step, {f"train/{k}": entry[k] for k in ("loss", "grad_norm", "learning_rate", "tokens_per_s", "tflops_per_device")})
        if step % config.log_every_steps == 0 or step == config.steps:
            log.info(
                "step %d/%d loss %.4f  %.3f s/step  %.0f tokens/s  %.4f TFLOP/s/device",
                step,
                config.steps,
                loss,
                step_time,
                entry["tokens_per_s"],
                entry["tflops_per_device"],
            )

    def evaluate(step: int, params) -> None:
        losses = [
            float(eval_step_jit(params, global_batch(dataset.eval_rows(b, config.global_batch_size, *rows))))
            for b in range(config.eval_batches)
        ]
        value = sum(losses) / len(losses)
        metrics_log.append({"step": step, "eval_loss": value})
        tensorboard.scalars(step, {"eval/loss": value})
        log.info("step %d eval loss %.4f (%d batches)", step, value, len(losses))

    exit_code = EXIT_COMPLETE
    step = start_step
    for data_step in range(start_step, config.steps):
        batch = global_batch(dataset.train_rows(data_step, config.global_batch_size, *rows))
        state, metrics = train_step_jit(state, batch)
        step = data_step + 1
        if pending is not None:
            record(*pending)
        pending = (step, metrics)
        preempted = manager.reached_preemption(step) or sigterm.received
        if policy.should_save(step, preempted):
            record(*pending)
            pending = None
            checkpointing.save(manager, step, state)
            events_log.append({"event": "checkpoint", "step": step, "preemption": preempted, "time": time.time()})
            metrics_log.sync()
            events_log.sync()
            tensorboard.sync()
        if config.eval_every_steps and step % config.eval_every_steps == 0:
            if pending is not None:
                record(*pending)
                pending = None
            evaluate(step, state["params"])
        if preempted:
            log.warning("preemption notice: saved step %d; exiting for restart", step)
            exit_code = EXIT_PREEMPTED
            break
    if pending is not None:
        record(*pending)
    manager.wait_until_finished()
    if exit_code == EXIT_PREEMPTED:
        events_log.append({"event": "preempted", "step": step, "time": time.time()})
    else:
        events_log.append({"event": "complete", "step": step, "loss": last_loss, "time": time.time()})
        if is_writer:
            checkpointing.write_completion(run_dir, {"step": step, "loss": last_loss})
        log.info("training complete at step %d, loss %s", step, last_loss)
    manager.close()
    metrics_log.close()
    events_log.close()
    tensorboard.close()
    return RunResult(exit_code, step, last_loss)


class RunDirError(ValueError):
    """The run directory argument cannot be a run directory."""


def check_run_dir(run_dir: str) -> None:
    """Refuse an empty run directory or a local path that is a file.

    Raises:
      RunDirError: with the reason.
    """
    if not run_dir.strip():
        raise RunDirError("the run directory is empty; give a local directory or a gs:// URI")
    if "://" not in run_dir and os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise RunDirError(f"the run directory {run_dir} is a file, not a directory")


def _significant(value: float, digits: int = 6) -> float:
    """``value`` rounded to ``digits`` significant digits (keeps tiny CPU rates non-zero)."""
    return float(f"{value:.{digits}g}")


def main(config: TrainConfig, run_dir: str, identity: cluster.ClusterIdentity) -> int:
    """Run and turn every outcome into an exit code; never hang on the way out.

    With several processes, any failure ends the process at once with ``os._exit`` after
    flushing logs, because a normal exit would wait in the shutdown barrier for peers that
    are blocked or gone.
    """
    distributed = identity.num_processes > 1
    try:
        result = run(config, run_dir, identity)
    except (
        checkpointing.RunConfigMismatch,
        checkpointing.CheckpointRestoreError,
        mesh_lib.MeshError,
        data.DataError,
        RunDirError,
    ) as err:
        log.error("configuration error: %s", err)
        return _finish(EXIT_CONFIG, distributed)
    except Exception:
        log.exception("training failed")
        return _finish(EXIT_FAILED, distributed)
    if distributed and result.exit_code in (EXIT_COMPLETE, EXIT_PREEMPTED):
        jax.distributed.shutdown()
    return result.exit_code


def _finish(code: int, distributed: bool) -> int:
    if distributed:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code



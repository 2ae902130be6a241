"""The resilient training loop.

``run(config, run_dir, identity)`` does, on every process of the job:

1. exit 0 at once if ``<run_dir>/COMPLETE`` exists (a VM that reboots after the run ended);
2. JAX's persistent compilation cache, the stack's (training.compile_cache), the preemption
   watchdog (training.preemption), then ``jax.distributed.initialize`` from the identity
   (training.cluster), while a thread builds the data set's index;
3. set up the loop (training.setup): build the hybrid mesh (training.mesh) and the jitted
   steps (training.step), compiled while the checkpoint is read;
4. restore the newest finalized checkpoint every process can read and whose state passes
   its checks (the checksums recorded by its save, finite values:
   training.checkpoint.integrity) — all processes restore the same step, or all fail — or
   initialize from the seed (training.state, training.checkpoint.manager.restore); a fallback is
   an event ``restore_fallback`` (training.checkpoint.fallback);
5. train: the batch of step ``s`` is a pure function of ``s`` (training.data), so a resumed
   run computes exactly what an uninterrupted one would; metrics: training.metrics.recorder;
6. save per Orbax's save-decision policies (training.checkpoint.manager.save_policy); on a
   preemption notice (SIGTERM) to any process every process saves the same agreed step and
   exits ``EXIT_PREEMPTED``;
7. after the last step's checkpoint is finalized, process 0 writes ``COMPLETE``.

A non-finite loss (or state) before the first save after a restore sets the restored
checkpoint aside (``<step>.nonfinite``) and exits ``EXIT_FAILED``: the restart restores the
checkpoint before it. Once per run: if the run already holds a ``*.nonfinite`` checkpoint,
the training itself diverges, and the trainer exits ``EXIT_CONFIG``
(:func:`training.checkpoint.fallback.fall_back_once`).

Exit codes (the startup script's supervisor acts on them): ``EXIT_COMPLETE`` 0,
``EXIT_FAILED`` 1 (restart; also a notice the loop could not honour within the preemption
grace), ``EXIT_PEER_LOST`` 69 (EX_UNAVAILABLE of sysexits.h: another process of the job is gone,
:mod:`training.peer_loss`; restart at once, since the failure and its backoff are the peer's own),
``EXIT_PREEMPTED`` 75
(state saved, or nothing trained since the restored checkpoint; restart resumes),
``EXIT_CONFIG`` 78 (the configuration can never work here, no checkpoint of the run can be
restored, or the loss went non-finite again after the run fell back once; restarting will not
help).

With several processes, an error in one leaves the others blocked in collectives; so any
exception ends the process with ``os._exit`` (no shutdown barrier, which would hang), and
the supervisor/auto-repair restarts the job from the last checkpoint. Every wait is bounded
(docs/jax-on-cpu.md, "Failures", lists each bound and its setting).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import sys
import time
from typing import NoReturn

import jax

from training import (
    cluster,
    compile_cache,
    fault_gate,
    knobs,
    membership_gate,
    mesh as mesh_lib,
    peer_loss,
    preemption,
    standby_handoff,
)
from training.checkpoint import manager as checkpointing
from training.checkpoint.fallback import RestoredStateDiverged, TrainingDiverged, fall_back_once, fallback_event
from training.config import TrainConfig
from training.data.base import DataError, Dataset
from training.data.sources import open_dataset

# The readers open_dataset constructs in run()'s start-up thread, imported before that thread
# starts: importing grain runs etils' `epy.lazy_imports()` (grain.experimental), which swaps
# builtins.__import__ for the whole process while it lasts, and an import of the main thread
# meanwhile failed ("Relative import statements not supported").
from training.data.text import TextDataset  # noqa: F401  (imported for the reason above)
from training.data.tokens import TokenDataset  # noqa: F401  (imported for the reason above)
from training.metrics.goodput import process_start_time
from training.metrics.recorder import MetricsRecorder
from training.metrics.run_log import RecordLog, TensorBoardLog
from training.model.shapes import param_count
from training.run_dir import RunDir, RunDirError
from training.setup import TrainSetup, setup_train_loop
from training.start import Start, compiled_in_step, start_kind, start_timings
from training.warning_text import emit, no_action

log = logging.getLogger("training")

EXIT_COMPLETE = 0
EXIT_FAILED = 1
EXIT_PEER_LOST = 69
EXIT_PREEMPTED = 75
EXIT_CONFIG = 78


@dataclasses.dataclass
class RunResult:
    exit_code: int
    step: int
    loss: float | None = None


def run(config: TrainConfig, run_dir_uri: str, identity: cluster.ClusterIdentity) -> RunResult:
    """Train until ``config.steps`` or a preemption notice; see the module docstring.

    Args:
      config: the trainer config.
      run_dir_uri: run directory (local path or ``gs://`` URI), shared by all processes.
      identity: this process's place in the job.

    Returns:
      The exit code to use and the last completed step.

    Raises:
      checkpointing.RunConfigMismatch, DataError, mesh_lib.MeshError, RunDirError: unusable config.
    """
    entered = time.time()  # goodput: from the process start to here is the interpreter and its imports
    run_dir = RunDir(run_dir_uri)
    done = checkpointing.is_complete(run_dir, config.steps)
    if done is not None:
        log.info("run %s is already complete (step %d); nothing to do", run_dir, done["step"])
        return RunResult(EXIT_COMPLETE, done["step"], done["loss"])

    compile_cache.enable(str(run_dir))  # before the first compilation: a restart loads the train step
    notice = preemption.Notice()
    notice.install()  # before jax.distributed: a notice while waiting for peers is not lost
    # Start-up work that needs no peer runs while this process waits for its peers in
    # jax.distributed.initialize (which releases the GIL): the data set's index. Its errors
    # (DataError) are raised where the result is taken, in training.setup.
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="startup")
    dataset = pool.submit(open_dataset, config)
    pool.shutdown(wait=False)
    start = Start()
    beat = None
    try:
        joining = time.time()
        start.allocated_slice = identity.slice_id
        if membership_gate.is_elastic(config, identity):  # which slices train: training/membership_gate.py
            try:
                beat, identity, start.resizer = membership_gate.enter(config, run_dir, identity)
            except membership_gate.RunComplete as complete:  # it completed while this slice waited
                return RunResult(EXIT_COMPLETE, int(complete.record["step"]), complete.record.get("loss"))
        cluster.initialize(identity)
        notice.joined = True
        start.timings = start_timings(entered, joining)
        try:
            return _train(config, run_dir, identity, notice, start, dataset)
        except FloatingPointError as err:  # a non-finite loss (training.metrics.recorder) or state (checkpointing.save)
            if start.restored and not start.saved:
                assert start.manager is not None and start.events_log is not None  # set by every start that restored
                fall_back_once(err, start.manager, start.step, start.is_writer, start.events_log)
            raise
    finally:
        if beat is not None:
            beat.stop()
        notice.uninstall()
        if start.tensorboard is not None:
            start.tensorboard.discard()  # after an error, its unsent window (nothing once closed)


def _train(
    config: TrainConfig,
    run_dir: RunDir,
    identity: cluster.ClusterIdentity,
    notice: preemption.Notice,
    start: Start | None = None,
    dataset_future: concurrent.futures.Future[Dataset] | None = None,
) -> RunResult:
    """Set up (training.setup), record the start, then run the step loop (:func:`_loop`)."""
    start = start if start is not None else Start()
    is_writer = jax.process_index() == 0
    setup = setup_train_loop(config, run_dir, identity, dataset_future)
    config = setup.config
    metrics_log = RecordLog(run_dir, "metrics", enabled=is_writer)
    events_log = RecordLog(run_dir, "events", enabled=is_writer)
    start.manager, start.step, start.restored, start.is_writer, start.events_log = (
        setup.manager,
        setup.start_step,
        setup.restored,
        is_writer,
        events_log,
    )
    tensorboard = start.tensorboard = TensorBoardLog(run_dir, setup.start_step, enabled=is_writer)
    for fallback in setup.fallbacks:  # the CLI prints these (infra/local/progress.py)
        events_log.append(fallback_event(fallback))
    slices_by = "slice_index" if mesh_lib.slices_from_runtime(jax.devices(), identity.workers_per_slice) else "process"
    events_log.append(
        {
            "event": "start",
            "step": setup.start_step,
            "restored": setup.restored,
            "processes": identity.num_processes,
            "devices": jax.device_count(),
            "slices_by": slices_by,  # how the mesh found each device's slice (training.mesh)
            # fewer than the stack's while elastic slices are lost: reduced capacity (docs/goodput.md)
            "slices": identity.num_slices,
            "full_slices": setup.recorded_config.parallelism.dcn.product,
            **({} if start.resizer is None else {"membership_epoch": start.resizer.record.epoch}),  # elastic
            "time": time.time(),
            "process_start": process_start_time(),  # goodput: from here to "time" is start-up
            **start_kind(),  # warm (forked by the VM's standby) or cold, and why (training.standby_handoff)
            "restore_s": round(setup.restore_s, 3),
            **start.timings,
        }
    )
    events_log.sync()
    log.info(
        "%s at step %d/%d: %d processes, %d devices, mesh %s (slices by %s), %.2fM parameters, rows [%d, %d) of %d",
        "resuming" if setup.restored else "starting",
        setup.start_step,
        config.steps,
        identity.num_processes,
        jax.device_count(),
        dict(setup.mesh.shape),
        slices_by,
        param_count(config.model, config.vocab_size) / 1e6,
        setup.rows[0],
        setup.rows[1],
        config.global_batch_size,
    )
    recorder = MetricsRecorder(config, setup.schedule, metrics_log, events_log, tensorboard, jax.device_count())
    exit_code, step = _loop(setup, identity, notice, start, recorder, metrics_log, events_log, tensorboard)
    last_loss = recorder.last_loss
    waiting = time.time()
    setup.manager.wait_until_finished()
    save_s = round(time.time() - waiting, 3)  # goodput: the loop blocked by the last async save
    if exit_code == EXIT_PREEMPTED:
        resized = {} if start.resized is None else {"membership_epoch": start.resized}  # a change, not a notice
        events_log.append({"event": "preempted", "step": step, "time": time.time(), "save_s": save_s, **resized})
    else:
        events_log.append({"event": "complete", "step": step, "loss": last_loss, "time": time.time(), "save_s": save_s})
        if is_writer:
            checkpointing.write_completion(run_dir, {"step": step, "loss": last_loss, "slice": start.allocated_slice})
        log.info("training complete at step %d, loss %s", step, last_loss)
    recorder.write_goodput(step)  # goodput.json over every attempt so far (process 0)
    setup.manager.close()
    setup.dataset.close()
    metrics_log.close()
    events_log.close()
    tensorboard.close()
    return RunResult(exit_code, step, last_loss)


def _loop(
    setup: TrainSetup,
    identity: cluster.ClusterIdentity,
    notice: preemption.Notice,
    start: Start,
    recorder: MetricsRecorder,
    metrics_log: RecordLog,
    events_log: RecordLog,
    tensorboard: TensorBoardLog,
) -> tuple[int, int]:
    """The steps from ``setup.start_step`` to ``config.steps``: train, record, save per the
    checkpoint policy or at a preemption notice, evaluate. Returns ``(exit code, last step)``."""
    config, manager, dataset, rows = setup.config, setup.manager, setup.dataset, setup.rows
    train_step, eval_step, state = setup.train_step, setup.eval_step, setup.state
    pending: tuple[int, dict[str, jax.Array]] | None = None
    exit_code = EXIT_COMPLETE
    step = setup.start_step
    gate = fault_gate.FaultGate.from_env()  # the local emulation's only (training.fault_gate)
    setup.warmed.result()  # its errors are the first step's
    for data_step in range(setup.start_step, config.steps):
        batch = setup.global_batch(dataset.train_rows(data_step, config.global_batch_size, *rows))
        if data_step == setup.start_step and identity.num_processes > 1:
            train_step = compiled_in_step(train_step, state, batch, setup.start_step)
        state, metrics = train_step(state, batch)
        step = data_step + 1
        if pending is not None:
            recorder.train(*pending)
        pending = (step, metrics)
        preempted = notice.reached(manager, step)
        if preempted or manager.should_save(step):
            recorder.train(*pending)
            pending = None
            checkpointing.save(manager, step, state)
            start.saved = True
            events_log.append(
                {
                    "event": "checkpoint",
                    "step": step,
                    "preemption": preempted,
                    "time": time.time(),
                    "save_s": recorder.lap(),
                }
            )
            metrics_log.sync()
            events_log.sync()
            tensorboard.sync()
            if start.resizer is not None and not preempted and step < config.steps:
                after = start.resizer.at_checkpoint(step, jax.process_index() == 0)
                if after is not None:
                    slices = ", ".join(map(str, after.slices))
                    what = f"elastic: epoch {after.epoch} (slices {slices}: {after.reason}): saved step {step}; "
                    what += f"restarting as {len(after.slices)} slice(s)"
                    emit(no_action(what, "the trainer restarts by itself from this checkpoint"), log.warning)
                    start.resized = after.epoch
                    exit_code = EXIT_PREEMPTED
                    break
        if eval_step is not None and config.eval_every_steps and step % config.eval_every_steps == 0:
            if pending is not None:
                recorder.train(*pending)
                pending = None
            # Every batch dispatched before any loss is read: the host prepares batch b+1
            # while the devices compute batch b.
            losses = [
                eval_step(state["params"], setup.global_batch(dataset.eval_rows(b, config.global_batch_size, *rows)))
                for b in range(config.eval_batches)
            ]
            recorder.eval(step, [float(loss) for loss in losses])
        if preempted:
            saved = checkpointing.step_path(manager, step)
            what = f"stop notice: saved step {step} ({saved}); exiting with 75 to resume from it"
            emit(no_action(what, "the trainer's next start resumes from this checkpoint"), log.warning)
            exit_code = EXIT_PREEMPTED
            break
        if gate.holds(step):  # an emulated fault aims at this step: show it, then wait for it
            if pending is not None:
                recorder.train(*pending)
                pending = None
            metrics_log.sync()
            events_log.sync()
            gate.wait(step, stop=notice.noticed.is_set)
    if pending is not None:
        recorder.train(*pending)
    return exit_code, step


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
        TrainingDiverged,
        mesh_lib.MeshError,
        DataError,
        RunDirError,
        knobs.KnobError,  # python -m training run checks them first; a caller that did not, here
    ) as err:
        log.error("configuration error: %s", err)
        return _finish(EXIT_CONFIG, distributed)
    except RestoredStateDiverged:  # logged where it was raised
        return _finish(EXIT_FAILED, distributed)
    except Exception as err:
        if distributed and peer_loss.is_peer_loss(err):  # a peer's end, not this process's fault: a warning
            gone = (
                f"training stopped: another process of the job is gone ({peer_loss.summary(err)}); exiting to restart"
            )
            emit(
                no_action(
                    gone, "the job restarts and resumes from its last checkpoint; the peer's own log says why it ended"
                ),
                log.warning,
            )
            log.debug("the error", exc_info=True)
            return _finish(EXIT_PEER_LOST, distributed)
        else:
            log.exception("training failed")
        return _finish(EXIT_FAILED, distributed)
    if distributed and result.exit_code in (EXIT_COMPLETE, EXIT_PREEMPTED):
        jax.distributed.shutdown()
    return result.exit_code


def _finish(code: int, distributed: bool) -> int:
    if distributed:
        exit_process(code)
    return code


def exit_process(code: int) -> NoReturn:
    """End this process with exit status ``code`` now, skipping the interpreter's teardown.

    The trainer's command line calls it with :func:`main`'s code. By then the run has closed
    everything it writes (its checkpoint manager after the last save finalized, the metrics and
    events logs, the TensorBoard writer: :func:`run`), so what a normal exit adds is only the
    interpreter's finalization — XLA's client and devices, fsspec's I/O thread, every module —
    which every preemption restart paid before the VM could be repaired (measured:
    docs/goodput.md, "Start-up"). Logging and the standard
    streams are flushed first (``os._exit``: https://docs.python.org/3/library/os.html#os._exit).
    An attempt forked by the VM's warm standby tells its handoff the status first
    (:func:`training.standby_handoff.report_exit`).
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    standby_handoff.report_exit(code)
    os._exit(code)

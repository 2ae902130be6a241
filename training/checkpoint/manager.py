"""Checkpoints (Orbax), the checkpoint policy, and the run's completion marker, in the run
directory (``training.run_dir``: local path or ``gs://``).

Only finalized checkpoints are restored: on a local disk Orbax renames a step's temporary
directory when it is finalized; on ``gs://`` (no atomic rename) it writes a
``commit_success.txt`` last (https://orbax.readthedocs.io/en/latest/api_reference/
checkpoint.path.atomicity.html). A save killed mid-flight is ignored and the previous
finalized step restored (docs/jax-on-cpu.md, "Checkpoints (Orbax)"). The run directory's
layout: ``training.run_dir``.

The policy (:func:`save_policy`, Orbax's save-decision policies): save every
``interval_steps``, at the last step, and at a preemption sync point (all hosts agree on the
step: ``CheckpointManager.reached_preemption``, backed by ``jax.distributed``'s preemption
sync manager). Every save records checksums of the state's arrays in the checkpoint
(training.checkpoint.integrity). Restore (:func:`restore`, training.checkpoint.restore):
every process restores the same step, the newest all of them can read and whose state passes
its checks, or all of them fail.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from training.checkpoint import integrity as checkpoint_integrity
from training.checkpoint.completion import (  # noqa: F401 (part of this module's names)
    COMPLETE_MARKER,
    is_complete,
    read_completion,
    write_completion,
)
from training.checkpoint.messages import ERROR_TEXT_LIMIT, describe, error_text, step_path  # noqa: F401 (part of this module's names)
from training.checkpoint.orbax_import import ocp
from training.checkpoint.restore import (  # noqa: F401 (part of this module's names)
    CheckpointRestoreError,
    Fallback,
    agree_on_steps,
    restore,
    set_aside,
    set_aside_steps,
)
from training.config import ModelConfig, TrainConfig
from training.model.shapes import param_count
from training.run_dir import (
    RunDir,
    drop_listing_cache,  # noqa: F401 (part of this module's names)
)
from training.run_objects import json_record

log = logging.getLogger(__name__)

RUN_CONFIG_FILE = "train_config.json"


class RunConfigMismatch(ValueError):
    """The run directory belongs to a run with a different model; resuming would fail."""


def save_policy(interval_steps: int, total_steps: int) -> ocp.checkpoint_managers.SaveDecisionPolicy:
    """When to save, as Orbax save-decision policies (``CheckpointManagerOptions.
    save_decision_policy``, https://orbax.readthedocs.io/en/latest/api_reference/
    checkpoint.save_decision_policy.html): every ``interval_steps`` (``FixedIntervalPolicy``), at
    the last step (``SpecificStepsPolicy``), and at a preemption sync point
    (``PreemptionCheckpointingPolicy``: ``CheckpointManager.reached_preemption``). ``step``
    is the number of completed optimizer steps; ``CheckpointManager.should_save(step)``
    applies it."""
    policies = ocp.checkpoint_managers
    return policies.AnySavePolicy(
        [
            policies.FixedIntervalPolicy(interval_steps),
            policies.SpecificStepsPolicy([total_steps]),
            policies.PreemptionCheckpointingPolicy(),
        ]
    )


#: What identifies a run: the model (the checkpoint's shapes), the global batch, the sequence
#: length and the data (the batch of step ``s`` is rows ``s × global_batch ...`` of the data
#: order: training.data.text), and the init seed. Everything else may change between attempts,
#: parallelism, slice count, microbatches, the attention kernel and remat included: checkpoints
#: are resharded onto the new mesh on restore (docs/faults.md, "Elastic resume"). The model is
#: compared by ``ModelConfig.architecture`` (defaults resolved, so a record written before an
#: option existed matches the same model described today).
RUN_IDENTITY_KEYS = ("model", "global_batch_size", "sequence_length", "data", "seed")


def _identity(key: str, value: Any, data_vocab: int) -> Any:
    """``value`` of identity key ``key`` as compared: a model by its architecture."""
    if key == "model" and isinstance(value, dict):
        try:
            return ModelConfig.model_validate(value).architecture(data_vocab)
        except ValueError:
            return value
    return value


def _describe_value(key: str, value: Any, data_vocab: int) -> str:
    """``value`` of identity key ``key`` for a message: a model as its shape and parameter
    count (``d_model=32 n_layers=1 n_heads=2 n_kv_heads=2 d_ff=128 mlp=gelu vocab_size=256
    tie_embeddings=False compute_dtype=float32, 28,768 parameters``), other values as JSON."""
    if key == "model" and isinstance(value, dict):
        try:
            model = ModelConfig.model_validate(value)
        except ValueError:
            return json.dumps(value, sort_keys=True)
        vocab = model.resolve_vocab(data_vocab)
        return f"{model.describe(data_vocab)}, {param_count(model, vocab):,} parameters"
    return json.dumps(value, sort_keys=True)


def check_run_config(run_dir: RunDir, config: TrainConfig) -> None:
    """Refuse to continue a run whose recorded TrainConfig (``train_config.json``) differs in
    a :data:`RUN_IDENTITY_KEYS` key.

    Changing ``steps``, the schedule, the checkpoint policy, the parallelism, the slice
    count, the microbatches, the attention kernel or remat of an existing run is allowed
    (checkpoints are resharded on restore, and the global batch of each step is the same rows
    of the data whatever the mesh); changing the model, global batch, sequence length, data or
    seed would make the checkpoints unusable or the data order different.

    Raises:
      RunConfigMismatch: one line naming, for each differing key, what the run directory has
        and what the config asks (a model by its shape: :func:`_describe_value`), or saying
        the record is unreadable.
    """
    try:
        data = run_dir.read(RUN_CONFIG_FILE)  # a local FIFO or device there: UnreadableObject, a ValueError
        if data is None:
            return
        recorded = json_record(data)
        if not isinstance(recorded, dict):
            raise ValueError("not a JSON object")
    except (ValueError, UnicodeDecodeError) as err:
        raise RunConfigMismatch(
            f"{run_dir / RUN_CONFIG_FILE} is unreadable ({err}); it records the run's TrainConfig: "
            "restore it, or delete it to "
            "accept the current config (the checkpoints must still match it)"
        ) from None
    current = json.loads(config.model_dump_json())
    vocab = config.data_vocab_size
    differing = [
        key
        for key in RUN_IDENTITY_KEYS
        if _identity(key, recorded.get(key), vocab) != _identity(key, current.get(key), vocab)
    ]
    if differing:
        raise RunConfigMismatch(
            f"run directory {run_dir} holds a run with different training.{', training.'.join(differing)}: "
            + "; ".join(
                f"training.{key}: the run directory has {_describe_value(key, recorded.get(key), vocab)}, "
                f"the config asks {_describe_value(key, current.get(key), vocab)}"
                for key in differing
            )
            + "; use a new multislice:runName (or `multislice local up --fresh`) to start a new run"
        )


def record_run_config(run_dir: RunDir, config: TrainConfig) -> None:
    """Write ``train_config.json`` (process 0, once the state was restored or initialized)."""
    run_dir.write(RUN_CONFIG_FILE, config.model_dump_json(indent=2).encode())


#: Orbax's warnings (absl, format strings as Orbax writes them) about what this module does on
#: purpose: a read-only manager (checkpoint_manager.py) and its own jax.Array handler registered
#: over Orbax's (type_handler_registry.py). Left out where this module causes them, nowhere else;
#: if Orbax rewords one, it shows again, harmlessly.
READ_ONLY_NOTICE = "Given directory is read only=%s"
OVERRIDE_NOTICE = 'Type handler registry type "%s" overriding %s'


@contextlib.contextmanager
def absl_notices_left_out(*formats: str) -> Iterator[None]:
    """Inside, absl log records whose format string is one of ``formats`` are dropped (a filter
    on the ``absl`` logger, which Orbax logs through); every other record passes."""
    logger = logging.getLogger("absl")

    def keep(record: logging.LogRecord) -> bool:
        return record.msg not in formats

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


class CheckpointManager(ocp.CheckpointManager):
    """Orbax's CheckpointManager whose :meth:`restore` is this process's read alone, with no
    barrier of all processes; :func:`restore` shares each read's outcome instead (through
    :func:`training.agreement.all_gather`, with a timeout) before any process moves on.
    Saving is Orbax's own, barriers included.

    Why: Orbax's ``Checkpointer.restore`` ends at a barrier of all processes
    (``Checkpointer:restore``; multihost.py, https://github.com/google/orbax/blob/main/
    checkpoint/orbax/checkpoint/_src/multihost/multihost.py, ``sync_global_processes``). By
    default it is a device collective with no timeout (``jax.experimental.multihost_utils.
    sync_global_devices``): a process that read the step waits there forever for one whose
    read failed. With Orbax's ``experimental_orbax_use_distributed_barrier`` flag it is a
    coordination-service barrier with a fixed 300 s timeout, but under one key for every
    restore, and an instance that timed out makes the next use of the key fail or time out
    ("Barrier (Checkpointer:restore::0) is invoked by the task, but the service thinks it is
    the 2-th instance"): the fallback restore of an older step failed or timed out as well,
    depending on which process came first (docs/jax-on-cpu.md, "Failures": restore
    agreement). A read-only manager whose only active process is this one
    (``MultiprocessingOptions.active_processes``; Orbax skips its barriers for a single
    process: ``multihost.should_skip_process_sync``) reads the step without it.
    """

    def reload(self) -> None:
        """Orbax's ``reload`` (the steps listed anew) from a fresh listing of the directory.

        On ``gs://`` Orbax lists through etils.epath and gcsfs, and gcsfs answers ``iterdir``
        and ``exists`` from the listings it cached earlier in this process (its ``dircache``;
        https://gcsfs.readthedocs.io/en/latest/api.html, ``invalidate_cache``): after process 0
        set a step directory aside, another process's reload still listed the step, so its
        ``should_save`` refused the next save of that step while process 0 saved it, and the
        two waited for each other until the stall timeout
        (docs/jax-on-cpu.md, "Checkpoints (Orbax)"). The cached listings are dropped first
        (nothing on a local disk)."""
        drop_listing_cache(self.directory)
        super().reload()

    def restore(self, step: int | None, *args: Any, **kwargs: Any) -> Any:
        """This process's read of checkpoint ``step`` (``CheckpointManager.restore``'s
        arguments), without Orbax's barrier of all processes. Raises what Orbax raises."""
        with self._alone() as reader:
            return reader.restore(step, *args, **kwargs)

    def custom_metadata(self, step: int) -> dict[str, Any]:
        """The ``custom_metadata`` recorded with checkpoint ``step`` (read on this process
        alone; ``{}`` if none). Raises what Orbax raises."""
        with self._alone() as reader:
            return dict(reader.metadata(step).custom_metadata or {})

    def _alone(self) -> ocp.CheckpointManager:
        """A read-only manager of this process alone, with the handler of the one item every
        checkpoint holds (``StandardSave``'s ``default``): without it, Orbax's ``metadata(step)``
        warns twice that the item "could not be restored" (composite_checkpoint_handler.py, an item
        with no registered handler), though nothing is restored there and the restore is right."""
        me = ocp.multihost.process_index()
        alone = ocp.CheckpointManagerOptions(
            read_only=True,
            create=False,
            save_interval_steps=0,
            enable_async_checkpointing=False,
            multiprocessing_options=ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me}),
            # Steps are listed, their metadata files not read (their times and metrics, which
            # a read of one named step does not use): one read of a small file per kept step
            # saved at every restore (CheckpointManagerOptions.lightweight_initialize).
            lightweight_initialize=True,
        )
        with absl_notices_left_out(READ_ONLY_NOTICE):  # read-only on purpose: no warning to show
            return ocp.CheckpointManager(self.directory, options=alone, item_handlers=ocp.StandardCheckpointHandler())


#: Bytes a replica's part of a replicated shard needs before Orbax splits its write among the
#: replicas (``ArrayHandler(min_slice_bytes_for_replica_parallel=...)``; Orbax's default splits
#: every replicated array). Splitting slices each array with an eager ``jax.lax.slice_in_dim``
#: (orbax/checkpoint/_src/serialization/replica_slices.py ``ReplicaSlice.data``): one XLA program
#: per slice shape, compiled, or loaded from the compilation cache, at every start: for a small
#: model, seconds of the first save of every start that this floor removes (measured:
#: docs/goodput.md, "Checkpoint saves"). Slices at
#: least this large are still split: on large models a shard's write dominates its slicing.
REPLICA_PARALLEL_MIN_SLICE_BYTES = 8 << 20


def _register_array_handler() -> None:
    """jax.Array's Orbax handler as Orbax registers it (with its array metadata store), but
    with :data:`REPLICA_PARALLEL_MIN_SLICE_BYTES`; idempotent. Without Orbax's private
    metadata-store module, Orbax's handler is left as it is."""
    import jax

    handler = ocp.type_handlers.get_type_handler(jax.Array)
    if getattr(handler, "multislice_min_slice_bytes", None) == REPLICA_PARALLEL_MIN_SLICE_BYTES:
        return
    try:
        from orbax.checkpoint._src.metadata import array_metadata_store
    except ImportError:
        return
    handler = ocp.type_handlers.ArrayHandler(
        array_metadata_store=array_metadata_store.Store(),
        min_slice_bytes_for_replica_parallel=REPLICA_PARALLEL_MIN_SLICE_BYTES,
    )
    handler.multislice_min_slice_bytes = REPLICA_PARALLEL_MIN_SLICE_BYTES  # pyright: ignore[reportAttributeAccessIssue]
    with absl_notices_left_out(OVERRIDE_NOTICE):  # the override is the point: no warning to show
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


def make_manager(run_dir: RunDir, config: TrainConfig) -> CheckpointManager:
    """An Orbax CheckpointManager over ``<run_dir>/checkpoints`` keeping ``checkpoint.keep``
    finalized steps, deciding when to save by :func:`save_policy`; its restore reads on this
    process alone (:class:`CheckpointManager`). Replicated arrays are written whole by one
    replica unless their slices reach :data:`REPLICA_PARALLEL_MIN_SLICE_BYTES`."""
    _register_array_handler()
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=save_policy(config.checkpoint.interval_steps, config.steps),
        max_to_keep=config.checkpoint.keep,
        enable_async_checkpointing=config.checkpoint.async_save,
        create=True,
    )
    return CheckpointManager(run_dir / "checkpoints", options=options)


def save(manager: ocp.CheckpointManager, step: int, state: Any) -> None:
    """Save ``state`` as checkpoint ``step`` with the checksums of its arrays in the step's
    ``custom_metadata`` (training.checkpoint.integrity: a restore checks them). A collective:
    every process calls it.

    Raises:
      FloatingPointError: the state holds non-finite values (never saved: a restore would
        have to refuse it).
    """
    summary = checkpoint_integrity.summarize(state)
    bad = checkpoint_integrity.nonfinite(summary)
    if bad:
        raise FloatingPointError(f"the train state of step {step} has {bad}; not saving it")
    manager.save(
        step, args=ocp.args.StandardSave(state), force=True, custom_metadata=checkpoint_integrity.record(summary)
    )

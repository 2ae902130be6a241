"""Damage to a run's checkpoints, for the tests of training.checkpoint.integrity (one process:
tests/training/test_checkpoint_integrity.py; two: tests/training/test_trusted_restore.py). Paths are local
directories or ``gs://`` URIs (fsspec), checkpoints are read and written with Orbax in the
test's process on one device."""

from __future__ import annotations

import json

import fsspec
import jax
import numpy as np
import orbax.checkpoint as ocp

from training import optimizer as optimizer_lib
from training.config import TrainConfig
from training.model import transformer as model


def restore_alone(checkpoints: str, step: int, cfg: TrainConfig):
    """Checkpoint ``step`` of ``checkpoints`` restored on this process's first device."""
    opt, _ = optimizer_lib.make_optimizer(cfg.optimizer, cfg.steps)

    def init():
        params = model.init_params(cfg.model, cfg.vocab_size, jax.random.key(0))
        return {"params": params, "opt_state": opt.init(params)}

    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), jax.eval_shape(init))
    with ocp.CheckpointManager(checkpoints, options=ocp.CheckpointManagerOptions(read_only=True)) as manager:
        return manager.restore(step, args=ocp.args.StandardRestore(abstract))


def _same(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=False)
    )


def overwrite_keeping_size(checkpoints: str, step: int, cfg: TrainConfig, under: str = "") -> str:
    """Overwrite 64 bytes of the largest data file of checkpoint ``step`` (below
    ``<step>/default/<under>``) with 0xff, its size kept (a torn or bit-rotted write), at the
    first of a few offsets where Orbax still reads the checkpoint without complaint and reads
    different values (the arrays are zstd-compressed chunks: a change in a frame's header
    fails the read instead, which other tests cover). The damaged file's path."""
    fs, root = fsspec.core.url_to_fs(checkpoints)
    files = [p for p in fs.find(f"{root}/{step}/default/{under}".rstrip("/")) if p.rsplit("/", 2)[-2] == "d"]
    path = max(files, key=fs.size)
    original = fs.cat(path)
    before = restore_alone(checkpoints, step, cfg)
    for fraction in (0.5, 0.3, 0.7, 0.4, 0.6, 0.2, 0.8, 0.45, 0.55, 0.35, 0.65):
        data = bytearray(original)
        at = int(len(data) * fraction)
        data[at : at + 64] = b"\xff" * 64
        fs.pipe(path, bytes(data))
        fs.invalidate_cache()
        try:
            after = restore_alone(checkpoints, step, cfg)
        except Exception:  # noqa: BLE001 (any read failure: try another offset)
            continue
        if not _same(before, after):
            assert fs.size(path) == len(original)
            return path
    fs.pipe(path, original)
    raise AssertionError(f"no offset of {path} both reads and changes the values")


def poison(checkpoints: str, step: int, cfg: TrainConfig) -> None:
    """Rewrite checkpoint ``step`` with its parameters × 1e30 (finite: it passes the restore
    checks, but the next loss overflows) and no checksums (a checkpoint saved before they were
    recorded), through a scratch directory beside ``checkpoints``."""
    state = restore_alone(checkpoints, step, cfg)
    state["params"] = jax.tree.map(lambda x: x * np.float32(1e30), state["params"])
    assert all(bool(np.isfinite(x).all()) for x in jax.tree.leaves(state))
    scratch = f"{checkpoints.rstrip('/')}-scratch-{step}"
    with ocp.CheckpointManager(
        scratch, options=ocp.CheckpointManagerOptions(enable_async_checkpointing=False)
    ) as manager:
        manager.save(step, args=ocp.args.StandardSave(state))
    fs, root = fsspec.core.url_to_fs(checkpoints)
    _, scratch_root = fsspec.core.url_to_fs(scratch)
    fs.rm(f"{root}/{step}", recursive=True)
    fs.copy(f"{scratch_root}/{step}", f"{root}/{step}", recursive=True)
    fs.rm(scratch_root, recursive=True)
    fs.invalidate_cache()
    assert "multislice_integrity" not in json.loads(fs.cat(f"{root}/{step}/_CHECKPOINT_METADATA"))["custom_metadata"]

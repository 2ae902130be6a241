"""training.checkpoint.integrity: checksums of the state's arrays recorded by every save and
checked, with finite values, on restore; and the trainer (one process, 8 CPU devices, a
local run directory) when checkpoints fail those checks or the loss goes non-finite after a
restore. The 2-process runs on ``gs://`` are in tests/training/test_trusted_restore.py."""

from __future__ import annotations

import logging
import shutil
import sysconfig
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from tests.checkpoint_damage import overwrite_keeping_size, poison
from tests.helpers.checkpoint_runs import config, names
from tests.helpers.train_runs import losses
from training import train
from training.checkpoint import integrity, manager as checkpointing
from training.checkpoint.orbax_import import ocp
from training.cluster import ClusterIdentity
from training.config import TrainConfig
from training.metrics.run_log import read_records
from training.run_dir import RunDir

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
SINGLE = ClusterIdentity.single_process()


def tree() -> dict:
    x = jax.random.normal(jax.random.key(0), (16, 32))
    return {"w": x, "count": jnp.int32(3), "h": x.astype(jnp.bfloat16)}


def test_a_checksum_does_not_depend_on_the_sharding():
    t = tree()
    a = jax.make_mesh((2, 4), ("a", "b"))
    b = jax.make_mesh((4, 2), ("a", "b"))
    first = integrity.summarize(
        jax.device_put(
            t, {"w": NamedSharding(a, P("a", "b")), "count": NamedSharding(a, P()), "h": NamedSharding(a, P(None, "b"))}
        )
    )
    second = integrity.summarize(
        jax.device_put(
            t, {"w": NamedSharding(b, P("b", "a")), "count": NamedSharding(b, P()), "h": NamedSharding(b, P("a"))}
        )
    )
    assert first == second == integrity.summarize(t)
    assert set(first) == {"w", "count", "h"} and all(count == 0 for _, count in first.values())


def reference_checksum(x: np.ndarray) -> int:
    """The recorded checksum (integrity.ALGORITHM) in numpy, from its definition: each element's
    bits as a uint32 word, hashed with its row-major index by murmur3's 32-bit finalizer, summed
    modulo 2^32 (https://github.com/aappleby/smhasher/blob/master/src/MurmurHash3.cpp, fmix32)."""

    def fmix32(h: np.ndarray) -> np.ndarray:
        h = h ^ (h >> np.uint32(16))
        h = h * np.uint32(0x85EBCA6B)
        h = h ^ (h >> np.uint32(13))
        h = h * np.uint32(0xC2B2AE35)
        return h ^ (h >> np.uint32(16))

    x = np.asarray(x)
    unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    words = (x.astype(np.uint32) if x.dtype == np.bool_ else x.view(unsigned).astype(np.uint32)).ravel()
    index = np.arange(words.size, dtype=np.uint32)
    return int(fmix32(words ^ fmix32(index + np.uint32(0x9E3779B9))).sum(dtype=np.uint32))


def test_the_checksums_are_the_algorithms_whatever_computes_them():
    # Checkpoints of earlier releases carry checksums of this algorithm: a restore must compute
    # the same numbers, or it would refuse every one of them.
    t = {**tree(), "mask": jnp.arange(7) % 3 == 0, "bytes": jnp.arange(300, dtype=jnp.uint8).reshape(3, 100)}
    summary = integrity.summarize(t)
    assert summary == {name: (reference_checksum(np.asarray(x)), 0) for name, x in t.items()}


def test_a_changed_or_moved_value_changes_the_checksum_and_non_finite_values_are_named():
    t = tree()
    recorded = integrity.record(integrity.summarize(t))
    assert integrity.problems(integrity.summarize(t), recorded) == ""
    x = t["w"]
    nudged = {**t, "w": x.at[3, 5].set(jnp.nextafter(x[3, 5], jnp.inf))}  # one bit of one value
    swapped = {**t, "w": x.at[0, 0].set(x[0, 1]).at[0, 1].set(x[0, 0])}  # the same values, moved
    for changed in (nudged, swapped):
        assert integrity.problems(integrity.summarize(changed), recorded).startswith(
            "checksum mismatch in 1 of 3 arrays: w (recorded 0x"
        )
    bad = {**t, "h": t["h"].at[1, 1].set(jnp.nan).at[2, 2].set(jnp.inf)}
    assert (
        integrity.problems(integrity.summarize(bad), {}) == "restored state has non-finite values (2 in h)"
    )  # no record: values only
    assert integrity.problems(integrity.summarize(bad), recorded) == (
        f"checksum mismatch in 1 of 3 arrays: h (recorded {recorded[integrity.METADATA_KEY]['checksums']['h']:#010x}, "
        f"restored {integrity.summarize(bad)['h'][0]:#010x}); restored state has non-finite values (2 in h)"
    )


def test_a_save_records_the_checksums_and_refuses_a_non_finite_state(tmp_path):
    config = TrainConfig.model_validate({"checkpoint": {"interval_steps": 1, "keep": 3, "async_save": False}})
    manager = checkpointing.make_manager(RunDir(str(tmp_path / "run")), config)
    t = tree()
    checkpointing.save(manager, 1, t)
    with pytest.raises(
        FloatingPointError, match=r"the train state of step 2 has non-finite values \(1 in w\); not saving it"
    ):
        checkpointing.save(manager, 2, {**t, "w": t["w"].at[0, 0].set(jnp.nan)})
    manager.wait_until_finished()
    assert manager.all_steps() == [1]
    assert manager.custom_metadata(1) == integrity.record(integrity.summarize(t))
    manager.close()


def test_reading_a_checkpoint_back_logs_no_orbax_warning(tmp_path, caplog):
    """What restore reads (a step's metadata, then the step, on this process alone) warns of
    nothing: no "read only" directory (the reader is read-only on purpose), no item that "could
    not be restored" (the reader knows the item's handler), no type handler "overriding"."""
    config = TrainConfig.model_validate({"checkpoint": {"interval_steps": 1, "keep": 3, "async_save": False}})
    t = tree()
    with caplog.at_level(logging.WARNING, logger="absl"):
        manager = checkpointing.make_manager(RunDir(str(tmp_path / "run")), config)
        checkpointing.save(manager, 1, t)
        manager.wait_until_finished()
        assert manager.custom_metadata(1) == integrity.record(integrity.summarize(t))
        restored = manager.restore(1, args=ocp.args.StandardRestore(t))
        manager.close()
    assert all(bool(jnp.array_equal(restored[k], t[k])) for k in t)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# --- the trainer ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> TrainConfig:
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(p for package in ("json", "http") for p in (stdlib / package).glob("*.py"))[:20]:
        (root / f"{path.parent.name}-{path.stem}.txt").write_bytes(path.read_bytes())
    return config(f"{root}/*.txt")


@pytest.fixture(scope="module")
def uninterrupted(cfg, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert train.run(cfg, str(run_dir), SINGLE).exit_code == train.EXIT_COMPLETE
    assert names(run_dir) == ["12", "4", "8"]
    return run_dir


def events(run_dir: Path, kind: str) -> list[dict]:
    return [e for e in read_records(RunDir(str(run_dir)), "events") if e["event"] == kind]


def unfinished(uninterrupted: Path, tmp_path: Path, drop: tuple[int, ...] = ()) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(uninterrupted, run_dir)
    (run_dir / "COMPLETE").unlink()
    for step in drop:
        shutil.rmtree(run_dir / "checkpoints" / str(step))
    return run_dir


@pytest.mark.slow
def test_bytes_overwritten_in_the_newest_checkpoint_fall_back_to_the_previous_one_bit_for_bit(
    uninterrupted, cfg, tmp_path
):
    run_dir = unfinished(uninterrupted, tmp_path, drop=(12,))
    overwrite_keeping_size(str(run_dir / "checkpoints"), 8, cfg)
    assert train.main(cfg, str(run_dir), SINGLE) == train.EXIT_COMPLETE
    (fallback,) = events(run_dir, "restore_fallback")
    assert (fallback["tried"], fallback["step"]) == (8, 4)
    assert fallback["reason"].startswith("checksum mismatch in 1 of ")
    assert [s for s, _ in losses(run_dir)[-8:]] == list(range(5, 13))
    assert dict(losses(run_dir)) == dict(losses(uninterrupted))
    assert names(run_dir) == ["12", "4", "8", "8.unreadable"]


@pytest.mark.slow
def test_when_every_checkpoint_fails_its_checks_the_trainer_exits_78_naming_each(uninterrupted, cfg, tmp_path, caplog):
    run_dir = unfinished(uninterrupted, tmp_path)
    for step in (4, 8, 12):
        overwrite_keeping_size(str(run_dir / "checkpoints"), step, cfg)
    with pytest.raises(checkpointing.CheckpointRestoreError) as err:
        train.run(cfg, str(run_dir), SINGLE)
    message = str(err.value)
    for step in (12, 8, 4):
        assert f"step {step} ({run_dir / 'checkpoints' / str(step)}): checksum mismatch in " in message
    assert names(run_dir) == ["12", "4", "8"]  # nothing set aside: there is nothing to fall back to
    assert train.main(cfg, str(run_dir), SINGLE) == train.EXIT_CONFIG


@pytest.mark.slow
def test_a_non_finite_loss_after_a_restore_falls_back_once_then_exits_78(uninterrupted, cfg, tmp_path, caplog):
    run_dir = unfinished(uninterrupted, tmp_path, drop=(12,))
    poison(str(run_dir / "checkpoints"), 8, cfg)
    caplog.set_level("ERROR", logger="training")
    # First start: step 8 passes the restore checks, the loss overflows before any save: the
    # checkpoint is set aside and the trainer exits 1 for a restart (not again and again).
    assert train.main(cfg, str(run_dir), SINGLE) == train.EXIT_FAILED
    (fallback,) = events(run_dir, "restore_fallback")
    assert (fallback["tried"], fallback["step"]) == (8, 4)
    assert names(run_dir) == ["4", "8.nonfinite"]
    (line,) = [r.getMessage() for r in caplog.records if "after restoring checkpoint" in r.getMessage()]
    assert line.endswith(
        f"after restoring checkpoint step 8 ({run_dir / 'checkpoints' / '8'}): set it aside as 8.nonfinite; "
        "the restart restores the checkpoint before it (step 4)"
    )
    # Step 4 goes bad the same way: the run already fell back once, so the training itself is
    # blamed and the trainer exits 78 (do not restart), naming what was tried.
    poison(str(run_dir / "checkpoints"), 4, cfg)
    caplog.clear()
    assert train.main(cfg, str(run_dir), SINGLE) == train.EXIT_CONFIG
    (line,) = [r.getMessage() for r in caplog.records if "after restoring checkpoint" in r.getMessage()]
    assert (
        f"after restoring checkpoint step 4 ({run_dir / 'checkpoints' / '4'}); the run already fell back from step 8 ("
        in line
    )
    assert "8.nonfinite) for a non-finite loss" in line and line.endswith("not restarting")
    assert names(run_dir) == ["4", "8.nonfinite"]


@pytest.mark.slow
def test_after_the_non_finite_fallback_the_restart_completes_bit_for_bit(uninterrupted, cfg, tmp_path):
    run_dir = unfinished(uninterrupted, tmp_path, drop=(12,))
    poison(str(run_dir / "checkpoints"), 8, cfg)
    assert train.main(cfg, str(run_dir), SINGLE) == train.EXIT_FAILED
    assert train.main(cfg, str(run_dir), SINGLE) == train.EXIT_COMPLETE
    assert [(e["step"], e["restored"]) for e in events(run_dir, "start")][-2:] == [(8, True), (4, True)]
    assert dict(losses(run_dir)) == dict(losses(uninterrupted))
    assert names(run_dir) == ["12", "4", "8", "8.nonfinite"]

"""training.train in one process (8 CPU devices): complete, resume bit for bit, preemption."""

from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import pytest

from training import checkpointing, data, train
from training.cluster import ClusterIdentity
from training.config import TrainConfig

CONFIG = TrainConfig.model_validate(
    {
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
        "sequence_length": 32,
        "global_batch_size": 8,
        "steps": 12,
        "optimizer": {"warmup_steps": 2},
        "checkpoint": {"interval_steps": 4, "keep": 2},
        "eval_every_steps": 6,
        "parallelism": {"ici": {"data": 2, "fsdp": 2, "tensor": 2}},
    }
)
SINGLE = ClusterIdentity.single_process()

# Failed restores (the damaged-checkpoint tests) leave orbax coroutines that are collected
# later, in whichever test runs then; they are expected and harmless here.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


# Each failed orbax read also leaves an asyncio task whose exception nobody retrieves; asyncio
# logs it when the task is collected, often at interpreter exit, as "Task exception was never
# retrieved" plus a TensorStore spec: hundreds of lines after pytest's result line that read
# like a failure. The failures themselves are asserted (CheckpointRestoreError), so asyncio's
# logger is turned off for the rest of this pytest process once this module is imported;
# the trainer and the emulation tests run in subprocesses and keep theirs.
logging.getLogger("asyncio").disabled = True


def losses(run_dir: Path) -> list[tuple[int, float]]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted")
    result = train.run(CONFIG, str(run_dir), SINGLE)
    assert result.exit_code == train.EXIT_COMPLETE and result.step == 12
    return run_dir


def test_run_trains_to_completion_and_writes_its_records(uninterrupted):
    steps = losses(uninterrupted)
    assert [s for s, _ in steps] == list(range(1, 13))
    assert steps[-1][1] < steps[0][1]
    assert json.loads((uninterrupted / "COMPLETE").read_text())["step"] == 12
    events = [json.loads(line)["event"] for line in (uninterrupted / "events.jsonl").read_text().splitlines()]
    assert events == ["start", "checkpoint", "checkpoint", "checkpoint", "complete"]
    finalized = sorted(int(p.name) for p in (uninterrupted / "checkpoints").iterdir() if p.name.isdigit())
    assert finalized == [8, 12]  # checkpoint.keep = 2
    metrics = [json.loads(line) for line in (uninterrupted / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "eval_loss" in m] == [6, 12]
    assert all(m["tflops_per_device"] > 0 and m["tokens_per_s"] > 0 for m in metrics if "loss" in m)


def tensorboard_scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of ``tag`` from every event file, parsed as TFRecords (length, crc,
    data, crc) of tensorboardX's Event protos."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    found = []
    for path in sorted((run_dir / "tensorboard").iterdir()):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            found += [(event.step, v.simple_value) for v in event.summary.value if v.tag == tag]
    return found


def test_tensorboard_gets_the_training_and_eval_curves(uninterrupted):
    loss = tensorboard_scalars(uninterrupted, "train/loss")
    assert [step for step, _ in loss] == list(range(1, 13))
    assert [v for _, v in loss] == pytest.approx([v for _, v in losses(uninterrupted)])
    assert [step for step, _ in tensorboard_scalars(uninterrupted, "eval/loss")] == [6, 12]


def test_a_finished_run_exits_at_once(uninterrupted):
    before = (uninterrupted / "metrics.jsonl").read_text()
    result = train.run(CONFIG, str(uninterrupted), SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    assert (uninterrupted / "metrics.jsonl").read_text() == before


def crash_at_data_step_9(run_dir: Path, monkeypatch) -> None:
    """Run CONFIG in ``run_dir`` until it crashes while loading the batch of data step 9."""
    real_rows = data.TextDataset.train_rows

    def crash_at_step_9(self, step, *args):
        if step == 9:
            raise RuntimeError("injected crash")
        return real_rows(self, step, *args)

    monkeypatch.setattr(data.TextDataset, "train_rows", crash_at_step_9)
    with pytest.raises(RuntimeError, match="injected crash"):
        train.run(CONFIG, str(run_dir), SINGLE)
    monkeypatch.setattr(data.TextDataset, "train_rows", real_rows)


def test_crash_then_resume_gives_bit_identical_losses(uninterrupted, tmp_path, monkeypatch):
    crash_at_data_step_9(tmp_path, monkeypatch)
    result = train.run(CONFIG, str(tmp_path), SINGLE)
    assert result.exit_code == train.EXIT_COMPLETE
    resumed = losses(tmp_path)
    # The crash came while building the batch of step 10: step 9 had run but was never
    # recorded; the restart restored the step-8 checkpoint and ran 9..12.
    final = dict(resumed)  # last record per step wins
    assert final == dict(losses(uninterrupted))  # bit for bit: floats compared exactly
    first_pass = resumed[: len(resumed) - 4]
    assert [s for s, _ in resumed[len(first_pass):]] == [9, 10, 11, 12]
    assert all(loss == final[step] for step, loss in first_pass)
    # The restart loaded the compiled train step from the run directory's compilation cache.
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    first_records = [r for r in records if r.get("includes_compile")]
    assert [r["compile_cache_hits"] > 0 for r in first_records] == [False, True]


def test_sigterm_saves_the_current_step_then_resume_completes(uninterrupted, tmp_path, monkeypatch):
    real_rows = data.TextDataset.train_rows

    def preempt_at_step_5(self, step, *args):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_rows(self, step, *args)

    monkeypatch.setattr(data.TextDataset, "train_rows", preempt_at_step_5)
    previous = signal.getsignal(signal.SIGTERM)
    result = train.run(CONFIG, str(tmp_path), SINGLE)
    assert signal.getsignal(signal.SIGTERM) == previous  # handler restored
    assert (result.exit_code, result.step) == (train.EXIT_PREEMPTED, 6)
    assert not (tmp_path / "COMPLETE").exists()
    monkeypatch.setattr(data.TextDataset, "train_rows", real_rows)
    result = train.run(CONFIG, str(tmp_path), SINGLE)
    assert result.exit_code == train.EXIT_COMPLETE
    assert dict(losses(tmp_path)) == dict(losses(uninterrupted))
    assert [s for s, _ in losses(tmp_path)] == list(range(1, 13))  # no step lost or redone


def test_changed_model_in_an_existing_run_dir_is_refused(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "train_config.json").write_text((uninterrupted / "train_config.json").read_text())
    bigger = CONFIG.model_copy(update={"model": CONFIG.model.model_copy(update={"d_model": 64})})
    with pytest.raises(checkpointing.RunConfigMismatch, match=r"different training.model"):
        train.run(bigger, str(run_dir), SINGLE)
    assert train.main(bigger, str(run_dir), SINGLE) == train.EXIT_CONFIG


def test_unreadable_data_source_is_a_config_error(tmp_path):
    config = CONFIG.model_copy(update={"data": CONFIG.data.model_copy(update={"source": str(tmp_path / "none-*.txt")})})
    assert train.main(config, str(tmp_path / "run"), SINGLE) == train.EXIT_CONFIG


def copy_run(source: Path, target: Path) -> Path:
    import shutil

    shutil.copytree(source, target)
    return target


def test_a_malformed_completion_marker_does_not_end_an_unfinished_run(uninterrupted, tmp_path, monkeypatch):
    crash_at_data_step_9(tmp_path, monkeypatch)
    for garbage in (b"garbage!!", b"[1]", b'{"step": "abc"}', b"\xff\xfe"):
        (tmp_path / "COMPLETE").write_bytes(garbage)
        assert checkpointing.read_completion(str(tmp_path)) is None
    result = train.run(CONFIG, str(tmp_path), SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    assert dict(losses(tmp_path)) == dict(losses(uninterrupted))
    assert checkpointing.read_completion(str(tmp_path))["step"] == 12


def test_raising_steps_continues_a_finished_run(uninterrupted, tmp_path):
    run_dir = copy_run(uninterrupted, tmp_path / "run")
    longer = CONFIG.model_copy(update={"steps": 14})
    result = train.run(longer, str(run_dir), SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 14)
    assert [s for s, _ in losses(run_dir)] == list(range(1, 15))


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(uninterrupted, tmp_path):
    run_dir = copy_run(uninterrupted, tmp_path / "run")
    (run_dir / "COMPLETE").unlink()
    damaged = 0
    for path in (run_dir / "checkpoints" / "12").rglob("*"):
        if path.is_file() and "METADATA" not in path.name:
            path.write_bytes(b"")
            damaged += 1
    assert damaged
    result = train.run(CONFIG, str(run_dir), SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    assert (run_dir / "checkpoints" / "12.unreadable").is_dir()  # kept for inspection
    records = losses(run_dir)
    assert [s for s, _ in records[12:]] == [9, 10, 11, 12]  # recomputed from the step-8 checkpoint
    assert dict(records) == dict(losses(uninterrupted))


def test_checkpoints_of_another_model_are_a_config_error_and_keep_the_record(uninterrupted, tmp_path):
    run_dir = copy_run(uninterrupted, tmp_path / "run")
    (run_dir / "COMPLETE").unlink()
    (run_dir / "train_config.json").unlink()
    bigger = CONFIG.model_copy(update={"model": CONFIG.model.model_copy(update={"d_model": 64})})
    with pytest.raises(checkpointing.CheckpointRestoreError, match=r"no checkpoint in .* can be restored: step 12 \(\S+/checkpoints/12\): "):
        train.run(bigger, str(run_dir), SINGLE)
    assert not (run_dir / "train_config.json").exists()  # not rewritten with the new model
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name[0].isdigit()) == ["12", "8"]
    assert train.main(bigger, str(run_dir), SINGLE) == train.EXIT_CONFIG


def test_unusable_run_dirs_and_records_are_config_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    assert train.main(CONFIG, str(tmp_path / "file"), SINGLE) == train.EXIT_CONFIG
    assert train.main(CONFIG, "  ", SINGLE) == train.EXIT_CONFIG
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_config.json").write_text('{"model": {"d_mod')
    with pytest.raises(checkpointing.RunConfigMismatch, match="train_config.json is unreadable"):
        train.run(CONFIG, str(tmp_path / "run"), SINGLE)

"""training.train in one process (8 CPU devices): complete, resume bit for bit, preemption,
damaged checkpoints, on a gs:// run directory and gs:// training data served by the emulated
Cloud Storage of tests/conftest.py (Orbax's arrays through tensorstore, everything else
through gcsfs), as on Cloud TPU; and on a local run directory."""

from __future__ import annotations

import json
import logging
import os
import signal
import sysconfig
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from tests.helpers.tensorboard_events import tensorboard_scalars
from tests.helpers.train_runs import CONFIG, SINGLE, losses
from training import train
from training.checkpoint import manager as checkpointing
from training.config import TrainConfig
from training.data.text import TextDataset
from training.metrics.run_log import read_records
from training.run_dir import RunDir

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


@pytest.fixture(scope="module")
def train_bucket(gcs_server) -> str:
    """A bucket with the training data: 40 files of the standard library's json, email and
    http packages as ``gs://<bucket>/corpus/*.txt``."""
    name = f"train-{uuid.uuid4().hex[:12]}"
    gcs_server.create_bucket(name)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    sources = sorted(p for package in ("json", "email", "http") for p in (stdlib / package).glob("*.py"))[:40]
    fs = fsspec.filesystem("gs")
    for path in sources:
        fs.pipe(f"{name}/corpus/{path.parent.name}-{path.stem}.txt", path.read_bytes())
    return name


@pytest.fixture(scope="module")
def config(train_bucket) -> TrainConfig:
    return CONFIG.model_copy(
        update={"data": CONFIG.data.model_copy(update={"source": f"gs://{train_bucket}/corpus/*.txt"})}
    )


@pytest.fixture
def gs_run(train_bucket) -> str:
    """A new run directory in the bucket."""
    return f"gs://{train_bucket}/runs/{uuid.uuid4().hex[:8]}"


def checkpoint_names(run_dir: str) -> list[str]:
    return sorted(name.split("/", 1)[1] for name in RunDir(run_dir).list("checkpoints/*"))


@pytest.fixture(scope="module")
def uninterrupted(train_bucket, config) -> str:
    run_dir = f"gs://{train_bucket}/runs/uninterrupted"
    # A trainer's process starts for its run (goodput's wall time begins there); pytest's ran
    # other tests first, so this run's process start is the moment it is called.
    with pytest.MonkeyPatch.context() as patch:
        started = time.time()
        patch.setattr(train, "process_start_time", lambda: started)
        result = train.run(config, run_dir, SINGLE)
    assert result.exit_code == train.EXIT_COMPLETE and result.step == 12
    return run_dir


def test_run_trains_to_completion_and_writes_its_records(uninterrupted, config):
    run = RunDir(uninterrupted)
    steps = losses(uninterrupted)
    assert [s for s, _ in steps] == list(range(1, 13))
    assert steps[-1][1] < steps[0][1]
    assert json.loads(run.read("COMPLETE"))["step"] == 12
    assert [e["event"] for e in read_records(run, "events")] == [
        "start",
        "checkpoint",
        "checkpoint",
        "checkpoint",
        "complete",
    ]
    assert checkpoint_names(uninterrupted) == ["12", "8"]  # checkpoint.keep = 2
    assert TrainConfig.model_validate_json(run.read("train_config.json")) == config
    metrics = read_records(run, "metrics")
    assert [m["step"] for m in metrics if "eval_loss" in m] == [6, 12]
    assert all(m["tflops_per_device"] > 0 and m["tokens_per_s"] > 0 for m in metrics if "loss" in m)
    # Syncs at log_every_steps (10), the checkpoints (4, 8, 12) and exit (after the step-12
    # eval): one object per window, none rewritten.
    assert [[r["step"] for r in read_records_of(run, name)] for name in run.list("metrics/*")] == [
        [1, 2, 3, 4],
        [5, 6, 6, 7, 8],
        [9, 10],
        [11, 12],
        [12],
    ]


def test_goodput_json_and_the_tensorboard_scalars(uninterrupted):
    run = RunDir(uninterrupted)
    report = json.loads(run.read("goodput.json"))
    assert 0 < report["goodput"] <= 1
    assert (report["attempts"], report["steps_lost"], report["complete"]) == (1, 0, True)
    badput = report["badput"]
    assert all(seconds >= 0 for seconds in badput.values()) and sum(badput.values()) <= report["wall_seconds"]
    assert report["productive_seconds"] + sum(badput.values()) == pytest.approx(report["wall_seconds"], abs=0.01)
    assert badput["recomputed_steps"] == badput["boot"] == badput["checkpoint_restore"] == 0  # nothing failed
    assert badput["checkpoint_save"] > 0 and badput["evaluation"] > 0  # 3 saves, 2 evals
    steps = [m for m in read_records(run, "metrics") if "loss" in m]
    assert report["productive_seconds"] <= sum(m["step_time_s"] for m in steps)
    assert 0 < report["mfu"] < 1 and all(0 < m["mfu"] < 1 for m in steps)
    events = read_records(run, "events")
    assert events[0]["restore_s"] >= 0 and all(e["save_s"] >= 0 for e in events if e["event"] == "checkpoint")
    assert tensorboard_scalars(run, "goodput/goodput") == [(12, pytest.approx(report["goodput"]))]
    assert [s for s, _ in tensorboard_scalars(run, "train/mfu")] == list(range(1, 13))
    assert tensorboard_scalars(run, "goodput/badput_compilation_s") == [(12, pytest.approx(badput["compilation"]))]


def read_records_of(run: RunDir, name: str) -> list[dict]:
    from training.metrics.run_log import parse_records

    return parse_records(run.read(name))


def test_tensorboard_gets_the_training_and_eval_curves(uninterrupted):
    run = RunDir(uninterrupted)
    loss = tensorboard_scalars(run, "train/loss")
    assert [step for step, _ in loss] == list(range(1, 13))
    assert [v for _, v in loss] == pytest.approx([v for _, v in losses(uninterrupted)])
    assert [step for step, _ in tensorboard_scalars(run, "eval/loss")] == [6, 12]
    assert len(run.list("tensorboard/*")) == 4  # one file per checkpoint window, and the last


def objects(run_dir: str) -> dict[str, str]:
    """Every object under ``run_dir`` with its generation (a rewritten object gets a new one,
    https://cloud.google.com/storage/docs/metadata#generation-number)."""
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    return {name: str(info["generation"]) for name, info in fs.find(run_dir, detail=True).items()}


def test_a_finished_run_exits_at_once(uninterrupted, config):
    before = objects(uninterrupted)
    assert any("/checkpoints/12/" in name for name in before)
    result = train.run(config, uninterrupted, SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    assert objects(uninterrupted) == before  # nothing written, nothing rewritten


def crash_at_data_step(config: TrainConfig, run_dir: str, monkeypatch, step: int = 9) -> None:
    """Run ``config`` in ``run_dir`` until it crashes while loading the batch of data ``step``."""
    real_rows = TextDataset.train_rows

    def crash_at(self, data_step, *args):
        if data_step == step:
            raise RuntimeError("injected crash")
        return real_rows(self, data_step, *args)

    monkeypatch.setattr(TextDataset, "train_rows", crash_at)
    with pytest.raises(RuntimeError, match="injected crash"):
        train.run(config, run_dir, SINGLE)
    monkeypatch.setattr(TextDataset, "train_rows", real_rows)


def test_crash_then_resume_gives_bit_identical_losses(uninterrupted, config, tmp_path, monkeypatch):
    # On a local run directory (a path: a single machine, or a mounted file system), the same
    # run as on gs:// bit for bit; the gs:// restores are the tests below.
    run_dir = str(tmp_path / "run")
    crash_at_data_step(config, run_dir, monkeypatch)
    result = train.run(config, run_dir, SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["12", "8"]
    assert json.loads((tmp_path / "run" / "COMPLETE").read_text())["step"] == 12
    assert {step for step, _ in tensorboard_scalars(RunDir(run_dir), "train/loss")} == set(range(1, 13))
    resumed = losses(run_dir)
    # The crash came while building the batch of step 10: step 9 had run but was never
    # recorded; the restart restored the step-8 checkpoint and ran 9..12.
    final = dict(resumed)  # last record per step wins
    assert final == dict(losses(uninterrupted))  # bit for bit: floats compared exactly
    first_pass = resumed[: len(resumed) - 4]
    assert [s for s, _ in resumed[len(first_pass) :]] == [9, 10, 11, 12]
    assert all(loss == final[step] for step, loss in first_pass)
    # The restart loaded the compiled train step from the run directory's compilation cache.
    first_records = [r for r in read_records(RunDir(run_dir), "metrics") if r.get("includes_compile")]
    assert [r["compile_cache_hits"] > 0 for r in first_records] == [False, True]


def test_a_crash_leaves_no_tensorboard_spool_behind(config, tmp_path, monkeypatch, spools):
    # Step 9's scalars are written, unsent, when the batch of step 11 fails: the spool of that
    # window is removed with the crash, not left in the machine's temporary directory.
    crash_at_data_step(config, str(tmp_path / "run"), monkeypatch, step=11)
    assert list(spools.iterdir()) == []
    assert {step for step, _ in tensorboard_scalars(RunDir(str(tmp_path / "run")), "train/loss")} == set(range(1, 9))


def test_sigterm_saves_the_current_step_then_resume_completes(uninterrupted, config, gs_run, monkeypatch):
    # Synchronous checkpoints here (the other runs save asynchronously).
    config = config.model_copy(update={"checkpoint": config.checkpoint.model_copy(update={"async_save": False})})
    real_rows = TextDataset.train_rows

    def preempt_at_step_5(self, step, *args):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_rows(self, step, *args)

    monkeypatch.setattr(TextDataset, "train_rows", preempt_at_step_5)
    previous = signal.getsignal(signal.SIGTERM)
    result = train.run(config, gs_run, SINGLE)
    assert signal.getsignal(signal.SIGTERM) == previous  # handler restored
    assert (result.exit_code, result.step) == (train.EXIT_PREEMPTED, 6)
    assert RunDir(gs_run).read("COMPLETE") is None
    assert checkpoint_names(gs_run) == ["4", "6"]
    report = json.loads(RunDir(gs_run).read("goodput.json"))  # written at the preemption exit too
    assert (report["attempts"], report["complete"]) == (1, False) and 0 < report["goodput"] <= 1
    monkeypatch.setattr(TextDataset, "train_rows", real_rows)
    result = train.run(config, gs_run, SINGLE)
    assert result.exit_code == train.EXIT_COMPLETE
    report = json.loads(RunDir(gs_run).read("goodput.json"))
    assert (report["attempts"], report["complete"], report["steps_lost"]) == (2, True, 0)
    assert report["badput"]["checkpoint_restore"] > 0
    assert dict(losses(gs_run)) == dict(losses(uninterrupted))
    assert [s for s, _ in losses(gs_run)] == list(range(1, 13))  # no step lost or redone
    # The compilation cache is in the bucket (gs://.../compilation_cache): the resumed
    # process, like a slice recreated with a fresh disk, loads its executables from there.
    assert RunDir(gs_run).list("compilation_cache/*")
    first_records = [r for r in read_records(RunDir(gs_run), "metrics") if r.get("includes_compile")]
    assert [r["compile_cache_hits"] > 0 for r in first_records] == [False, True]


def test_changed_model_in_an_existing_run_dir_is_refused(uninterrupted, config, gs_run):
    RunDir(gs_run).write("train_config.json", RunDir(uninterrupted).read("train_config.json"))
    bigger = config.model_copy(update={"model": config.model.model_copy(update={"d_model": 64})})
    with pytest.raises(checkpointing.RunConfigMismatch, match=r"different training.model"):
        train.run(bigger, gs_run, SINGLE)
    assert train.main(bigger, gs_run, SINGLE) == train.EXIT_CONFIG


def test_unreadable_data_source_is_a_config_error(tmp_path, train_bucket):
    config = CONFIG.model_copy(update={"data": CONFIG.data.model_copy(update={"source": str(tmp_path / "none-*.txt")})})
    assert train.main(config, str(tmp_path / "run"), SINGLE) == train.EXIT_CONFIG
    config = CONFIG.model_copy(
        update={"data": CONFIG.data.model_copy(update={"source": f"gs://{train_bucket}/none/*.txt"})}
    )
    assert train.main(config, str(tmp_path / "run"), SINGLE) == train.EXIT_CONFIG


def copy_run(source: str, target: str) -> str:
    fsspec.filesystem("gs").copy(source, target, recursive=True)
    return target


def test_a_malformed_completion_marker_does_not_end_an_unfinished_run(uninterrupted, config, gs_run, monkeypatch):
    crash_at_data_step(config, gs_run, monkeypatch)
    for garbage in (b"garbage!!", b"[1]", b'{"step": "abc"}', b"\xff\xfe"):
        RunDir(gs_run).write("COMPLETE", garbage)
        assert checkpointing.read_completion(RunDir(gs_run)) is None
    result = train.run(config, gs_run, SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    assert dict(losses(gs_run)) == dict(losses(uninterrupted))
    assert checkpointing.read_completion(RunDir(gs_run))["step"] == 12


def test_raising_steps_continues_a_finished_run(uninterrupted, config, gs_run):
    run_dir = copy_run(uninterrupted, gs_run)
    longer = config.model_copy(update={"steps": 14})
    result = train.run(longer, run_dir, SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 14)
    assert [s for s, _ in losses(run_dir)] == list(range(1, 15))


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(uninterrupted, config, gs_run):
    run_dir = copy_run(uninterrupted, gs_run)
    fs = fsspec.filesystem("gs")
    fs.rm(f"{run_dir}/COMPLETE")
    damaged = 0
    for path in fs.find(f"{run_dir}/checkpoints/12"):
        if "METADATA" not in path.rsplit("/", 1)[1]:
            fs.pipe(path, b"")
            damaged += 1
    assert damaged
    result = train.run(config, run_dir, SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    assert "12.unreadable" in checkpoint_names(run_dir)  # kept for inspection
    records = losses(run_dir)
    assert [s for s, _ in records[12:]] == [9, 10, 11, 12]  # recomputed from the step-8 checkpoint
    assert dict(records) == dict(losses(uninterrupted))


def test_checkpoints_of_another_model_are_a_config_error_and_keep_the_record(uninterrupted, config, gs_run):
    run_dir = copy_run(uninterrupted, gs_run)
    fs = fsspec.filesystem("gs")
    fs.rm([f"{run_dir}/COMPLETE", f"{run_dir}/train_config.json"])
    bigger = config.model_copy(update={"model": config.model.model_copy(update={"d_model": 64})})
    with pytest.raises(
        checkpointing.CheckpointRestoreError,
        match=r"no checkpoint in .* can be restored: step 12 \(\S+/checkpoints/12\): ",
    ):
        train.run(bigger, run_dir, SINGLE)
    assert RunDir(run_dir).read("train_config.json") is None  # not rewritten with the new model
    assert checkpoint_names(run_dir) == ["12", "8"]
    assert train.main(bigger, run_dir, SINGLE) == train.EXIT_CONFIG


def test_unusable_run_dirs_and_records_are_config_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    assert train.main(CONFIG, str(tmp_path / "file"), SINGLE) == train.EXIT_CONFIG
    assert train.main(CONFIG, "  ", SINGLE) == train.EXIT_CONFIG
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_config.json").write_text('{"model": {"d_mod')
    with pytest.raises(checkpointing.RunConfigMismatch, match="train_config.json is unreadable"):
        train.run(CONFIG, str(tmp_path / "run"), SINGLE)

"""A restore the job can trust, with 2 real ``jax.distributed`` processes (tests/trainer_process.py)
on a ``gs://`` run directory served by the emulated Cloud Storage (tests/conftest.py), as on
Cloud TPU: after a fallback every process lists the same checkpoints and makes the same save
decisions (the run passes its next saves and completes within a bound, bit for bit).

Each test resumes a copy of one uninterrupted 20-step run (checkpoints every 4 steps, the last
3 kept: 12, 16, 20) without its step-20 checkpoint and its completion marker, damages step 16
in its own way, and compares the per-step losses with the uninterrupted run's, exactly."""

from __future__ import annotations

import re
import signal
import sysconfig
import time
import uuid
from pathlib import Path

import fsspec
import pytest

from tests.checkpoint_damage import overwrite_keeping_size, poison
from tests.trainer_process import Job, write_config
from training import train
from training.config import TrainConfig
from training.metrics.run_log import read_records
from training.run_dir import RunDir

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

STEPS = 20
#: A resume of this tiny run takes 15–40 s on the 2-core CI machine; a job still running after
#: this long is stuck (before the fix of docs/jax-on-cpu.md, "Checkpoints (Orbax)": the two
#: processes waited for each other at the first save after the fallback, with no timeout).
RESUME_BOUND_S = 150


def config(corpus: str) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
            "sequence_length": 32,
            "global_batch_size": 8,
            "steps": STEPS,
            "optimizer": {"warmup_steps": 2},
            "checkpoint": {"interval_steps": 4, "keep": 3},
            "log_every_steps": 1,
            "parallelism": {"ici": {"fsdp": 2}, "dcn": {"data": 2}},
            "data": {"source": corpus},
        }
    )


@pytest.fixture(scope="module")
def bucket_name(gcs_server) -> str:
    name = f"trust-{uuid.uuid4().hex[:12]}"
    gcs_server.create_bucket(name)
    return name


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    """20 files of the standard library's json and http packages as text (a local glob)."""
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(p for package in ("json", "http") for p in (stdlib / package).glob("*.py"))[:20]:
        (root / f"{path.parent.name}-{path.stem}.txt").write_bytes(path.read_bytes())
    return f"{root}/*.txt"


@pytest.fixture(scope="module")
def config_path(corpus, tmp_path_factory) -> Path:
    return write_config(tmp_path_factory.mktemp("config") / "config.json", config(corpus))


@pytest.fixture(scope="module")
def uninterrupted(bucket_name, config_path, tmp_path_factory) -> str:
    run_dir = f"gs://{bucket_name}/runs/uninterrupted"
    job = Job(config_path, run_dir, tmp_path_factory.mktemp("uninterrupted"))
    try:
        assert job.wait() == [train.EXIT_COMPLETE, train.EXIT_COMPLETE], logs(job)
    finally:
        job.kill()
    assert checkpoint_names(run_dir) == ["12", "16", "20"]
    return run_dir


@pytest.fixture
def jobs():
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()


def logs(job: Job) -> str:
    return "\n".join(f"--- process {i} ---\n{job.log(i)[-2500:]}" for i in range(len(job.procs)))


def losses(run_dir: str) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_records(RunDir(run_dir), "metrics") if "loss" in r]


def events(run_dir: str) -> list[dict]:
    return read_records(RunDir(run_dir), "events")


def checkpoint_names(run_dir: str) -> list[str]:
    return sorted(name.split("/", 1)[1] for name in RunDir(run_dir).list("checkpoints/*"))


def unfinished_copy(uninterrupted: str, bucket_name: str) -> str:
    """The uninterrupted run copied, less its COMPLETE marker and its step-20 checkpoint: a run
    whose last start ended after saving step 16 (checkpoints 12 and 16)."""
    run_dir = f"gs://{bucket_name}/runs/{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("gs")
    fs.copy(uninterrupted, run_dir, recursive=True)
    fs.rm(f"{run_dir}/COMPLETE")
    fs.rm(f"{run_dir}/checkpoints/20", recursive=True)
    fs.invalidate_cache()
    assert checkpoint_names(run_dir) == ["12", "16"]
    return run_dir


def resume(job: Job, run_dir: str, uninterrupted: str) -> float:
    """Wait for the resumed job (at most RESUME_BOUND_S: a stuck job fails the test with its
    logs), check it completed from step 12 bit for bit; its wall time in seconds."""
    started = time.monotonic()
    assert job.wait(timeout_s=RESUME_BOUND_S) == [train.EXIT_COMPLETE, train.EXIT_COMPLETE], logs(job)
    seconds = time.monotonic() - started
    start = [e for e in events(run_dir) if e["event"] == "start"][-1]
    assert (start["step"], start["restored"]) == (12, True)
    saved = [e["step"] for e in events(run_dir) if e["event"] == "checkpoint" and e["time"] >= start["time"]]
    assert saved == [16, 20]  # the next saves after the fallback, by both processes (Orbax's save is collective)
    records = losses(run_dir)
    assert [s for s, _ in records[-8:]] == list(range(13, 21))  # recomputed from step 12
    assert dict(records) == dict(losses(uninterrupted))  # bit for bit
    return seconds


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_after_a_fallback_seen_by_one_process_every_process_saves_the_same_steps(
    uninterrupted, bucket_name, config_path, tmp_path, jobs
):
    """Step 16 cannot be read from process 1 only (test-only injection inside Orbax's read:
    a per-host read failure); both fall back to step 12, process 0 sets 16 aside, and both
    must then list the same checkpoints: before the fix, process 1's gcsfs answered its
    listing from its cache, still listed step 16, refused to save step 16, and the two
    processes waited for each other at that save until killed."""
    run_dir = unfinished_copy(uninterrupted, bucket_name)
    job = Job(config_path, run_dir, tmp_path, env={1: {"TEST_UNREADABLE_STEPS": "16"}})
    jobs.append(job)
    seconds = resume(job, run_dir, uninterrupted)
    print(f"resumed past the fallback and 2 saves in {seconds:.1f} s")
    (fallback,) = [e for e in events(run_dir) if e["event"] == "restore_fallback"]
    assert (fallback["tried"], fallback["step"]) == (16, 12)
    assert fallback["reason"].startswith("process 1: OSError: injected read failure")
    assert checkpoint_names(run_dir) == ["12", "16", "16.unreadable", "20"]
    for i in range(2):
        assert "list different checkpoints" not in job.log(i), logs(job)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bytes_overwritten_in_the_newest_checkpoint_are_detected_and_every_process_falls_back(
    uninterrupted, bucket_name, corpus, config_path, tmp_path, jobs
):
    """Step 16's bytes are changed with its size kept, in one of its data files (process 0
    writes this small model's replicated arrays whole: training.checkpoint.manager's
    REPLICA_PARALLEL_MIN_SLICE_BYTES; each process reads every array it restores, so where the
    damage lies does not matter): Orbax reads it without complaint; the checksums recorded by its save do not match the
    restored arrays, so both processes skip it, restore step 12, pass the next saves and
    complete bit for bit; one event and one fallback line per process name the step and why."""
    run_dir = unfinished_copy(uninterrupted, bucket_name)
    damaged = overwrite_keeping_size(f"{run_dir}/checkpoints", 16, config(corpus), under="ocdbt.process_0")
    job = Job(config_path, run_dir, tmp_path)
    jobs.append(job)
    seconds = resume(job, run_dir, uninterrupted)
    (fallback,) = [e for e in events(run_dir) if e["event"] == "restore_fallback"]
    assert (fallback["tried"], fallback["step"], fallback["path"]) == (16, 12, f"{run_dir}/checkpoints/16")
    assert fallback["reason"].startswith("checksum mismatch in "), fallback  # the same verdict on both processes
    start = [e for e in events(run_dir) if e["event"] == "start"][-1]
    print(f"{damaged}: detected, fell back and completed in {seconds:.1f} s; restore_s {start['restore_s']} s")
    for i in range(2):
        (line,) = [line for line in job.log(i).splitlines() if "fell back to checkpoint" in line]
        assert f"step 16 ({run_dir}/checkpoints/16) could not be restored (step 16: checksum mismatch in " in line, (
            logs(job)
        )
        assert "restoring checkpoint step 16" not in job.log(i)  # read fine: no read error, no second attempt
    assert checkpoint_names(run_dir) == ["12", "16", "16.unreadable", "20"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_loss_that_goes_non_finite_after_a_restore_falls_back_once_to_the_checkpoint_before(
    uninterrupted, bucket_name, corpus, config_path, tmp_path, jobs
):
    """Step 16 holds finite garbage (:func:`poison`) and no checksums, so it passes the
    restore checks; the loss goes non-finite a step or two later, before any save. Both processes
    set step 16 aside as 16.nonfinite and exit 1 (one event, one line); the restart restores step
    12 and completes bit for bit, instead of restoring step 16 again and again."""
    run_dir = unfinished_copy(uninterrupted, bucket_name)
    poison(f"{run_dir}/checkpoints", 16, config(corpus))
    (tmp_path / "first").mkdir()
    job = Job(config_path, run_dir, tmp_path / "first")
    jobs.append(job)
    started = time.monotonic()
    codes = job.wait(timeout_s=RESUME_BOUND_S)
    # Process 1 exits 1 too, or 69 when its collective loses process 0 first, or is ended (SIGABRT)
    # by the coordination service when process 0, which hosts it, leaves first (docs/jax-on-cpu.md,
    # "Failures"): failed either way.
    assert codes[0] == train.EXIT_FAILED, logs(job)
    assert codes[1] in (train.EXIT_FAILED, train.EXIT_PEER_LOST, -signal.SIGABRT), logs(job)
    print(f"non-finite loss after the restore detected and step 16 set aside in {time.monotonic() - started:.1f} s")
    (fallback,) = [e for e in events(run_dir) if e["event"] == "restore_fallback"]
    assert (fallback["tried"], fallback["step"], fallback["path"]) == (16, 12, f"{run_dir}/checkpoints/16")
    assert re.fullmatch(r"loss is (nan|inf) at step 1[78] after restoring it", fallback["reason"]), fallback
    for i in range(2):
        (line,) = [line for line in job.log(i).splitlines() if "after restoring checkpoint step 16" in line]
        assert line.endswith("set it aside as 16.nonfinite; the restart restores the checkpoint before it (step 12)"), (
            line
        )
    assert checkpoint_names(run_dir) == ["12", "16.nonfinite"]
    (tmp_path / "restart").mkdir()
    restart = Job(config_path, run_dir, tmp_path / "restart")
    jobs.append(restart)
    resume(restart, run_dir, uninterrupted)

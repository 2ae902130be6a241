"""Every process of a job agrees: the trainer as 2 real ``jax.distributed``
processes on CPU (tests/trainer_process.py), 2 devices each, one slice per process; and a
notice or a dead peer never leaves a process hanging (14.3)."""

from __future__ import annotations

import re
import shutil
import signal
import sysconfig
from pathlib import Path

import pytest

from tests.trainer_process import Job, write_config
from training import train
from training.config import TrainConfig
from training.metrics.run_log import read_records
from training.run_dir import RunDir

# Each failed orbax read in this process (none here) or a child's is logged there, not here.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def config(corpus: Path, **update) -> TrainConfig:
    base = TrainConfig.model_validate(
        {
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
            "sequence_length": 32,
            "global_batch_size": 8,
            "steps": 16,
            "optimizer": {"warmup_steps": 2},
            "checkpoint": {"interval_steps": 4, "keep": 3, "async_save": False},
            "log_every_steps": 1,
            "parallelism": {"ici": {"fsdp": 2}, "dcn": {"data": 2}},
            "data": {"source": f"{corpus}/*.txt"},
        }
    )
    return base.model_copy(update=update)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """20 files of the standard library's json and http packages as text."""
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(p for package in ("json", "http") for p in (stdlib / package).glob("*.py"))[:20]:
        (root / f"{path.parent.name}-{path.stem}.txt").write_bytes(path.read_bytes())
    return root


@pytest.fixture
def jobs():
    """Every Job a test starts; their process groups are killed at the end, whatever happens."""
    started: list[Job] = []
    yield started
    for job in started:
        job.kill()


def events(run_dir: Path) -> list[dict]:
    return read_records(RunDir(str(run_dir)), "events")


SAVED = re.compile(r"stop notice: saved step (\d+) \((\S+)\); exiting with 75 to resume from it")
BOTH_SLOW = {0: {"TEST_STEP_DELAY_S": "0.3"}, 1: {"TEST_STEP_DELAY_S": "0.3"}}  # test-only: a notice lands mid-run


def losses(run_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_records(RunDir(str(run_dir)), "metrics") if "loss" in r]


def logs(job: Job) -> str:
    return "\n".join(f"--- process {i} ---\n{job.log(i)[-2500:]}" for i in range(len(job.procs)))


@pytest.fixture(scope="module")
def preempted_run(corpus, tmp_path_factory):
    """A 2-process run whose process 1 (not the coordinator) got SIGTERM at about step 3,
    then resumed to completion: ``(config path, run dir, the preempted job, saved steps)``."""
    tmp = tmp_path_factory.mktemp("preempted")
    config_path = write_config(tmp / "config.json", config(corpus))
    run_dir = tmp / "run"
    job = Job(config_path, run_dir, tmp, env=BOTH_SLOW)
    try:
        job.wait_for(1, r"step 2/16 loss")
        job.signal(1)  # only the non-coordinator gets the notice
        codes = job.wait()
        saved = [SAVED.search(job.log(i)) for i in range(2)]
        (tmp / "resumed").mkdir()
        resumed = Job(config_path, run_dir, tmp / "resumed")
        resumed_codes = resumed.wait()
    finally:
        job.kill()
    return config_path, run_dir, job, codes, saved, resumed, resumed_codes


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_notice_to_a_non_coordinator_saves_the_same_step_everywhere_and_loses_none(preempted_run):
    _, run_dir, job, codes, saved, resumed, resumed_codes = preempted_run
    assert codes == [train.EXIT_PREEMPTED, train.EXIT_PREEMPTED], logs(job)
    assert all(saved), logs(job)
    steps = {int(m.group(1)) for m in saved}
    assert len(steps) == 1, f"processes saved different steps: {steps}"
    (step,) = steps
    assert 2 < step < 16
    assert {m.group(2) for m in saved} == {str(run_dir / "checkpoints" / str(step))}
    assert [e["step"] for e in events(run_dir) if e["event"] == "preempted"] == [step]

    assert resumed_codes == [train.EXIT_COMPLETE, train.EXIT_COMPLETE], logs(resumed)
    starts = [e for e in events(run_dir) if e["event"] == "start"]
    assert [(e["step"], e["restored"]) for e in starts] == [(0, False), (step, True)]  # 0 steps lost
    assert [s for s, _ in losses(run_dir)] == list(range(1, 17))  # every step once: none lost, none redone


def copy_unfinished(preempted_run, target: Path) -> tuple[Path, Path]:
    """The completed run of ``preempted_run`` copied to ``target``, less its COMPLETE marker
    (finalized checkpoints of steps 8, 12 and 16): a run whose last start ended before the
    marker was written."""
    config_path, run_dir = preempted_run[0], preempted_run[1]
    shutil.copytree(run_dir, target / "run")
    (target / "run" / "COMPLETE").unlink()
    return config_path, target / "run"


def longer_run(preempted_run, tmp_path: Path, steps: int = 20) -> tuple[Path, Path]:
    """``preempted_run``'s run, unfinished (:func:`copy_unfinished`), under a config of ``steps``
    steps: a restart resumes it from its step 16."""
    config_path, run_dir = copy_unfinished(preempted_run, tmp_path)
    longer = write_config(
        tmp_path / "longer.json",
        TrainConfig.model_validate_json(config_path.read_text()).model_copy(update={"steps": steps}),
    )
    return longer, run_dir


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_restore_agrees_on_the_newest_step_every_process_can_read(preempted_run, tmp_path, jobs):
    config_path, run_dir = copy_unfinished(preempted_run, tmp_path)
    before = dict(losses(run_dir))
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["12", "16", "8"]
    damaged = [p for p in (run_dir / "checkpoints" / "16").rglob("*") if p.is_file() and "METADATA" not in p.name]
    for path in damaged:
        path.write_bytes(b"")
    assert damaged
    job = Job(config_path, run_dir, tmp_path)
    jobs.append(job)
    assert job.wait() == [train.EXIT_COMPLETE, train.EXIT_COMPLETE], logs(job)
    starts = [e for e in events(run_dir) if e["event"] == "start"]
    assert (starts[-1]["step"], starts[-1]["restored"]) == (12, True)  # both processes: one start event, one step
    (fallback,) = [e for e in events(run_dir) if e["event"] == "restore_fallback"]
    assert (fallback["tried"], fallback["path"], fallback["step"]) == (16, str(run_dir / "checkpoints" / "16"), 12)
    assert fallback["reason"].startswith("process 0: ") and "<" not in fallback["reason"]
    assert "16.unreadable" in {p.name for p in (run_dir / "checkpoints").iterdir()}
    records = losses(run_dir)
    assert [s for s, _ in records[-4:]] == [13, 14, 15, 16]  # recomputed from step 12, on both processes
    assert dict(records) == before  # bit for bit
    for i in range(2):
        assert re.search(r"fell back to checkpoint step 12 \(\S+/checkpoints/12\): the newer step 16", job.log(i)), (
            logs(job)
        )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_checkpoint_unreadable_from_one_process_only_is_skipped_by_every_process(preempted_run, tmp_path, jobs):
    config_path, run_dir = copy_unfinished(preempted_run, tmp_path)
    before = dict(losses(run_dir))
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir())
    unreadable = steps[-1]
    readable_everywhere = max(s for s in steps if s != unreadable)
    # The newest step's arrays cannot be read from process 1 only (test-only injection in
    # tests/trainer_process.py, inside Orbax's restore); process 0 reads them fine. Both must
    # skip it and restore the next step, and the run completes: nobody waits for a collective
    # that the other process never joins.
    job = Job(config_path, run_dir, tmp_path, env={1: {"TEST_UNREADABLE_STEPS": str(unreadable)}})
    jobs.append(job)
    assert job.wait() == [train.EXIT_COMPLETE, train.EXIT_COMPLETE], logs(job)
    starts = [e for e in events(run_dir) if e["event"] == "start"]
    assert (starts[-1]["step"], starts[-1]["restored"]) == (readable_everywhere, True)
    (fallback,) = [e for e in events(run_dir) if e["event"] == "restore_fallback"]
    path = str(run_dir / "checkpoints" / str(unreadable))
    assert (fallback["tried"], fallback["path"], fallback["step"]) == (unreadable, path, readable_everywhere)
    # Only process 1 failed to read it: process 0 read it, and did not time out waiting.
    assert (
        fallback["reason"] == f"process 1: OSError: injected read failure of checkpoint step {unreadable} on this host"
    )
    assert f"{unreadable}.unreadable" in {p.name for p in (run_dir / "checkpoints").iterdir()}
    records = losses(run_dir)
    assert [s for s, _ in records[-(16 - readable_everywhere) :]] == list(range(readable_everywhere + 1, 17))
    assert dict(records) == before  # recomputed bit for bit
    for i in range(2):
        assert (
            f"fell back to checkpoint step {readable_everywhere} ({run_dir / 'checkpoints' / str(readable_everywhere)})"
            in job.log(i)
        ), logs(job)
    assert f"restoring checkpoint step {unreadable} ({path}) failed" in job.log(1)
    assert f"restoring checkpoint step {unreadable} ({path}) failed" not in job.log(0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_process_waiting_for_a_peer_stuck_in_restore_ends_and_so_does_the_peer(preempted_run, tmp_path, jobs):
    config_path, run_dir = copy_unfinished(preempted_run, tmp_path)
    # Process 1 cannot read step 16 (test-only), and process 0's first read blocks for 10
    # minutes (test-only: storage that hangs). Process 1 waits for process 0's outcome up to
    # the agreement timeout (15 s here), then fails; the coordination service then ends the
    # stuck process 0 (heartbeat, 10 s here); both non-zero, for the supervisor to restart them.
    # (jax.distributed.initialize met them both shortly before: 15 s is far beyond their skew.)
    short = {"MULTISLICE_AGREEMENT_TIMEOUT_S": "15"}
    job = Job(
        config_path,
        run_dir,
        tmp_path,
        env={0: {**short, "TEST_RESTORE_DELAY_S": "600"}, 1: {**short, "TEST_UNREADABLE_STEPS": "16"}},
    )
    jobs.append(job)
    codes = job.wait()
    assert all(code not in (train.EXIT_COMPLETE, train.EXIT_PREEMPTED) for code in codes), logs(job)
    assert "TEST: restore of step 16 blocked" in job.log(0)
    assert "restoring checkpoint step 16 (" + str(run_dir / "checkpoints" / "16") + ") failed" in job.log(1)
    assert "process 0 did not report 'restore-16-0' within 15 s" in job.log(1), logs(job)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_notice_while_blocked_in_restore_ends_every_process(preempted_run, tmp_path, jobs):
    config_path, run_dir = copy_unfinished(preempted_run, tmp_path)
    # Process 1's first checkpoint read blocks for 10 minutes (test-only): it cannot reach a step.
    job = Job(config_path, run_dir, tmp_path, env={1: {"TEST_RESTORE_DELAY_S": "600"}})
    jobs.append(job)
    job.wait_for(1, r"TEST: restore of step 16 blocked")
    job.signal(1)
    assert job.wait() == [train.EXIT_PREEMPTED, train.EXIT_PREEMPTED], logs(job)
    for i in range(2):
        assert "stop notice before the first training step of this start: nothing to save; exiting 75" in job.log(i)


@pytest.mark.timeout(300)
def test_a_notice_while_waiting_for_peers_ends_the_process(corpus, tmp_path, jobs):
    config_path = write_config(tmp_path / "config.json", config(corpus))
    job = Job(config_path, tmp_path / "run", tmp_path, start=False)
    jobs.append(job)
    job.start(0, config_path, tmp_path / "run", 2, {})  # process 1 never comes
    job.wait_for(0, r"jax.distributed.initialize coordinator=")
    job.signal(0)
    assert job.wait() == [train.EXIT_PREEMPTED], logs(job)
    assert "stop notice before the first training step of this start: nothing to save; exiting 75" in job.log(0)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_dead_peer_ends_the_survivor(preempted_run, tmp_path, jobs):
    longer, run_dir = longer_run(preempted_run, tmp_path, steps=400)
    job = Job(longer, run_dir, tmp_path, env=BOTH_SLOW)
    jobs.append(job)
    job.wait_for(0, r"step 18/400 loss")
    job.signal(1, signal.SIGKILL)  # a hardware fault: no notice
    codes = job.wait()
    assert codes[1] == -signal.SIGKILL
    # The survivor's collective lost its peer: status 69, which its unit restarts without a backoff.
    assert codes[0] == train.EXIT_PEER_LOST, logs(job)


#: Gloo, JAX's CPU collectives, gives up on a peer that reaches a collective's first use more
#: than a fixed 30 s later ("Gloo context initialization failed: DEADLINE_EXCEEDED").
GLOO_CONTEXT_TIMEOUT_S = 30


@pytest.mark.slow
def test_a_peer_that_compiles_much_longer_is_waited_for(preempted_run, tmp_path, jobs):
    """A resumed process that loads the train step from the persistent compilation cache can
    reach the first step long before a peer that compiles it (only process 0 writes the cache):
    a peer later than gloo's context timeout is waited for, and the run completes."""
    config_path, run_dir = longer_run(preempted_run, tmp_path)
    delay = {1: {"TEST_COMPILE_DELAY_S": str(GLOO_CONTEXT_TIMEOUT_S + 5)}}
    job = Job(config_path, run_dir, tmp_path, env=delay)
    jobs.append(job)
    assert job.wait() == [0, 0], logs(job)
    starts = [e for e in events(run_dir) if e["event"] == "start"]
    assert starts[-1]["step"] == 16 and starts[-1]["restored"], starts
    assert [e["event"] for e in events(run_dir)][-1] == "complete"


@pytest.mark.slow
def test_a_peer_that_compiles_past_the_agreement_bound_ends_every_process(preempted_run, tmp_path, jobs):
    """The processes meet at a coordination-service barrier once they have compiled, before the
    first step, bounded by ``MULTISLICE_AGREEMENT_TIMEOUT_S``: a peer still compiling past it ends
    every process (for the supervisor to restart them) with a line that names the barrier,
    instead of a wait in the first step's collectives that nothing of ours bounds."""
    config_path, run_dir = longer_run(preempted_run, tmp_path)
    short = {"MULTISLICE_AGREEMENT_TIMEOUT_S": "15"}
    job = Job(config_path, run_dir, tmp_path, env={0: short, 1: {**short, "TEST_COMPILE_DELAY_S": "600"}})
    jobs.append(job)
    codes = job.wait()
    assert all(code not in (train.EXIT_COMPLETE, train.EXIT_PREEMPTED) for code in codes), logs(job)
    assert "not every process reached 'compiled/16' within 15 s" in job.log(0), logs(job)
    assert not (run_dir / "COMPLETE").exists() and losses(run_dir)[-1][0] == 16  # no step trained

"""Every process of a job agrees (issue 14.1, 14.2): the trainer as 2 real ``jax.distributed``
processes on CPU (tests/trainer_process.py), 4 devices each, one slice per process."""

from __future__ import annotations

import re
import sysconfig
from pathlib import Path

import pytest

from tests.trainer_process import Job, write_config
from training import train
from training.config import TrainConfig
from training.run_dir import RunDir
from training.run_log import read_records

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
            "parallelism": {"ici": {"fsdp": 2, "tensor": 2}, "dcn": {"data": 2}},
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


SAVED = re.compile(r"preemption notice: saved step (\d+) \((\S+)\); exiting for restart")


def test_a_notice_to_a_non_coordinator_saves_the_same_step_everywhere_and_loses_none(corpus, tmp_path, jobs):
    cfg = config(corpus)
    config_path = write_config(tmp_path / "config.json", cfg)
    run_dir = tmp_path / "run"
    # Steps slowed to ~0.3 s (test-only) so that the notice lands mid-run.
    job = Job(config_path, run_dir, tmp_path, env={0: {"TEST_STEP_DELAY_S": "0.3"}, 1: {"TEST_STEP_DELAY_S": "0.3"}})
    jobs.append(job)
    job.wait_for(1, r"step 2/16 loss")
    job.signal(1)  # only the non-coordinator gets the notice
    codes = job.wait()
    saved = [SAVED.search(job.log(i)) for i in range(2)]
    assert codes == [train.EXIT_PREEMPTED, train.EXIT_PREEMPTED], [job.log(i)[-2000:] for i in range(2)]
    assert all(saved), [job.log(i)[-2000:] for i in range(2)]
    steps = {int(m.group(1)) for m in saved}
    assert len(steps) == 1, f"processes saved different steps: {steps}"
    (step,) = steps
    assert 2 < step < cfg.steps
    assert (run_dir / "checkpoints" / str(step)).is_dir()
    assert [e["step"] for e in events(run_dir) if e["event"] == "preempted"] == [step]

    (tmp_path / "resumed").mkdir()
    resumed = Job(config_path, run_dir, tmp_path / "resumed")
    jobs.append(resumed)
    assert resumed.wait() == [train.EXIT_COMPLETE, train.EXIT_COMPLETE]
    starts = [e for e in events(run_dir) if e["event"] == "start"]
    assert [(e["step"], e["restored"]) for e in starts] == [(0, False), (step, True)]  # 0 steps lost
    losses = [r["step"] for r in read_records(RunDir(str(run_dir)), "metrics") if "loss" in r]
    assert losses == list(range(1, cfg.steps + 1))  # every step once: none lost, none redone

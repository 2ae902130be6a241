"""training.train with gradient accumulation (``microbatches: 2``), one process on the 8 CPU
devices, a local run directory: a run that crashes and resumes from its checkpoint ends with
the losses of an uninterrupted run with the same setting, bit for bit (the batch of each step
is a pure function of the step, and so is its split into microbatches)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from tests.helpers.checkpoint_runs import config, names
from tests.helpers.train_runs import losses
from training import train
from training.cluster import ClusterIdentity
from training.config import TrainConfig
from training.data.text import TextDataset

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
SINGLE = ClusterIdentity.single_process()
STEPS = 8


@pytest.fixture(scope="module")
def cfg(tmp_path_factory) -> TrainConfig:
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted((stdlib / "json").glob("*.py")):
        (root / f"json-{path.stem}.txt").write_bytes(path.read_bytes())
    base = config(f"{root}/*.txt")
    # 8 rows over data × fsdp = 4: 2 rows per replica, one per microbatch.
    return base.model_copy(update={"steps": STEPS, "microbatches": 2})


def test_a_resumed_run_with_microbatches_is_bit_identical_to_an_uninterrupted_one(cfg, tmp_path, monkeypatch):
    uninterrupted = tmp_path / "uninterrupted"
    assert train.run(cfg, str(uninterrupted), SINGLE).exit_code == train.EXIT_COMPLETE

    resumed = tmp_path / "resumed"
    real_rows = TextDataset.train_rows

    def crash_at_step_6(self, step, *args):
        if step == 6:
            raise RuntimeError("injected crash")
        return real_rows(self, step, *args)

    monkeypatch.setattr(TextDataset, "train_rows", crash_at_step_6)
    with pytest.raises(RuntimeError, match="injected crash"):
        train.run(cfg, str(resumed), SINGLE)
    monkeypatch.setattr(TextDataset, "train_rows", real_rows)
    assert names(resumed) == ["4"]
    assert train.run(cfg, str(resumed), SINGLE).exit_code == train.EXIT_COMPLETE

    records = losses(resumed)
    assert [step for step, _ in records[-4:]] == [5, 6, 7, 8]  # steps 5 and 6 ran twice
    assert dict(records) == dict(losses(uninterrupted))  # floats compared exactly
    assert all(loss == dict(records)[step] for step, loss in records)

"""Elastic resume: a run checkpointed on one mesh resumes on another (a different
ICI split of the 8 devices: data×fsdp×tensor 2×2×2, then 8×1×1) with the same global batch.

* No sample is seen twice or skipped: every data step 0..11 is read exactly once over the two
  attempts, always as rows [0, 8) of the global batch (training.data.text: the batch of step s is
  a pure function of s; training.mesh.process_batch_rows: the rows of this process's devices).
* The steps before the checkpoint are bit-identical to the uninterrupted run (same mesh);
  after it, the losses stay within ``LOSS_RTOL`` of the uninterrupted run. Restoring onto the
  new shardings moves bytes and changes none (the first resumed step's parameters are the
  saved ones); what differs is the order in which float32 partial sums are added on the new
  mesh (the all-reduce of gradients over 8 instead of 4 batch shards, replicated instead of
  sharded matmuls). Each reordering changes a sum by a few float32 ulps (2^-23 ≈ 1.2e-7
  relative); the test also runs the uninterrupted run on the new mesh and asserts the elastic
  run is no further from the original than that run is, up to the same tolerance.
"""

from __future__ import annotations

import os
import signal
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tests import compilation_cache
from training import compile_cache, train
from training.cluster import ClusterIdentity
from training.config import TrainConfig
from training.data.text import TextDataset
from training.metrics.run_log import read_records
from training.run_dir import RunDir

#: Relative tolerance on per-step losses after a resume on another mesh: 6 steps of a 30k
#: parameter model in float32, whose losses differ across meshes by reduction order only
#: (measured 9.9e-8 relative on a CPU, about one float32 ulp, 2^-23 ≈ 1.2e-7; the bound leaves
#: two orders of magnitude for other XLA versions and reduction trees).
LOSS_RTOL = 1e-5

BASE = {
    "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
    "sequence_length": 32,
    "global_batch_size": 8,
    "steps": 12,
    "optimizer": {"warmup_steps": 2},
    "checkpoint": {"interval_steps": 4, "keep": 2, "async_save": False},
    "data": {"source": str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "*.py")},
}
ON_A = TrainConfig.model_validate({**BASE, "parallelism": {"ici": {"data": 2, "fsdp": 2, "tensor": 2}}})
ON_B = TrainConfig.model_validate({**BASE, "parallelism": {"ici": {"data": 8, "fsdp": 1, "tensor": 1}}})
SINGLE = ClusterIdentity.single_process()
PREEMPT_AT = 5  # data step whose batch load brings SIGTERM: step 6 is saved, then exit 75


def losses(run_dir: str) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_records(RunDir(run_dir), "metrics") if "loss" in r]


def uninterrupted(config: TrainConfig, run_dir: Path) -> dict[int, float]:
    assert train.run(config, str(run_dir), SINGLE).exit_code == train.EXIT_COMPLETE
    return dict(losses(str(run_dir)))


@pytest.fixture
def reads(monkeypatch) -> list[tuple[int, int, int]]:
    """Every (data step, first row, end row) the trainer reads; SIGTERM at ``PREEMPT_AT``
    once (a preemption notice: the trainer saves the step it reaches and exits 75)."""
    real_rows = TextDataset.train_rows
    seen: list[tuple[int, int, int]] = []

    def recording(self, step, global_batch_size, start, stop):
        if step == PREEMPT_AT and not any(s == PREEMPT_AT for s, _, _ in seen):
            os.kill(os.getpid(), signal.SIGTERM)
        seen.append((step, start, stop))
        return real_rows(self, step, global_batch_size, start, stop)

    monkeypatch.setattr(TextDataset, "train_rows", recording)
    return seen


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_saved_on_one_mesh_resumes_on_another(tmp_path, reads, monkeypatch):
    # The session's compilation cache (tests/compilation_cache.py): the reference runs below
    # load what the elastic run compiled for each mesh instead of compiling it again.
    monkeypatch.setenv(compile_cache.SHARED_DIR_ENV, compilation_cache.DIR)
    run_dir = str(tmp_path / "elastic")
    first = train.run(ON_A, run_dir, SINGLE)
    assert (first.exit_code, first.step) == (train.EXIT_PREEMPTED, PREEMPT_AT + 1)
    second = train.run(ON_B, run_dir, SINGLE)  # the same run directory, another mesh
    assert (second.exit_code, second.step) == (train.EXIT_COMPLETE, 12)
    starts = [(e["step"], e["restored"]) for e in read_records(RunDir(run_dir), "events") if e["event"] == "start"]
    assert starts == [(0, False), (PREEMPT_AT + 1, True)]

    # Every sample of the 12 global batches exactly once: each data step read once, whole.
    assert reads == [(step, 0, 8) for step in range(12)]

    elastic = losses(run_dir)
    assert [s for s, _ in elastic] == list(range(1, 13))
    reads.clear()  # the reference runs are not preempted again (PREEMPT_AT was read)
    reads.append((PREEMPT_AT, 0, 8))
    on_a = uninterrupted(ON_A, tmp_path / "a")
    on_b = uninterrupted(ON_B, tmp_path / "b")
    before, after = elastic[: PREEMPT_AT + 1], elastic[PREEMPT_AT + 1 :]
    assert all(loss == on_a[step] for step, loss in before)  # same mesh: bit for bit
    resumed = np.array([loss for _, loss in after])
    original = np.array([on_a[step] for step, _ in after])
    np.testing.assert_allclose(resumed, original, rtol=LOSS_RTOL, atol=0)
    # The elastic run is as close to the original as a whole run on the new mesh is.
    mesh_effect = np.abs(np.array([on_b[step] for step, _ in after]) - original)
    assert np.all(np.abs(resumed - original) <= mesh_effect + LOSS_RTOL * np.abs(original))
    print("max relative difference after the resume:", float(np.max(np.abs(resumed - original) / original)))
    print("max relative difference of a whole run on the new mesh:", float(np.max(mesh_effect / original)))

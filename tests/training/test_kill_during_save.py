"""A trainer killed while an asynchronous checkpoint save is in flight resumes from
the previous finalized step, and the run ends bit-identical to an uninterrupted one.

The trainer runs in a subprocess (``python -m`` style, one process, 8 CPU devices, async
checkpointing on) whose Orbax finalization of step ``IN_FLIGHT`` is held: every array of the
step is written, but the step is not committed (no rename of the temporary directory on a
local path; no ``commit_success.txt`` on ``gs://``: https://orbax.readthedocs.io/en/latest/
api_reference/checkpoint.path.atomicity.html). The held finalization writes a flag file; the
test SIGKILLs the process when it appears, so the kill lands inside the save, every time.
Nothing in the trainer knows about the hold: it is patched into the subprocess's Orbax only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import pytest

from training import train
from training.cluster import ClusterIdentity
from training.config import TrainConfig
from training.metrics.run_log import read_records
from training.run_dir import RunDir

IN_FLIGHT = 8  # the save that is killed; the previous finalized one is step 4

CONFIG = TrainConfig.model_validate(
    {
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
        "sequence_length": 32,
        "global_batch_size": 8,
        "steps": 12,
        "optimizer": {"warmup_steps": 2},
        "checkpoint": {"interval_steps": 4, "keep": 3, "async_save": True},
        "log_every_steps": 1,
        "data": {"source": str(Path(sysconfig.get_paths()["stdlib"]) / "json" / "*.py")},
        "parallelism": {"ici": {"data": 2, "fsdp": 2, "tensor": 2}},
    }
)

#: The subprocess: hold Orbax's finalization of step argv[3] (flag file argv[4]) and train.
HELD_TRAINER = """
import asyncio, pathlib, sys
from orbax.checkpoint._src.path import atomicity
from training import train
from training.cluster import ClusterIdentity
from training.config import TrainConfig

config, run_dir, held_step, flag = TrainConfig.model_validate_json(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
for cls in (atomicity.AtomicRenameTemporaryPath, atomicity.CommitFileTemporaryPath):
    real = cls.finalize
    async def finalize(self, real=real):
        if self._final_path.name == held_step:
            pathlib.Path(flag).write_text(str(self.get()))
            await asyncio.sleep(3600)  # until SIGKILL
        return await real(self)
    cls.finalize = finalize
sys.exit(train.main(config, run_dir, ClusterIdentity.single_process()))
"""


def losses(run_dir: str) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_records(RunDir(run_dir), "metrics") if "loss" in r]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[int, float]:
    run_dir = str(tmp_path_factory.mktemp("uninterrupted") / "run")
    assert train.run(CONFIG, run_dir, ClusterIdentity.single_process()).exit_code == train.EXIT_COMPLETE
    return dict(losses(run_dir))


def kill_during_save(run_dir: str, flag: Path, timeout_s: float = 600) -> str:
    """Run the held trainer until its save of ``IN_FLIGHT`` is in flight, SIGKILL it; the
    temporary path of the held save."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "8"}
    proc = subprocess.Popen(
        [sys.executable, "-c", HELD_TRAINER, CONFIG.model_dump_json(), run_dir, str(IN_FLIGHT), str(flag)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while not flag.exists():
            assert proc.poll() is None, (
                f"the trainer exited ({proc.returncode}) before the save:\n{proc.stderr.read()[-3000:]}"
            )
            assert time.monotonic() < deadline, "the held save never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    return flag.read_text()


def run_dir_for(kind: str, tmp_path: Path, request) -> str:
    if kind == "local":
        return str(tmp_path / "run")
    bucket = request.getfixturevalue("bucket")  # the session's emulated Cloud Storage
    return f"gs://{bucket}/runs/{uuid.uuid4().hex[:8]}"


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["local", "gs"])
def test_a_kill_during_an_async_save_resumes_from_the_previous_finalized_step(kind, uninterrupted, tmp_path, request):
    run_dir = run_dir_for(kind, tmp_path, request)
    held = kill_during_save(run_dir, tmp_path / "save-in-flight")
    run = RunDir(run_dir)
    assert run.read("COMPLETE") is None
    # The step-8 save was killed after its arrays were written, before its commit.
    assert run.list(f"checkpoints/{Path(held).name}/*"), held
    before = losses(run_dir)
    assert max(s for s, _ in before) >= IN_FLIGHT

    result = train.run(CONFIG, run_dir, ClusterIdentity.single_process())
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    starts = [e for e in read_records(run, "events") if e["event"] == "start"]
    assert [(e["step"], e["restored"]) for e in starts] == [(0, False), (IN_FLIGHT - 4, True)]
    after = losses(run_dir)[len(before) :]
    assert [s for s, _ in after] == list(range(IN_FLIGHT - 4 + 1, 13))
    assert all(loss == uninterrupted[step] for step, loss in before + after)  # bit for bit
    assert result.loss == uninterrupted[12]
    # The re-saved step 8 and the later ones are finalized and restorable; nothing of the
    # killed attempt's save is mistaken for a checkpoint.
    from training.checkpoint import manager as checkpointing

    manager = checkpointing.make_manager(run, CONFIG)
    assert sorted(manager.all_steps()) == [4, 8, 12]
    manager.close()

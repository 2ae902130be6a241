"""One-process runs of the trainer (8 CPU devices): their config and cluster identity, and the
losses a run recorded."""

from __future__ import annotations

from pathlib import Path

from training.cluster import ClusterIdentity
from training.config import TrainConfig
from training.metrics.run_log import read_records
from training.run_dir import RunDir

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
        "peak_flops_per_chip": 275e12,  # TPU v4's (the devices here are CPUs: a tiny MFU)
    }
)
SINGLE = ClusterIdentity.single_process()


def losses(run_dir: str | Path) -> list[tuple[int, float]]:
    """(step, loss) of every training record of the run, in the order written."""
    return [(r["step"], r["loss"]) for r in read_records(RunDir(str(run_dir)), "metrics") if "loss" in r]

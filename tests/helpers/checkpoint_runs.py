"""Runs of the trainer whose checkpoints the tests damage: a 12-step config over a given corpus
(a checkpoint every 4 steps, saved synchronously) and the checkpoints a run left."""

from __future__ import annotations

from pathlib import Path

from training.config import TrainConfig

STEPS = 12


def config(corpus: str) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
            "sequence_length": 32,
            "global_batch_size": 8,
            "steps": STEPS,
            "optimizer": {"warmup_steps": 2},
            "checkpoint": {"interval_steps": 4, "keep": 3, "async_save": False},
            "log_every_steps": 1,
            "parallelism": {"ici": {"data": 2, "fsdp": 2, "tensor": 2}},
            "data": {"source": corpus},
        }
    )


def names(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())

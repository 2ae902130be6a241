"""The tiny model of the train-step tests: one layer over the 8 CPU devices (data 2 x fsdp 2 x
tensor 2), a constant learning rate."""

from __future__ import annotations

from training.config import TrainConfig

CONFIG = TrainConfig.model_validate(
    {
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
        "sequence_length": 16,
        "global_batch_size": 8,
        "steps": 20,
        "optimizer": {"warmup_steps": 0, "schedule": "constant"},
        "parallelism": {"ici": {"data": 2, "fsdp": 2, "tensor": 2}},
    }
)

"""Stacks for the planner tests: the shipped stack files and a small valid stack factory."""

from __future__ import annotations

from pathlib import Path

from infra import accelerators
from infra.config import StackConfig, validate_stack

STACKS = Path(__file__).resolve().parents[2] / "stacks"
V4 = accelerators.GENERATIONS["v4"]


def stack(accelerator: str = "v4-8", slices: int = 2, training: dict | None = None) -> StackConfig:
    """A valid stack map around ``training`` (defaults: small model, seq 1024, ici fsdp = chips,
    dcn data = slices), validated like a stack file."""
    chips = accelerators.parse_accelerator_type(accelerator).chips
    train = {
        "model": {"d_model": 256, "n_layers": 2, "n_heads": 4},
        "sequence_length": 1024,
        "global_batch_size": 8 * slices,
        "parallelism": {"ici": {"fsdp": chips}, "dcn": {"data": slices}},
    }
    for key, value in (training or {}).items():
        train[key] = value
    return validate_stack(
        "t",
        {
            "gcp:project": "acme-ml-test",
            "gcp:zone": "us-central2-b",
            "multislice:acceleratorType": accelerator,
            "multislice:slices": slices,
            "multislice:training": train,
        },
        "test",
    )

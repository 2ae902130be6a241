"""The gke backend's tests' stack: the dev stack on gke, v4-16 (2 Pods a slice) × 2 slices, spot."""

from __future__ import annotations

import pytest

from infra.config import validate_stack
from tests.fakes.pulumi_program import stack_map


@pytest.fixture
def config():
    training = stack_map("dev")["multislice:training"] | {
        "parallelism": {"ici": {"data": 1, "fsdp": 8, "tensor": 1}, "dcn": {"data": 2, "fsdp": 1, "tensor": 1}},
        "global_batch_size": 32,
    }
    values = stack_map("dev") | {
        "multislice:backend": "gke",
        "multislice:acceleratorType": "v4-16",
        "multislice:capacity": "spot",
        "multislice:training": training,
    }
    return validate_stack("dev", values, "test")

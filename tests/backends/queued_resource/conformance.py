"""The queued-resource backend's part of tests/backends/test_conformance.py: a stack of 2 slices of
2 VMs (v4-16), spot, and where the program declares a slice's VMs' metadata."""

from __future__ import annotations

from typing import Any

from tests.fakes.pulumi_program import stack_map

STACK: dict[str, Any] = {
    **stack_map("dev"),
    "multislice:acceleratorType": "v4-16",
    "multislice:training": {
        **stack_map("dev")["multislice:training"],
        "parallelism": {"ici": {"data": 1, "fsdp": 8, "tensor": 1}, "dcn": {"data": 2, "fsdp": 1, "tensor": 1}},
        "global_batch_size": 32,
    },
}


def declared(world: Any, config: Any, slice_id: int) -> dict[str, Any]:
    """Every slice's VMs get the queued resource's node metadata."""
    return world.one("pulumi-python:dynamic/tpu:QueuedResource").inputs["metadata"]

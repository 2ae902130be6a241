"""The compute-engine backend's part of tests/backends/test_conformance.py: a stack of 2 slices of
2 VMs (v5p-16), spot, and where the program declares a slice's VMs' metadata."""

from __future__ import annotations

from typing import Any

from tests.helpers.compute_engine import ce_map

STACK: dict[str, Any] = ce_map("v5p-16", slices=2, capacity="spot")


def declared(world: Any, config: Any, slice_id: int) -> dict[str, Any]:
    """The instance template's metadata, and the slice's group's (found by name: the mocks record
    registrations in whatever order the program's outputs resolve)."""
    return world.one("gcp:compute/instanceTemplate:InstanceTemplate").inputs["metadata"] | next(
        group.inputs["allInstancesConfig"]["metadata"]
        for group in world.of("gcp:compute/instanceGroupManager:InstanceGroupManager")
        if group.inputs["name"] == config.node_ids[slice_id]
    )

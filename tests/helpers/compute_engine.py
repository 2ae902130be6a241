"""Compute-engine stacks for the tests: the dev stack's file with a v5p or v6e accelerator.

The shapes are written out by hand from Google's tables (v5p-16: 8 chips, 4 per VM, topology
2x2x2; v6e-16: 16 chips, 4 per VM, 4x4; v6e-8: one 8-chip VM, 2x4), not derived from the code
under test.
"""

from __future__ import annotations

import copy
from typing import Any

from infra import vm_contract as contract
from tests.fakes.pulumi_program import stack_map

TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
GROUP = "gcp:compute/instanceGroupManager:InstanceGroupManager"
POLICY = "gcp:compute/resourcePolicy:ResourcePolicy"
COMPONENT = "multislice:compute:Slices"
IMAGE = "projects/ubuntu-os-accelerator-images/global/images/family/ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"

#: accelerator -> (zone, chips per slice, VMs per slice, topology, machine type)
SHAPES = {
    "v5p-16": ("us-east5-a", 8, 2, "2x2x2", "ct5p-hightpu-4t"),
    "v6e-16": ("us-east5-b", 16, 4, "4x4", "ct6e-standard-4t"),
    "v6e-8": ("us-east5-b", 8, 1, "2x4", "ct6e-standard-8t"),
    # Google's tpu-operator test group: nodeCount 2, topology 2x2x2, tpu7x-standard-4t.
    "tpu7x-16": ("us-central1-c", 8, 2, "2x2x2", "tpu7x-standard-4t"),
}


def ce_map(accelerator: str = "v5p-16", *, slices: int = 2, capacity: str = "spot", **extra: Any) -> dict[str, Any]:
    """The dev stack's file on the compute-engine backend with ``accelerator``."""
    zone, chips, _, _, _ = SHAPES[accelerator]
    config = copy.deepcopy(stack_map("dev"))
    config.update(
        {
            "gcp:zone": zone,
            "multislice:acceleratorType": accelerator,
            "multislice:slices": slices,
            "multislice:backend": "compute-engine",
            "multislice:capacity": capacity,
        }
    )
    config["multislice:training"]["parallelism"] = {
        "ici": {"data": 1, "fsdp": chips, "tensor": 1},
        "dcn": {"data": slices, "fsdp": 1, "tensor": 1},
    }
    config["multislice:training"]["global_batch_size"] = 2 * chips * slices  # divisible by the data-parallel size
    config.update(copy.deepcopy(extra))  # a caller may change what it gets back; never its arguments
    return config


def on_cpu(metadata: dict[str, str]) -> dict[str, str]:
    """The program's metadata as an emulated VM gets it: the TPU environment without
    ``JAX_PLATFORMS=tpu`` (its devices are CPUs: infra/backends/compute_engine/tpu_env.py, ``on_tpu``)."""
    key = contract.COMPUTE_ENGINE_TPU_ENV_KEY
    if key not in metadata:
        return metadata
    return metadata | {key: metadata[key].replace(" JAX_PLATFORMS=tpu", "")}

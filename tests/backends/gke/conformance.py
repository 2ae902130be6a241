"""The gke backend's part of tests/backends/test_conformance.py: a stack of 2 slices of 2 Pods
(v4-16), spot, and what the program declares of a Pod's: the ConfigMap's script its container runs,
and its ``MULTISLICE_RUN_DIR``."""

from __future__ import annotations

from typing import Any

from infra import vm_contract as contract
from tests.fakes.pulumi_program import stack_map

STACK: dict[str, Any] = {
    **stack_map("dev"),
    "multislice:backend": "gke",
    "multislice:acceleratorType": "v4-16",
    "multislice:capacity": "spot",
    "multislice:training": {
        **stack_map("dev")["multislice:training"],
        "parallelism": {"ici": {"data": 1, "fsdp": 8, "tensor": 1}, "dcn": {"data": 2, "fsdp": 1, "tensor": 1}},
        "global_batch_size": 32,
    },
}


def declared(world: Any, config: Any, slice_id: int) -> dict[str, Any]:
    """The startup script the Pods' ConfigMap holds and the run directory of their environment."""
    pod = world.one("kubernetes:jobset.x-k8s.io/v1alpha2:JobSet").inputs["spec"]["replicatedJobs"][0]["template"]
    env = pod["spec"]["template"]["spec"]["containers"][0]["env"]
    return {
        contract.STARTUP_SCRIPT_KEY: world.one("kubernetes:core/v1:ConfigMap").inputs["data"]["startup.sh"],
        contract.RUN_DIR_KEY: next(entry["value"] for entry in env if entry["name"] == contract.RUN_DIR_ENV),
    }

"""A ``multislice:backend: compute-engine`` stack for the operator commands' tests: the tests'
emu stack as 2 slices of v5p-16 (8 chips, 4 per ``ct5p-hightpu-4t`` VM, so 2 VMs per slice) in
``us-east5-a``, which Compute Engine offers v5p in (docs/compute-engine.md section 1), and the
``list-instances --format=json`` answers of its groups (``ManagedInstance`` fields)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
#: The groups: ``StackConfig.node_ids`` of stack ``ceops``.
GROUPS = ("multislice-ceops-0", "multislice-ceops-1")
#: Names as a MIG makes them (base name + suffix), listed out of order on purpose.
NAMES = {
    "multislice-ceops-0": ["multislice-ceops-0-zq7w", "multislice-ceops-0-b2kx"],
    "multislice-ceops-1": ["multislice-ceops-1-m4dd", "multislice-ceops-1-c9aa"],
}


def stack_file(tmp_path: Path, *, iap_ssh: bool = True, bucket: str | None = None) -> Path:
    """``tmp_path/Pulumi.ceops.yaml``."""
    data = yaml.safe_load((ROOT / "tests" / "stacks" / "Pulumi.emu.yaml").read_text())
    config = data["config"]
    config["gcp:zone"] = "us-east5-a"
    config["multislice:backend"] = "compute-engine"
    config["multislice:acceleratorType"] = "v5p-16"
    config["multislice:training"]["parallelism"]["ici"]["fsdp"] = 8
    config["multislice:training"]["global_batch_size"] = 16
    if iap_ssh:
        config["multislice:network"] = {"iapSsh": True}
    if bucket:
        config["multislice:bucket"] = {"name": bucket}
    path = tmp_path / "Pulumi.ceops.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def listed(group: str, status: str = "RUNNING", action: str = "NONE") -> list[dict]:
    """``list-instances --format=json`` of a group: every VM in ``status`` with ``action``."""
    return [
        {
            "name": name,
            "instance": f"https://www.googleapis.com/compute/v1/projects/multislice-tests/zones/us-east5-a/instances/{name}",
            "instanceStatus": status,
            "currentAction": action,
            "id": str(1000 + i),
        }
        for i, name in enumerate(NAMES[group])
    ]

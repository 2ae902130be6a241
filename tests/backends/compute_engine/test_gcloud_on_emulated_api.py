"""The installed gcloud, an independent client, against the emulated Compute API
(infra.backends.compute_engine.emulated_api): the commands the product runs and docs/compute-engine.md
shows for a compute-engine stack's groups (list-instances, describe, resize; instances describe) work
and print the VMs by name. Skipped, with the reason, where gcloud is not installed."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from infra.backends.compute_engine.emulated_api import ComputeApi

ZONE = "us-central2-b"
GCLOUD = shutil.which("gcloud")
pytestmark = pytest.mark.skipif(GCLOUD is None, reason="gcloud is not installed on this machine")


def gcloud(api: ComputeApi, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """gcloud with its configuration in ``home``, the Compute API overridden to ``api`` and any token."""
    token = home / "token"
    token.write_text("emulated")
    env = {
        "PATH": str(Path(GCLOUD or "gcloud").parent),
        "HOME": str(home),
        "CLOUDSDK_CONFIG": str(home / "gcloud"),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_COMPUTE": f"{api.endpoint}/compute/v1/",
        "CLOUDSDK_AUTH_ACCESS_TOKEN_FILE": str(token),
        "CLOUDSDK_CORE_PROJECT": "p1",
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    }
    return subprocess.run([GCLOUD or "gcloud", *args], env=env, capture_output=True, text=True, timeout=120)


def test_gcloud_lists_describes_and_resizes_the_groups_by_name(tmp_path):
    with ComputeApi("p1", ZONE) as api:
        api.add_group("g")
        api.add_vm("g", "g-aaaa", "10.0.0.1")
        api.add_vm("g", "g-bbbb", None, "CREATING")  # not created yet: listed by name all the same
        listed = gcloud(api, tmp_path, "compute", "instance-groups", "managed", "list-instances", "g", "--zone", ZONE,
                        "--format=json")  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        assert [(vm["name"], vm["currentAction"]) for vm in json.loads(listed.stdout)] == [
            ("g-aaaa", "NONE"),
            ("g-bbbb", "CREATING"),
        ]
        described = gcloud(api, tmp_path, "compute", "instance-groups", "managed", "describe", "g", "--zone", ZONE,
                           "--format=json")  # fmt: skip
        assert described.returncode == 0, described.stderr
        assert (json.loads(described.stdout)["name"], json.loads(described.stdout)["targetSize"]) == ("g", 2)
        vm = gcloud(api, tmp_path, "compute", "instances", "describe", "g-aaaa", "--zone", ZONE, "--format=json")
        assert vm.returncode == 0, vm.stderr
        assert json.loads(vm.stdout)["networkInterfaces"][0]["networkIP"] == "10.0.0.1"
        resized = gcloud(api, tmp_path, "compute", "instance-groups", "managed", "resize", "g", "--size", "0",
                         "--zone", ZONE, "--format=json")  # fmt: skip
        assert resized.returncode == 0, resized.stderr
        after = gcloud(api, tmp_path, "compute", "instance-groups", "managed", "list-instances", "g", "--zone", ZONE,
                       "--format=json")  # fmt: skip
        assert after.returncode == 0 and json.loads(after.stdout) == [], after.stderr

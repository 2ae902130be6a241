"""infra/local/vm_site/sitecustomize.py: in an emulated VM, JAX's own cluster detection (what
``jax.distributed.initialize()`` without arguments runs) finds the job from the VM's metadata
server, as GceTpuCluster does on a TPU VM; elsewhere it changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from infra.config import load_stack_file
from infra.local import topology
from infra.local.metadata import MetadataServer

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu-command.yaml"

DETECT = """
import json
from jax._src import clusters
from jax._src.clusters import cloud_tpu_cluster  # noqa: F401 (jax.distributed imports it too)
found = clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 10)
print(json.dumps(list(found)))
"""


def detect(env: dict[str, str]) -> list:
    result = subprocess.run([sys.executable, "-c", DETECT], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_emulated_job_is_detected_through_the_metadata_server():
    config = load_stack_file(STACK)  # 2 slices × 1 worker of v4-8
    attributes = topology.vm_metadata(config, 1, 0, startup_script="", run_dir=config.run_dir)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "MULTISLICE_", "GCE_", "TPU_"))}
    with MetadataServer(attributes) as server:
        env = {
            **base,
            "PYTHONPATH": str(topology.VM_SITE_DIR),
            topology.EMULATED_TPU_ENV: "1",
            "JAX_COORDINATOR_PORT": "12345",
            "GCE_METADATA_IP": server.address,
            "JAX_PLATFORMS": "cpu",
        }
        # Slice 1's only worker: process 1 of 2; the coordinator is the MEGASCALE host, on the port given.
        assert detect(env) == ["127.0.0.1:12345", 2, 1, None]
        # Outside an emulated VM nothing is detected (JAX's own environments only).
        assert detect({**env, topology.EMULATED_TPU_ENV: ""}) == [None, None, None, None]

"""The gke backend's slices inputs for the tests: the dev stack's project in us-east5-a, v5p-16
slices (2 VMs of 4 chips in 2x2x2: Google's v5p table) on Spot capacity, a new cluster."""

from __future__ import annotations

import dataclasses
from typing import Any

from infra.accelerators import parse_accelerator_type
from infra.backends.gke.cluster import GkeSettings
from infra.backends.gke.node_pools import slice_node_pool
from infra.backends.gke.slices import GkeInputs
from tests.fakes.pulumi_program import stack_map

EMAIL = "multislice-dev@acme-ml-dev.iam.gserviceaccount.com"


def gke_inputs(slices: int = 2, accelerator: str = "v5p-16", **changes: Any) -> GkeInputs:
    """The inputs, with ``changes`` (GkeInputs' fields) applied."""
    made = GkeInputs(
        stack="dev",
        project="acme-ml-dev",
        zone="us-east5-a",
        cluster_name="multislice-dev",
        pool_names=tuple(f"multislice-dev-{i}" for i in range(slices)),
        shape=slice_node_pool(parse_accelerator_type(accelerator)),
        capacity="spot",
        settings=GkeSettings(),
        network="projects/acme-ml-dev/global/networks/multislice-dev",
        subnetwork="projects/acme-ml-dev/regions/us-east5/subnetworks/multislice-dev",
        service_account_email=EMAIL,
        service_account_id=f"projects/acme-ml-dev/serviceAccounts/{EMAIL}",
        kubernetes_service_account="multislice-dev",
        labels={"multislice-stack": "dev"},
        generation=parse_accelerator_type(accelerator).generation.name,
    )
    return dataclasses.replace(made, **changes)


def gke_map(slices: int, capacity: str, accelerator: str = "v4-16", **extra) -> dict:
    """The dev stack on gke: ``slices`` slices of ``accelerator`` (v4-16: 2 VMs of 4 chips), ``capacity``."""
    training = stack_map("dev")["multislice:training"] | {
        "parallelism": {"ici": {"data": 1, "fsdp": 8, "tensor": 1}, "dcn": {"data": slices, "fsdp": 1, "tensor": 1}},
        "global_batch_size": 16 * slices,
    }
    return stack_map("dev") | {
        "multislice:backend": "gke",
        "multislice:acceleratorType": accelerator,
        "multislice:slices": slices,
        "multislice:capacity": capacity,
        "multislice:training": training,
        **extra,
    }

"""The gke backend's policies (infra.policy.gke) on the resources GkeSlices declares under Pulumi's
mocks: they pass as declared, and each rule fails when its input is changed."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from infra.accelerators import parse_accelerator_type
from infra.backends.gke.cluster import GkeSettings
from infra.backends.gke.node_pools import slice_node_pool
from infra.backends.gke.slices import GkeInputs, GkeSlices
from infra.policy.resource_types import GKE_CLUSTER_TYPE, GKE_NODE_POOL_TYPE
from infra.review.program_mocks import declare
from tests.helpers.policies import BY_NAME, violations

GKE = ("gke-private-nodes", "gke-workload-identity", "gke-node-service-account")
EMAIL = "multislice-dev@acme-ml-dev.iam.gserviceaccount.com"


@pytest.fixture(scope="module")
def declared() -> dict[str, dict]:
    inputs = GkeInputs(
        stack="dev",
        project="acme-ml-dev",
        zone="us-east5-a",
        cluster_name="multislice-dev",
        pool_names=("multislice-dev-0",),
        shape=slice_node_pool(parse_accelerator_type("v5p-16")),
        capacity="spot",
        settings=GkeSettings(),
        network="net",
        subnetwork="subnet",
        service_account_email=EMAIL,
        service_account_id=f"projects/acme-ml-dev/serviceAccounts/{EMAIL}",
        kubernetes_service_account="multislice-dev",
    )
    world = declare(lambda: GkeSlices("slices", dataclasses.replace(inputs)))
    return {
        GKE_CLUSTER_TYPE: world.one(GKE_CLUSTER_TYPE).inputs,
        GKE_NODE_POOL_TYPE: world.one(GKE_NODE_POOL_TYPE).inputs,
    }


def test_the_gke_policies_are_mandatory_and_pass_what_the_backend_declares(declared):
    for name in GKE:
        assert BY_NAME[name].enforcement_level.value == "mandatory"
        for typ, props in declared.items():
            assert violations(name, typ, props) == [], (name, typ)


def without(props: dict, path: str) -> dict:
    """``props`` with the input at dotted ``path`` removed."""
    out = copy.deepcopy(props)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node[key]
    del node[last]
    return out


@pytest.mark.parametrize(
    ("policy", "typ", "path", "said"),
    [
        (
            "gke-private-nodes",
            GKE_CLUSTER_TYPE,
            "privateClusterConfig.enablePrivateNodes",
            "enablePrivateNodes must be",
        ),
        ("gke-private-nodes", GKE_CLUSTER_TYPE, "privateClusterConfig.enablePrivateEndpoint", "no public IP endpoint"),
        ("gke-workload-identity", GKE_CLUSTER_TYPE, "workloadIdentityConfig", "workloadPool must be"),
        ("gke-workload-identity", GKE_NODE_POOL_TYPE, "nodeConfig.workloadMetadataConfig", "must be 'GKE_METADATA'"),
        ("gke-node-service-account", GKE_NODE_POOL_TYPE, "nodeConfig.serviceAccount", "names no service account"),
    ],
)
def test_each_rule_fails_without_its_input(declared, policy, typ, path, said):
    found = violations(policy, typ, without(declared[typ], path))
    assert len(found) == 1 and said in found[0], found


def test_a_cluster_without_private_config_fails_both_ways(declared):
    found = violations(
        "gke-private-nodes", GKE_CLUSTER_TYPE, without(declared[GKE_CLUSTER_TYPE], "privateClusterConfig")
    )
    assert len(found) == 2 and "enablePrivateNodes" in found[0] and "enablePrivateEndpoint" in found[1], found


def test_the_default_compute_service_account_is_refused(declared):
    pool = copy.deepcopy(declared[GKE_NODE_POOL_TYPE])
    pool["nodeConfig"]["serviceAccount"] = "123456789-compute@developer.gserviceaccount.com"
    (found,) = violations("gke-node-service-account", GKE_NODE_POOL_TYPE, pool)
    assert "Compute Engine default service account 123456789-compute@" in found

"""The gke backend's policies (infra.policy.gke) on the resources GkeSlices and GkeWorkload declare
under Pulumi's mocks: they pass as declared, and each rule fails when its input is changed."""

from __future__ import annotations

import copy

import pytest

from infra.backends.gke.cluster import GkeSettings
from infra.backends.gke.jobset import jobset
from infra.backends.gke.slices import GkeSlices
from infra.backends.gke.workload import GkeWorkload, WorkloadInputs
from infra.policy.resource_types import GKE_CLUSTER_TYPE, GKE_NODE_POOL_TYPE, JOBSET_TYPE, K8S_SERVICE_ACCOUNT_TYPE
from infra.review.program_mocks import declare
from tests.helpers.gke import EMAIL, gke_inputs
from tests.helpers.policies import BY_NAME, violations

GKE = ("gke-private-nodes", "gke-workload-identity", "gke-node-service-account", "gke-pod-service-account")


def _both() -> None:
    slices = gke_inputs(slices=1)
    GkeSlices("slices", slices)
    spec = jobset(
        name="dev",
        namespace="default",
        shape=slices.shape,
        slices=1,
        image="python:3.11-slim",
        startup_config_map="dev-startup-0123456789ab",
        run_dir="gs://acme-ml-dev-checkpoints/runs/dev",
        env={},
        service_account=slices.kubernetes_service_account,
        max_restarts=3,
    )
    inputs = WorkloadInputs(
        project=slices.project,
        cluster_name=slices.cluster_name,
        location=slices.zone,
        dns_endpoint="gke-x.us-east5-a.gke.goog",
        settings=GkeSettings(),
        kubernetes_service_account=slices.kubernetes_service_account,
        google_service_account_email=EMAIL,
        jobset=spec,
        startup_script="#!/bin/bash\n",
        release_id="0123456789ab" + "0" * 52,
    )
    GkeWorkload("workload", inputs)


@pytest.fixture(scope="module")
def declared() -> dict[str, dict]:
    world = declare(_both)
    found = {typ: world.one(typ).inputs for typ in (GKE_CLUSTER_TYPE, K8S_SERVICE_ACCOUNT_TYPE, JOBSET_TYPE)}
    pools = {pool.name: pool.inputs for pool in world.of(GKE_NODE_POOL_TYPE)}
    assert sorted(pools) == ["multislice-dev-0", "system"]
    return found | {GKE_NODE_POOL_TYPE: pools["multislice-dev-0"], f"{GKE_NODE_POOL_TYPE}#system": pools["system"]}


def test_the_gke_policies_are_mandatory_and_pass_what_the_backend_declares(declared):
    for name in GKE:
        assert BY_NAME[name].enforcement_level.value == "mandatory"
        for typ, props in declared.items():  # the system pool too (its key: the type, then #system)
            assert violations(name, typ.split("#")[0], props) == [], (name, typ)


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


def test_the_pods_default_kubernetes_service_account_is_refused(declared):
    run = copy.deepcopy(declared[JOBSET_TYPE])
    pod = run["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["serviceAccountName"] = "default"
    (found,) = violations("gke-pod-service-account", JOBSET_TYPE, run)
    assert "replicated job 'slice' runs its Pods as 'default'" in found
    del pod["serviceAccountName"]
    (found,) = violations("gke-pod-service-account", JOBSET_TYPE, run)
    assert "as 'the default' Kubernetes service account" in found


def test_a_kubernetes_service_account_bound_to_the_default_compute_account_is_refused(declared):
    account = copy.deepcopy(declared[K8S_SERVICE_ACCOUNT_TYPE])
    account["metadata"]["annotations"]["iam.gke.io/gcp-service-account"] = "42-compute@developer.gserviceaccount.com"
    (found,) = violations("gke-pod-service-account", K8S_SERVICE_ACCOUNT_TYPE, account)
    assert "(iam.gke.io/gcp-service-account) runs as the Compute Engine default service account 42-compute@" in found


def test_the_cluster_and_the_pools_nodes_carry_the_cost_labels(declared):
    cost = {"multislice-stack": "dev", "env": "dev", "owner": "ml", "cost-center": "cc-1"}
    cluster, pool = declared[GKE_CLUSTER_TYPE], declared[GKE_NODE_POOL_TYPE]
    assert cluster["resourceLabels"] == pool["nodeConfig"]["resourceLabels"] == {"multislice-stack": "dev"}
    for typ, props in ((GKE_CLUSTER_TYPE, cluster), (GKE_NODE_POOL_TYPE, pool)):
        (found,) = violations("required-labels", typ, props)
        assert "lacks the label(s) env, owner, cost-center" in found
    labelled = copy.deepcopy(pool)
    labelled["nodeConfig"]["resourceLabels"] = cost
    assert violations("required-labels", GKE_NODE_POOL_TYPE, labelled) == []
    assert violations("required-labels", GKE_CLUSTER_TYPE, {**cluster, "resourceLabels": cost}) == []


def test_a_prod_pool_of_spot_vms_needs_protection(declared):
    pool = copy.deepcopy(declared[GKE_NODE_POOL_TYPE])
    assert pool["nodeConfig"]["spot"] is True
    assert violations("prod-capacity", GKE_NODE_POOL_TYPE, pool) == []  # dev: not prod
    pool["nodeConfig"]["resourceLabels"] = {"multislice-stack": "prod"}
    (found,) = violations("prod-capacity", GKE_NODE_POOL_TYPE, pool)
    assert "prod node pool 'r' makes Spot VMs and is not protected" in found
    assert violations("prod-capacity", GKE_NODE_POOL_TYPE, pool, protect=True) == []
    del pool["nodeConfig"]["spot"]  # on-demand, reserved or flex-start nodes
    assert violations("prod-capacity", GKE_NODE_POOL_TYPE, pool) == []


def test_a_prod_cluster_needs_deletion_protection(declared):
    cluster = copy.deepcopy(declared[GKE_CLUSTER_TYPE])
    assert cluster["deletionProtection"] is False  # sent explicitly (pulumi-gcp's default is true)
    assert violations("gke-deletion-protection", GKE_CLUSTER_TYPE, cluster) == []  # dev: not prod
    cluster["resourceLabels"] = {"multislice-stack": "prod"}
    (found,) = violations("gke-deletion-protection", GKE_CLUSTER_TYPE, cluster)
    assert "has no deletion protection: set multislice:gke.deletionProtection: true" in found
    cluster["deletionProtection"] = True
    assert violations("gke-deletion-protection", GKE_CLUSTER_TYPE, cluster) == []

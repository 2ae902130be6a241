"""The gke backend's cluster settings and args (infra.backends.gke.cluster): the names GKE and
Kubernetes accept, an existing cluster outside the stack's region refused naming the key, a new
cluster private with Workload Identity, and every arg one pulumi-gcp's Cluster takes."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from pulumi_gcp.container import ClusterArgs, _inputs as container_inputs
from pydantic import ValidationError

from infra.backends.gke.cluster import (
    GkeSettings,
    check_cluster_location,
    workload_identity_member,
)
from infra.backends.gke.cluster_declaration import cluster_args


@pytest.mark.parametrize("name", ["a", "multislice-dev", "c1", "a" * 40])
def test_gke_cluster_names_pass(name):
    assert GkeSettings(cluster=name).cluster == name


@pytest.mark.parametrize(
    "name",
    # gcloud's rule: lowercase alphanumerics and '-', a letter first, an alphanumeric last, ≤ 40.
    ["Dev", "1dev", "dev-", "dev_cluster", "a" * 41, "", "dév"],
)
def test_other_cluster_names_are_refused_with_the_rule(name):
    with pytest.raises(ValidationError, match="is not a GKE cluster name: lowercase letters"):
        GkeSettings(cluster=name)


def test_namespace_and_control_plane_range_are_checked():
    assert GkeSettings(namespace="training", controlPlaneCidr="172.16.0.32/28").control_plane_cidr == "172.16.0.32/28"
    with pytest.raises(ValidationError, match="is not a Kubernetes namespace name"):
        GkeSettings(namespace="Training")
    for cidr, why in (
        ("172.16.0.0/24", "must be a private /28"),
        ("8.8.8.0/28", "must be a private /28"),
        ("x", "not an IPv4"),
    ):
        with pytest.raises(ValidationError, match=why):
            GkeSettings(controlPlaneCidr=cidr)
    assert GkeSettings(maxRunDuration="3d").max_run_duration == 3 * 86400
    with pytest.raises(ValidationError, match="longer than 7d"):
        GkeSettings(maxRunDuration="8d")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        GkeSettings.model_validate({"clusterName": "dev"})


def test_the_pods_image_is_one_reference_without_spaces_or_quotes():
    assert GkeSettings().image == "python:3.12-bookworm"
    named = "us-docker.pkg.dev/acme/ml/boot:2026-12@sha256:" + "0" * 64
    assert GkeSettings(image=named).image == named
    for bad in ("", "python 3", "python:3;rm", "'python'"):
        with pytest.raises(ValidationError, match="is not an image reference"):
            GkeSettings(image=bad)


@pytest.mark.parametrize("location", ["us-east5-a", "us-east5-b", "us-east5"])
def test_a_cluster_in_the_zone_s_region_can_take_its_pools(location):
    check_cluster_location(location, "us-east5-a")


@pytest.mark.parametrize(
    ("location", "said"),
    [("us-central1", "region us-central1"), ("europe-west4-a", "zone europe-west4-a (region europe-west4)")],
)
def test_a_cluster_in_another_region_is_refused_naming_the_key(location, said):
    with pytest.raises(ValueError) as raised:
        check_cluster_location(location, "us-east5-a")
    message = str(raised.value)
    assert message.startswith(f"multislice:gke.clusterLocation: the cluster is in {said}, ")
    assert "the stack's zone us-east5-a (gcp:zone) is in region us-east5" in message


def _fits(given: dict[str, Any], typed_dict: Any) -> bool:
    return (
        set(typed_dict.__required_keys__)
        <= set(given)
        <= set(typed_dict.__required_keys__ | typed_dict.__optional_keys__)
    )


def test_a_new_cluster_is_private_with_workload_identity_and_its_args_are_pulumi_gcp_s():
    args = cluster_args(
        name="multislice-dev",
        project="acme-ml-dev",
        zone="us-east5-a",
        network="net",
        subnetwork="subnet",
        labels={"stack": "dev"},
        control_plane_cidr="172.16.0.32/28",
    )
    assert set(args) <= set(inspect.signature(ClusterArgs.__init__).parameters)
    assert args["location"] == "us-east5-a" and args["networking_mode"] == "VPC_NATIVE"
    assert args["private_cluster_config"] == {
        "enable_private_nodes": True,
        "enable_private_endpoint": True,
        "master_ipv4_cidr_block": "172.16.0.32/28",
    }
    assert _fits(args["private_cluster_config"], container_inputs.ClusterPrivateClusterConfigArgsDict)
    assert args["workload_identity_config"] == {"workload_pool": "acme-ml-dev.svc.id.goog"}
    assert _fits(args["workload_identity_config"], container_inputs.ClusterWorkloadIdentityConfigArgsDict)
    endpoints = args["control_plane_endpoints_config"]
    assert _fits(endpoints, container_inputs.ClusterControlPlaneEndpointsConfigArgsDict)
    assert _fits(
        endpoints["dns_endpoint_config"], container_inputs.ClusterControlPlaneEndpointsConfigDnsEndpointConfigArgsDict
    )
    assert args["remove_default_node_pool"] is True and args["resource_labels"] == {"stack": "dev"}
    with pytest.raises(ValueError, match="is not a GKE cluster name"):
        cluster_args(name="Dev", project="p", zone="us-east5-a", network="n", subnetwork="s", labels={})


def test_without_a_control_plane_range_none_is_sent():
    args = cluster_args(name="c", project="p", zone="us-east5-a", network="n", subnetwork="s", labels={})
    assert "master_ipv4_cidr_block" not in args["private_cluster_config"]


def test_the_workload_identity_member_names_the_pool_namespace_and_service_account():
    assert workload_identity_member("acme-ml-dev", "training", "multislice-run") == (
        "serviceAccount:acme-ml-dev.svc.id.goog[training/multislice-run]"
    )

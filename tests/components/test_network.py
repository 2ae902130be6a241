"""The Network component's Shared VPC notice: when the TPU VMs join a subnetwork of another
project, `pulumi preview` says which grant the Cloud TPU service agent may need on it."""

from __future__ import annotations

import pytest

from infra.components.network import shared_vpc_notice
from infra.config.environment import NetworkSettings

HOST_NETWORK = "projects/acme-net-host/global/networks/shared"


def settings(**values) -> NetworkSettings:
    return NetworkSettings.model_validate(values)


@pytest.mark.parametrize(
    "values",
    [
        {},  # a network created in the stack's project
        {"existingNetwork": "vpc", "existingSubnetwork": "tpus", "nat": False},  # reused, same project
        {
            "existingNetwork": "projects/acme-ml-dev/global/networks/vpc",
            "existingSubnetwork": "tpus",
            "nat": False,
        },  # a path naming the stack's own project
    ],
)
def test_no_notice_unless_the_subnetwork_is_in_another_project(values):
    assert shared_vpc_notice("acme-ml-dev", settings(**values), "us-central2") is None


def test_a_host_subnetwork_names_the_grant_the_tpu_service_agent_may_need():
    notice = shared_vpc_notice(
        "acme-ml-dev",
        settings(existingNetwork=HOST_NETWORK, existingSubnetwork="tpus", nat=True),
        "us-central2",
    )
    assert notice is not None
    assert "projects/acme-net-host/regions/us-central2/subnetworks/tpus" in notice
    assert (
        "gcloud compute networks subnets add-iam-policy-binding tpus --project acme-net-host --region us-central2"
        in notice
    )
    assert "@gcp-sa-tpu.iam.gserviceaccount.com" in notice
    assert "gcloud projects describe acme-ml-dev --format='value(projectNumber)'" in notice
    assert "--role roles/compute.networkUser" in notice and "docs/deploying.md" in notice


def test_a_subnetwork_path_of_another_region_is_named_with_its_own_region():
    subnet = "projects/acme-net-host/regions/us-east5/subnetworks/tpus-east"
    notice = shared_vpc_notice(
        "acme-ml-dev", settings(existingNetwork=HOST_NETWORK, existingSubnetwork=subnet, nat=False), "us-east5"
    )
    assert notice is not None and "add-iam-policy-binding tpus-east --project acme-net-host --region us-east5" in notice


def test_iap_ssh_is_off_unless_the_stack_sets_it():
    assert settings().iap_ssh is False
    assert settings(iapSsh=True).iap_ssh is True


def test_a_stack_without_iap_ssh_gets_no_ssh_rule_and_one_with_it_gets_port_22_from_iap_only():
    from infra.components.network import IAP_SSH_RANGE, Network, NetworkArgs
    from infra.review.program_mocks import declare

    def firewall_rules(**values):
        world = declare(
            lambda: Network(
                "network",
                NetworkArgs(stack="qa", project="acme-ml-qa", region="us-central2", settings=settings(**values)),
            )
        )
        return [r.inputs for r in world.of("gcp:compute/firewall:Firewall")]

    assert [r["name"] for r in firewall_rules()] == ["multislice-qa-internal"]
    rules = {r["name"]: r for r in firewall_rules(iapSsh=True)}
    ssh = rules["multislice-qa-iap-ssh"]
    assert ssh["sourceRanges"] == [IAP_SSH_RANGE] == ["35.235.240.0/20"]
    assert ssh["allows"] == [{"protocol": "tcp", "ports": ["22"]}] and ssh["direction"] == "INGRESS"
    assert ssh["targetTags"] == ["multislice-qa-tpu"] and "sourceTags" not in ssh

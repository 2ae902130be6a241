"""The policy pack on the compute-engine backend's resources (infra/policy/, infra/backends/compute_engine/).

The passing template and groups are the ones the program declares for a v5p compute-engine
stack under mocks; each failing one changes exactly the property the policy is about.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.backends.change import CONFIRM_KEY
from infra.backends.compute_engine.inputs import GROUP_DESCRIPTION, REPLACES_QUEUED_RESOURCE
from infra.policy.evaluate import check_world
from infra.vm_contract import STARTUP_SCRIPT_KEY
from tests.fakes.pulumi_program import evaluate
from tests.helpers.compute_engine import GROUP, TEMPLATE, ce_map
from tests.helpers.policies import changed, stack_violations, violations

PROD_POLICY_CONFIG = json.loads((Path(__file__).resolve().parents[2] / "stacks" / "policy.prod.json").read_text())


@pytest.fixture(scope="module")
def world():
    return evaluate("dev", ce_map("v5p-16"))


@pytest.fixture(scope="module")
def template(world) -> dict[str, Any]:
    return dict(world.one(TEMPLATE).inputs)


@pytest.fixture(scope="module")
def group(world) -> dict[str, Any]:
    return dict(world.of(GROUP)[0].inputs)


def test_the_programs_compute_engine_stack_passes_every_mandatory_policy(world):
    found = check_world(world)
    assert [v for v in found if v.mandatory] == []
    # dev carries none of env/owner/cost-center: the template is named with the bucket, as advisories
    labels = {(v.resource or "").rsplit("::", 1)[-1] for v in found if v.policy == "required-labels"}
    assert {"checkpoints", "slices-template"} <= labels


def test_a_template_with_an_external_ip_fails_unless_the_stack_allows_it(template):
    assert violations("tpu-no-external-ips", TEMPLATE, template) == []
    (nic,) = template["networkInterfaces"]
    public = changed(template, networkInterfaces=[{**nic, "accessConfigs": [{"networkTier": "PREMIUM"}]}])
    found = violations("tpu-no-external-ips", TEMPLATE, public)
    assert len(found) == 1 and "external IPs" in found[0]
    assert violations("tpu-no-external-ips", TEMPLATE, public, config={"allowExternalIps": True}) == []


def test_a_template_runs_its_vms_as_the_dedicated_account(template):
    assert violations("tpu-dedicated-service-account", TEMPLATE, template) == []
    default = changed(template, serviceAccount={"email": "123-compute@developer.gserviceaccount.com", "scopes": []})
    assert "default service account" in violations("tpu-dedicated-service-account", TEMPLATE, default)[0]
    assert violations("tpu-dedicated-service-account", TEMPLATE, changed(template, serviceAccount=None))


def test_a_templates_startup_script_holds_no_credentials(template):
    assert violations("startup-script-safe", TEMPLATE, template) == []
    script = template["metadata"][STARTUP_SCRIPT_KEY] + "\nexport TOKEN=ya29.a0AfH6SMBx1234567890abcdefghijklmnop\n"
    leaky = changed(template, metadata={**template["metadata"], STARTUP_SCRIPT_KEY: script})
    assert violations("startup-script-safe", TEMPLATE, leaky)


def test_a_template_carries_the_cost_labels(template):
    labelled = changed(template, labels={**template["labels"], "env": "dev", "owner": "ml", "cost-center": "cc-1"})
    assert violations("required-labels", TEMPLATE, labelled) == []
    assert "owner, cost-center" in violations("required-labels", TEMPLATE, changed(labelled, labels={"env": "d"}))[0]


def test_a_prod_template_of_spot_vms_needs_protection(template):
    prod = {**template["labels"], "multislice-stack": "prod"}
    spot = changed(template, labels=prod)
    assert template["scheduling"]["provisioningModel"] == "SPOT"
    assert "Spot VMs" in violations("prod-capacity", TEMPLATE, spot)[0]
    assert violations("prod-capacity", TEMPLATE, spot, protect=True) == []
    for model in ("STANDARD", "FLEX_START"):
        assert violations("prod-capacity", TEMPLATE, changed(spot, scheduling={"provisioningModel": model})) == []
    assert violations("prod-capacity", TEMPLATE, template) == []  # dev: not prod


def test_a_group_that_replaces_the_queued_resource_is_flagged(group):
    assert group["description"] == GROUP_DESCRIPTION
    assert violations("backend-change", GROUP, group) == []
    found = violations("backend-change", GROUP, changed(group, description=REPLACES_QUEUED_RESOURCE))
    assert len(found) == 1 and "replaces the stack's queued resource" in found[0]


def test_a_confirmed_backend_change_is_advisory_by_default_and_mandatory_on_prod():
    outputs = {"backend": "queued-resource", "queuedResourceName": "projects/p/locations/z/queuedResources/q"}
    world = evaluate("dev", ce_map("v5p-16", **{CONFIRM_KEY: True}), stack_outputs=outputs)
    flagged = [v for v in check_world(world) if v.policy == "backend-change"]
    assert len(flagged) == 2 and not any(v.mandatory for v in flagged)  # one per slice's group
    assert PROD_POLICY_CONFIG["backend-change"] == "mandatory"
    on_prod = [v for v in check_world(world, PROD_POLICY_CONFIG) if v.policy == "backend-change"]
    assert len(on_prod) == 2 and all(v.mandatory for v in on_prod)


def test_the_groups_make_a_multislice_program(group):
    assert stack_violations([(GROUP, group)]) == []
    assert stack_violations([(TEMPLATE, {})])  # a template alone is not the program

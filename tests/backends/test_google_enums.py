"""Every enum value the program, the provider and the VMs' scripts send or wait for is one of Google's.

Google's discovery documents (tests/fakes/discovery.py: compute v1, container v1, tpu v2, storage v1)
list each field's enum values. The program is evaluated under mocks on stacks of every backend and
capacity mode (:data:`STACKS`), and every upper-case constant found in a resource's inputs is checked
at its field (:data:`ENUM_FIELDS`): a value Google renames or never had fails here. A constant at a
field this module does not know fails too, so a new field is judged as soon as the program sends it.
The states the queued-resource provider waits for and the VM states and actions the compute-engine
scripts compare with are checked the same way. Every Google resource's inputs are judged, field by
field, by the API schema the provider turns them into (tests/fakes/pulumi_inputs.py): names, nesting
and types.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from infra.backends.queued_resource.provider import states
from tests.fakes import discovery, pulumi_inputs
from tests.fakes.pulumi_program import QR_TYPE, evaluate, stack_map
from tests.helpers.compute_engine import ce_map

ROOT = Path(__file__).resolve().parents[2]
IGM = "gcp:compute/instanceGroupManager:InstanceGroupManager"
TEMPLATE = "gcp:compute/instanceTemplate:InstanceTemplate"
NAT = "gcp:compute/routerNat:RouterNat"
NODE_POOL = "gcp:container/nodePool:NodePool"
BUCKET = "gcp:storage/bucket:Bucket"

#: (resource type, input path in the program's inputs) → (document, its field: a schema and the
#: field names down to the value, ``[]`` for an array's items). pulumi-gcp's names are mapped to the
#: API's where they differ (``targetSizePolicies`` is ``targetSizePolicy``; a template's
#: ``reservationAffinity.type`` is ``consumeReservationType``).
ENUM_FIELDS: dict[tuple[str, str], tuple[str, str]] = {
    ("gcp:compute/firewall:Firewall", "direction"): ("compute.v1", "Firewall.direction"),
    ("gcp:compute/network:Network", "routingMode"): ("compute.v1", "Network.routingConfig.routingMode"),
    (IGM, "instanceLifecyclePolicy.defaultActionOnFailure"): (
        "compute.v1",
        "InstanceGroupManager.instanceLifecyclePolicy.defaultActionOnFailure",
    ),
    (IGM, "targetSizePolicies[].mode"): ("compute.v1", "InstanceGroupManager.targetSizePolicy.mode"),
    (IGM, "updatePolicy.minimalAction"): ("compute.v1", "InstanceGroupManager.updatePolicy.minimalAction"),
    (IGM, "updatePolicy.type"): ("compute.v1", "InstanceGroupManager.updatePolicy.type"),
    (TEMPLATE, "networkInterfaces[].nicType"): ("compute.v1", "InstanceProperties.networkInterfaces[].nicType"),
    (TEMPLATE, "reservationAffinity.type"): (
        "compute.v1",
        "InstanceProperties.reservationAffinity.consumeReservationType",
    ),
    (TEMPLATE, "scheduling.instanceTerminationAction"): (
        "compute.v1",
        "InstanceProperties.scheduling.instanceTerminationAction",
    ),
    (TEMPLATE, "scheduling.onHostMaintenance"): ("compute.v1", "InstanceProperties.scheduling.onHostMaintenance"),
    (TEMPLATE, "scheduling.provisioningModel"): ("compute.v1", "InstanceProperties.scheduling.provisioningModel"),
    ("gcp:compute/resourcePolicy:ResourcePolicy", "workloadPolicy.type"): (
        "compute.v1",
        "ResourcePolicy.workloadPolicy.type",
    ),
    ("gcp:compute/resourcePolicy:ResourcePolicy", "workloadPolicy.maxTopologyDistance"): (
        "compute.v1",
        "ResourcePolicy.workloadPolicy.maxTopologyDistance",
    ),
    ("gcp:compute/resourcePolicy:ResourcePolicy", "workloadPolicy.acceleratorTopologyMode"): (
        "compute.v1",
        "ResourcePolicy.workloadPolicy.acceleratorTopologyMode",
    ),
    (NAT, "logConfig.filter"): ("compute.v1", "RouterNat.logConfig.filter"),
    (NAT, "natIpAllocateOption"): ("compute.v1", "RouterNat.natIpAllocateOption"),
    (NAT, "sourceSubnetworkIpRangesToNat"): ("compute.v1", "RouterNat.sourceSubnetworkIpRangesToNat"),
    (NAT, "subnetworks[].sourceIpRangesToNats[]"): ("compute.v1", "RouterNat.subnetworks[].sourceIpRangesToNat[]"),
    (NODE_POOL, "nodeConfig.reservationAffinity.consumeReservationType"): (
        "container.v1",
        "NodePool.config.reservationAffinity.consumeReservationType",
    ),
    (NODE_POOL, "nodeConfig.workloadMetadataConfig.mode"): (
        "container.v1",
        "NodePool.config.workloadMetadataConfig.mode",
    ),
    (NODE_POOL, "placementPolicy.type"): ("container.v1", "NodePool.placementPolicy.type"),
    (NODE_POOL, "upgradeSettings.strategy"): ("container.v1", "NodePool.upgradeSettings.strategy"),
    (NODE_POOL, "nodeConfig.taints[].effect"): ("container.v1", "NodePool.config.taints[].effect"),
    (NODE_POOL, "autoscaling.locationPolicy"): ("container.v1", "NodePool.autoscaling.locationPolicy"),
    ("gcp:container/cluster:Cluster", "releaseChannel.channel"): ("container.v1", "Cluster.releaseChannel.channel"),
    # The API keeps exclusions in a map of TimeWindows (MaintenanceWindow.maintenanceExclusions); their options:
    ("gcp:container/cluster:Cluster", "maintenancePolicy.maintenanceExclusions[].exclusionOptions.scope"): (
        "container.v1",
        "MaintenanceExclusionOptions.scope",
    ),
    ("gcp:container/cluster:Cluster", "maintenancePolicy.maintenanceExclusions[].exclusionOptions.endTimeBehavior"): (
        "container.v1",
        "MaintenanceExclusionOptions.endTimeBehavior",
    ),
    # Cloud Storage's document gives no enum: these fields' descriptions list the values ("Values
    # include MULTI_REGIONAL, REGIONAL, STANDARD, NEARLINE, ...").
    (BUCKET, "storageClass"): ("storage.v1", "Bucket.storageClass"),
    # "Target storage class" lists no values of its own: the storage classes are Bucket.storageClass's.
    (BUCKET, "lifecycleRules[].action.storageClass"): ("storage.v1", "Bucket.storageClass"),
    (BUCKET, "lifecycleRules[].condition.matchesStorageClasses[]"): (
        "storage.v1",
        "Bucket.lifecycle.rule[].condition.matchesStorageClass[]",
    ),
    (QR_TYPE, "waitFor"): ("tpu.v2", "QueuedResource.state.state"),
}
#: Upper-case constants the program sends to no Google API field, and why.
NOT_GOOGLE_ENUMS: dict[tuple[str, str], str] = {
    ("gcp:container/cluster:Cluster", "networkingMode"): (
        "pulumi-gcp's own switch (VPC_NATIVE or ROUTES), sent to the Container API as ipAllocationPolicy.useIpAliases"
    ),
    (
        "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet",
        "spec.replicatedJobs[].template.spec.template.spec.containers[].env[].name",
    ): "environment variable names of the Pods (Kubernetes, not a Google API)",
}

#: Stacks of every backend and capacity mode (the program's enum values depend on both).
STACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "dev": ("dev", stack_map("dev")),
    "prod": ("prod", stack_map("prod")),
    **{
        f"compute-engine {accelerator} {capacity}": ("dev", ce_map(accelerator, capacity=capacity, **extra))
        for accelerator in ("v5p-16", "tpu7x-16", "v6e-8")
        for capacity, extra in (
            ("spot", {}),
            ("on-demand", {}),
            ("reserved", {"multislice:reservationName": "tpu-pool"}),
            ("flex-start", {"multislice:computeEngine": {"maxRunDuration": "3d"}}),
        )
    },
    **{
        f"gke {capacity}": (
            "dev",
            {**ce_map("v5p-16", capacity=capacity), "multislice:backend": "gke", **extra},
        )
        for capacity, extra in (
            ("spot", {}),
            ("on-demand", {}),
            ("reserved", {"multislice:reservationName": "tpu-pool"}),
            ("flex-start", {"multislice:gke": {"maxRunDuration": "3d"}}),
        )
    },
    "gke tpu7x": ("dev", {**ce_map("tpu7x-16"), "multislice:backend": "gke"}),
}


def field_schema(api: str, field: str) -> dict[str, Any]:
    """The discovery document's property at ``field`` (``Schema.a.b[].c``), following ``$ref``s."""
    doc = discovery.document(*api.split(".", 1))
    name, *parts = field.split(".")
    node: dict[str, Any] = doc.schema(name)
    for part in parts:
        key, array = part.removesuffix("[]"), part.endswith("[]")
        while "$ref" in node:
            node = doc.schema(node["$ref"])
        node = node["properties"][key]
        while "$ref" in node:
            node = doc.schema(node["$ref"])
        if array:  # the items, with the array's description (where Cloud Storage lists the values)
            node = {"description": node.get("description", "")} | node["items"]
    return node


def google_values(api: str, field: str) -> set[str]:
    """The values Google lists for ``field``: its enum, or those its description lists after
    "Values include" (Cloud Storage's fields)."""
    node = field_schema(api, field)
    if "enum" in node:
        return set(node["enum"])
    listed = re.search(r"Values include ([A-Z_, ]+?)(?:, and | and )([A-Z_]+)", node.get("description", ""))
    assert listed, f"{api} {field} lists no values: {node}"
    return {v.strip() for v in listed.group(1).split(",")} | {listed.group(2)}


def constants(value: Any, path: str = "") -> list[tuple[str, str]]:
    """``(path, value)`` of every upper-case constant in a resource's inputs."""
    if isinstance(value, dict):
        return [found for key, item in value.items() for found in constants(item, f"{path}.{key}" if path else key)]
    if isinstance(value, list):
        return [found for item in value for found in constants(item, f"{path}[]")]
    if isinstance(value, str) and re.fullmatch(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+|[A-Z]{2,}", value):
        return [(path, value)]
    return []


@pytest.fixture(scope="module")
def registered() -> list[Any]:
    """Every resource the program declares over :data:`STACKS` (their registrations)."""
    return [registration for stack, values in STACKS.values() for registration in evaluate(stack, values).registrations]


@pytest.fixture(scope="module")
def sent(registered) -> dict[tuple[str, str], set[str]]:
    """Every constant the program declares, by (resource type, input path), over :data:`STACKS`."""
    found: dict[tuple[str, str], set[str]] = {}
    for registration in registered:
        for path, value in constants(registration.inputs):
            found.setdefault((registration.typ, path), set()).add(value)
    return found


def test_every_google_resource_the_program_declares_has_the_api_schemas_fields(registered):
    # Field names, nesting and types, as the API the provider sends them to has them
    # (tests/fakes/pulumi_inputs.py maps pulumi-gcp's names to the discovery documents').
    google = [r for r in registered if r.typ.startswith("gcp:")]
    assert {r.typ for r in google} >= {
        "gcp:compute/instanceTemplate:InstanceTemplate",
        "gcp:compute/instanceGroupManager:InstanceGroupManager",
        "gcp:compute/resizeRequest:ResizeRequest",
        "gcp:compute/resourcePolicy:ResourcePolicy",
        "gcp:container/cluster:Cluster",
        "gcp:container/nodePool:NodePool",
        "gcp:projects/iAMMember:IAMMember",
        "gcp:projects/service:Service",
    }
    assert sorted({p for r in google for p in pulumi_inputs.input_problems(r.typ, r.inputs)}) == []


def test_a_misspelt_or_mistyped_input_fails_the_schema(registered):
    # The check itself: a field renamed at any depth, a boolean given as text, a type with no schema.
    def first(typ: str) -> dict[str, Any]:
        return copy.deepcopy(next(r.inputs for r in registered if r.typ == typ))

    template = first("gcp:compute/instanceTemplate:InstanceTemplate")
    template["scheduling"]["provisioningMode"] = template["scheduling"].pop("provisioningModel")
    (problem,) = pulumi_inputs.input_problems("gcp:compute/instanceTemplate:InstanceTemplate", template)
    assert "has no field 'provisioningMode'" in problem
    pool = next(r.inputs for r in registered if r.typ == NODE_POOL and "spot" in (r.inputs.get("nodeConfig") or {}))
    pool = copy.deepcopy(pool)
    pool["nodeConfig"]["spot"] = "yes"
    pool["upgradeSettings"]["maxSurg"] = pool["upgradeSettings"].pop("maxSurge")
    problems = pulumi_inputs.input_problems(NODE_POOL, pool)
    assert len(problems) == 2 and "expected a boolean, got 'yes'" in problems[0] + problems[1]
    assert pulumi_inputs.input_problems("gcp:compute/disk:Disk", {}) != []


def test_the_documents_revisions_are_the_pinned_ones():
    # Printed in the run's header; a new google-api-python-client brings new revisions, and this
    # test says which (docs/development.md says how to refresh it).
    labels = discovery.revisions()
    assert [label.split(" ")[0] for label in labels] == [f"{a}.{v}" for a, v in discovery.DOCUMENTS]
    assert all(re.search(r"\(revision 20[0-9]{6}\)$", label) for label in labels), labels


def test_every_enum_value_the_program_sends_is_googles(sent):
    unknown = sorted(key for key in sent if key not in ENUM_FIELDS and key not in NOT_GOOGLE_ENUMS)
    assert unknown == [], "constants at fields this test does not judge (add them to ENUM_FIELDS):\n" + "\n".join(
        f"  {t} {p}: {sorted(sent[(t, p)])}" for t, p in unknown
    )
    wrong = {
        key: sorted(values - google_values(*ENUM_FIELDS[key])) for key, values in sent.items() if key in ENUM_FIELDS
    }
    assert {key: values for key, values in wrong.items() if values} == {}
    # The stacks reach the values that matter: every provisioning model and both target size modes' bulk.
    assert sent[(TEMPLATE, "scheduling.provisioningModel")] == {"SPOT", "STANDARD", "RESERVATION_BOUND", "FLEX_START"}
    assert "BULK" in sent[(IGM, "targetSizePolicies[].mode")]
    assert sent[(IGM, "instanceLifecyclePolicy.defaultActionOnFailure")] == {"REPAIR", "DO_NOTHING"}
    assert sent[(TEMPLATE, "reservationAffinity.type")] >= {"NO_RESERVATION", "SPECIFIC_RESERVATION"}


def test_a_value_google_never_had_fails(sent):
    # The check itself: a misspelt provisioning model is refused, and a field without a table entry.
    assert "SPOT_VM" not in google_values(*ENUM_FIELDS[(TEMPLATE, "scheduling.provisioningModel")])
    assert google_values("storage.v1", "Bucket.storageClass") >= {"STANDARD", "NEARLINE", "ARCHIVE"}
    with pytest.raises(KeyError):
        field_schema("compute.v1", "InstanceProperties.scheduling.provisioningMode")


def test_the_states_the_provider_waits_for_are_the_tpu_apis():
    queued = google_values("tpu.v2", "QueuedResource.state.state")
    assert set(states.STATE_ORDER) | set(states.FAILED_STATES) | {"DELETING"} <= queued
    assert {"READY", "RESTARTING", "PREEMPTED"} <= google_values("tpu.v2", "Node.state")


def test_the_vm_states_and_actions_the_compute_engine_scripts_compare_are_googles():
    folder = ROOT / "infra" / "backends" / "compute_engine"
    watch = (folder / "slice_watch.sh").read_text(encoding="utf-8")
    identity = (folder / "boot_identity.sh").read_text(encoding="utf-8")
    (lost,) = re.findall(r"^\s*([A-Z_]+(?: \| [A-Z_]+)+)\) lost", watch, re.M)
    statuses = set(lost.split(" | "))
    actions = set(re.findall(r'currentAction"\) not in \("([A-Z_]+)", "([A-Z_]+)"\)', identity)[0])
    actions |= set(re.findall(r'"currentAction"\) or "([A-Z_]+)"', watch))
    assert statuses == {"TERMINATED", "STOPPED", "SUSPENDED"} and actions == {"DELETING", "ABANDONING", "NONE"}
    assert statuses <= google_values("compute.v1", "ManagedInstance.instanceStatus")
    assert actions | {"RECREATING"} <= google_values("compute.v1", "ManagedInstance.currentAction")

"""The program on ``multislice:backend: compute-engine`` (infra/__main__.py,
infra/backends/compute_engine/) under mocks.

The stacks are built from the dev stack's file with a v5p or v6e accelerator in a zone that
offers it. Expected values are written out by hand from Google's tables (v5p-16: 8 chips, 4 per
VM, topology 2x2x2; v6e-16: 16 chips, 4 per VM, 4x4; v6e-8: one 8-chip VM, 2x4), not derived
from the code under test.
"""

from __future__ import annotations

from typing import Any

import pulumi
import pytest

from infra.backends.change import CONFIRM_KEY
from infra.backends.compute_engine.inputs import GROUP_DESCRIPTION, REPLACES_QUEUED_RESOURCE
from infra.components.service_account import compute_read_role_id, slice_repair_role_id
from infra.vm_contract import (
    BACKEND_KEY,
    COMPUTE_ENGINE_ACCELERATOR_KEY,
    COMPUTE_ENGINE_TPU_ENV_KEY,
    DELETE_QUEUED_RESOURCE_KEY,
    INSTANCE_GROUPS_KEY,
    RUN_DIR_KEY,
    SLICE_ID_KEY,
    STARTUP_SCRIPT_KEY,
    WORKERS_PER_SLICE_KEY,
)
from tests.fakes import pulumi_program
from tests.fakes.pulumi_program import QR_TYPE, World, evaluate, unique_id
from tests.helpers.compute_engine import CLOUD_PLATFORM, COMPONENT, GROUP, IMAGE, POLICY, SHAPES, TEMPLATE, ce_map


@pytest.fixture(scope="module")
def v5p() -> World:
    return evaluate("dev", ce_map("v5p-16"))


@pytest.fixture(scope="module")
def v6e() -> World:
    return evaluate("dev", ce_map("v6e-16", slices=3, capacity="on-demand"))


def groups(world: World) -> list[dict[str, Any]]:
    return sorted((r.inputs for r in world.of(GROUP)), key=lambda g: g["name"])


@pytest.mark.parametrize(("accelerator", "slices", "world_name"), [("v5p-16", 2, "v5p"), ("v6e-16", 3, "v6e")])
def test_one_group_per_slice_of_the_slices_vms_under_one_workload_policy(request, accelerator, slices, world_name):
    world: World = request.getfixturevalue(world_name)
    zone, _, vms, topology, machine_type = SHAPES[accelerator]
    assert world.of(QR_TYPE) == []
    assert len(world.of(COMPONENT)) == 1
    policy = world.one(POLICY)
    assert policy.inputs["region"] == "us-east5"
    assert policy.inputs["workloadPolicy"] == {"type": "HIGH_THROUGHPUT", "acceleratorTopology": topology}
    template = world.one(TEMPLATE)
    names = [f"multislice-dev-{i}" for i in range(slices)]
    found = groups(world)
    assert [g["name"] for g in found] == names
    for index, group in enumerate(found):
        assert group["baseInstanceName"] == names[index]
        assert group["zone"] == zone and group["project"] == "acme-ml-dev"
        assert group["targetSize"] == vms
        # The policy's link: Pulumi auto-names it (the mocks: its logical name and a hash of its inputs).
        policy_path = f"projects/acme-ml-dev/regions/us-east5/resourcePolicies/{policy.name}-"
        assert group["resourcePolicies"]["workloadPolicy"].startswith(policy_path)
        assert group["allInstancesConfig"] == {
            "metadata": {SLICE_ID_KEY: str(index), COMPUTE_ENGINE_ACCELERATOR_KEY: accelerator}
        }
        assert group["updatePolicy"] == {"type": "OPPORTUNISTIC", "minimalAction": "NONE"}
        (version,) = group["versions"]
        assert version["instanceTemplate"].startswith("projects/acme-ml-dev/global/instanceTemplates/multislice-dev-")
        assert group["description"] == GROUP_DESCRIPTION
    assert template.inputs["machineType"] == machine_type
    assert template.inputs["namePrefix"] == "multislice-dev-"
    disk = {"boot": True, "autoDelete": True, "sourceImage": IMAGE, "diskSizeGb": 100}
    if world_name == "v6e":  # Cluster Toolkit's v6e blueprints (infra/backends/compute_engine/machine.py)
        disk["diskType"] = "hyperdisk-balanced"
    assert template.inputs["disks"] == [disk]
    assert world.exports["instanceGroupNames"] == names and world.exports["backend"] == "compute-engine"


def test_the_template_carries_the_vms_identity_network_labels_and_metadata(v5p):
    template = v5p.one(TEMPLATE).inputs
    email = v5p.exports["serviceAccountEmail"]
    assert email == "multislice-dev-tpu@acme-ml-dev.iam.gserviceaccount.com"
    assert template["serviceAccount"] == {"email": email, "scopes": [CLOUD_PLATFORM]}
    assert template["tags"] == ["multislice-dev-tpu"] == [v5p.exports["networkTag"]]
    (nic,) = template["networkInterfaces"]
    assert "accessConfigs" not in nic  # no external IP
    assert nic["network"] == "projects/acme-ml-dev/global/networks/multislice-dev-net"
    assert nic["subnetwork"] == "projects/acme-ml-dev/regions/us-east5/subnetworks/multislice-dev-subnet"
    labels = template["labels"]
    assert labels["multislice-stack"] == "dev" and labels["managed-by"] == "pulumi"
    metadata = template["metadata"]
    assert set(metadata) == {
        STARTUP_SCRIPT_KEY,
        RUN_DIR_KEY,
        BACKEND_KEY,
        INSTANCE_GROUPS_KEY,
        WORKERS_PER_SLICE_KEY,
        COMPUTE_ENGINE_ACCELERATOR_KEY,
        COMPUTE_ENGINE_TPU_ENV_KEY,
    }
    # The TPU environment of tpu-operator's sample for 2 VMs of a 2x2x2 slice (its README).
    # And JAX held to the TPU, as the sample sets it (tpu_env.py).
    assert metadata[COMPUTE_ENGINE_TPU_ENV_KEY] == (
        "TPU_TOPOLOGY=2x2x2 TPU_HOST_BOUNDS=1,1,2 TPU_CHIPS_PER_HOST_BOUNDS=2,2,1 TPU_PROCESS_PORT=8470 "
        "TPU_RUNTIME_METRICS_PORTS=8431,8432,8433,8434 JAX_PLATFORMS=tpu"
    )
    assert DELETE_QUEUED_RESOURCE_KEY not in metadata  # deleteOnComplete: not on this backend
    assert metadata[BACKEND_KEY] == "compute-engine"
    assert metadata[INSTANCE_GROUPS_KEY] == "multislice-dev-0,multislice-dev-1"
    assert metadata[WORKERS_PER_SLICE_KEY] == "2"
    assert metadata[COMPUTE_ENGINE_ACCELERATOR_KEY] == "v5p-16"
    assert metadata[RUN_DIR_KEY] == "gs://acme-ml-dev-dev-ckpt/runs/dev" == v5p.exports["runDir"]
    assert metadata[STARTUP_SCRIPT_KEY].startswith("#!/bin/bash")
    # The script's diff is hidden, as on the queued resource.
    assert v5p.one(TEMPLATE).hide_diffs == [f'metadata["{STARTUP_SCRIPT_KEY}"]']


def test_the_vms_account_may_read_the_groups_recreate_a_lost_slice_and_nothing_more(v5p):
    """Neither a multi-host spot slice's group nor Compute Engine recovers it: the VMs may also
    recreate its VMs (instanceGroupManagers.resize needs compute.instanceGroupManagers.update)."""
    email = v5p.exports["serviceAccountEmail"]
    role_id = f"multisliceComputeRead_dev_{unique_id(email)[-10:]}"
    repair_id = f"multisliceSliceRepair_dev_{unique_id(email)[-10:]}"
    assert compute_read_role_id("dev", unique_id(email)) == role_id
    assert slice_repair_role_id("dev", unique_id(email)) == repair_id
    roles = {r.inputs["roleId"]: r.inputs for r in v5p.of("gcp:projects/iAMCustomRole:IAMCustomRole")}
    assert sorted(roles) == [role_id, repair_id]  # and no delete-on-complete role
    assert {r["project"] for r in roles.values()} == {"acme-ml-dev"}
    assert roles[role_id]["permissions"] == ["compute.instanceGroupManagers.get", "compute.instances.get"]
    assert roles[repair_id]["permissions"] == ["compute.instanceGroupManagers.update"]
    project_grants = sorted((g.inputs["role"], g.inputs["member"]) for g in v5p.of("gcp:projects/iAMMember:IAMMember"))
    member = f"serviceAccount:{email}"
    assert project_grants == [
        (f"projects/acme-ml-dev/roles/{role_id}", member),
        (f"projects/acme-ml-dev/roles/{repair_id}", member),
        ("roles/logging.logWriter", member),
        ("roles/monitoring.metricWriter", member),
    ]


@pytest.mark.parametrize(
    ("accelerator", "capacity", "extra"),
    [
        ("v6e-8", "spot", {}),  # its group repairs its one VM
        # Managed capacity modes: Compute Engine recovers the slice; the watch only reports.
        ("v5p-16", "on-demand", {}),
        ("v5p-16", "reserved", {"multislice:reservationName": "r"}),
        ("v5p-16", "flex-start", {"multislice:computeEngine": {"maxRunDuration": "1d"}}),
    ],
)
def test_a_slice_its_group_or_compute_engine_recovers_gets_no_slice_repair_role(accelerator, capacity, extra):
    world = evaluate("dev", ce_map(accelerator, capacity=capacity, **extra))
    roles = [r.inputs["permissions"] for r in world.of("gcp:projects/iAMCustomRole:IAMCustomRole")]
    assert roles == [["compute.instanceGroupManagers.get", "compute.instances.get"]]


def test_the_queued_resource_backend_grants_no_compute_read_role():
    world = evaluate("dev")  # spot: deleteOnComplete's role only
    roles = [r.inputs["permissions"] for r in world.of("gcp:projects/iAMCustomRole:IAMCustomRole")]
    assert roles == [["tpu.nodes.delete"]]


def test_the_slices_wait_for_the_network_bucket_and_grants(v5p):
    component = v5p.one(COMPONENT)
    components = {r.urn for r in v5p.registrations if r.typ.startswith("multislice:gcp:")}
    inside = {r.urn for r in v5p.registrations if r.parent in components}
    assert inside and inside <= set(component.dependencies)  # as the queued resource's (test_program.py)
    inside = {r.parent for r in v5p.registrations if r.typ in (TEMPLATE, GROUP, POLICY)}
    assert inside == {component.urn}


def test_a_single_host_slice_has_no_workload_policy():
    world = evaluate("dev", ce_map("v6e-8", capacity="on-demand"))
    assert world.of(POLICY) == []
    assert world.one(TEMPLATE).inputs["machineType"] == "ct6e-standard-8t"
    for group in groups(world):
        assert group["targetSize"] == 1 and "resourcePolicies" not in group


SPOT = {"provisioningModel": "SPOT", "onHostMaintenance": "TERMINATE", "preemptible": True, "automaticRestart": False}


@pytest.mark.parametrize(
    ("capacity", "extra", "scheduling", "affinity"),
    [
        ("spot", {}, {**SPOT, "instanceTerminationAction": "STOP"}, {"type": "NO_RESERVATION"}),
        ("on-demand", {}, {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE"}, None),
        (
            "reserved",
            {"multislice:reservationName": "acme-v5p"},
            {
                "provisioningModel": "RESERVATION_BOUND",
                "onHostMaintenance": "TERMINATE",
                "instanceTerminationAction": "DELETE",
            },
            {
                "type": "SPECIFIC_RESERVATION",
                "specificReservation": {"key": "compute.googleapis.com/reservation-name", "values": ["acme-v5p"]},
            },
        ),
        (
            "reserved",
            {},
            {"provisioningModel": "STANDARD", "onHostMaintenance": "TERMINATE"},
            {"type": "ANY_RESERVATION"},
        ),
        (
            "flex-start",
            {"multislice:computeEngine": {"maxRunDuration": "3d"}},
            {
                "provisioningModel": "FLEX_START",
                "onHostMaintenance": "TERMINATE",
                "automaticRestart": False,
                "instanceTerminationAction": "DELETE",
                "maxRunDuration": {"seconds": 3 * 86400},
            },
            {"type": "NO_RESERVATION"},  # as every resize-request example sets it
        ),
        (
            "spot",
            {"multislice:computeEngine": {"maxRunDuration": "12h"}},
            {**SPOT, "instanceTerminationAction": "DELETE", "maxRunDuration": {"seconds": 12 * 3600}},
            {"type": "NO_RESERVATION"},
        ),
        (
            "on-demand",
            {"multislice:computeEngine": {"maxRunDuration": "1h"}},
            {
                "provisioningModel": "STANDARD",
                "onHostMaintenance": "TERMINATE",
                "instanceTerminationAction": "DELETE",
                "maxRunDuration": {"seconds": 3600},
            },
            None,
        ),
    ],
)
def test_capacity_becomes_the_templates_scheduling(capacity, extra, scheduling, affinity):
    world = evaluate("dev", ce_map("v5p-16", capacity=capacity, **extra))
    template = world.one(TEMPLATE).inputs
    assert template["scheduling"] == scheduling
    assert template.get("reservationAffinity") == affinity


def test_a_trainer_change_replaces_only_the_template_and_keeps_every_group():
    before = evaluate("dev", ce_map("v5p-16"))
    changed = ce_map("v5p-16")
    changed["multislice:training"]["steps"] = 240
    after = evaluate("dev", changed)
    old = {(r.typ, r.name): r for r in before.registrations}
    new = {(r.typ, r.name): r for r in after.registrations}
    assert old.keys() == new.keys()  # same resources: nothing created, nothing deleted
    changed_resources = {key for key in old if old[key].inputs != new[key].inputs}
    assert {typ for typ, _ in changed_resources} >= {TEMPLATE, GROUP}
    # The template: only its metadata's startup script differs. Compute Engine cannot update a
    # template (https://cloud.google.com/compute/docs/instance-templates), so it is replaced,
    # the new one first (no deleteBeforeReplace: name_prefix gives the new one its own name).
    (template_key,) = [key for key in changed_resources if key[0] == TEMPLATE]
    t_old, t_new = old[template_key], new[template_key]
    assert {k for k in t_old.inputs if t_old.inputs[k] != t_new.inputs.get(k)} == {"metadata"}
    assert {k for k in t_old.inputs["metadata"] if t_old.inputs["metadata"][k] != t_new.inputs["metadata"][k]} == {
        STARTUP_SCRIPT_KEY
    }
    assert t_new.delete_before_replace is False
    # Each group: only the template its version points to differs (an in-place update of the
    # group; OPPORTUNISTIC: no VM is recreated, running VMs keep their capacity).
    for key in (k for k in old if k[0] == GROUP):
        g_old, g_new = old[key].inputs, new[key].inputs
        assert {k for k in g_old if g_old[k] != g_new.get(k)} == {"versions"}
        assert g_old["versions"][0]["instanceTemplate"] != g_new["versions"][0]["instanceTemplate"]
        assert g_new["updatePolicy"]["type"] == "OPPORTUNISTIC"
    # The policy and the groups' names are untouched.
    assert old[(POLICY, "slices-workload-policy")].inputs == new[(POLICY, "slices-workload-policy")].inputs


def test_the_ssh_hint_names_the_first_vm_of_slice_0s_group(v5p):
    hint = v5p.exports["sshHint"]
    list_group = "gcloud compute instance-groups managed list-instances multislice-dev-0 "
    assert hint.startswith(f"gcloud compute ssh $({list_group}")
    assert "--format='value(name)' --sort-by=name --limit=1)" in hint
    assert hint.count("--zone=us-east5-a") == 2 and "--tunnel-through-iap" in hint


# The change of backend on a deployed stack -----------------------------------------------------

QR_DEPLOYED = {
    "backend": "queued-resource",
    "queuedResourceName": "projects/acme-ml-dev/locations/us-east5-a/queuedResources/multislice-dev",
}


def evaluate_capturing(config_map: dict[str, Any], monkeypatch, **kwargs: Any) -> tuple[World, BaseException | None]:
    """``evaluate`` that also returns the World when the program fails."""
    made: list[World] = []

    def world() -> World:
        made.append(World())
        return made[-1]

    monkeypatch.setattr(pulumi_program, "World", world)
    try:
        evaluate("dev", config_map, **kwargs)
    except Exception as err:  # the program's own failure
        return made[-1], err
    return made[-1], None


def test_a_queued_resource_stack_switched_to_compute_engine_is_refused_before_any_resource(monkeypatch):
    world, err = evaluate_capturing(ce_map("v5p-16"), monkeypatch, stack_outputs=QR_DEPLOYED)
    assert isinstance(err, pulumi.RunError)
    assert str(err).startswith("multislice:backend: multislice:backend queued-resource -> compute-engine")
    assert CONFIRM_KEY in str(err)
    assert world.registrations == []


def test_a_confirmed_change_warns_and_marks_the_groups(monkeypatch):
    import infra.__main__ as program

    warned: list[str] = []
    monkeypatch.setattr(program.pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    world = evaluate("dev", ce_map("v5p-16", **{CONFIRM_KEY: True}), stack_outputs=QR_DEPLOYED)
    changes = [w for w in warned if w.startswith("multislice:backend queued-resource -> compute-engine")]
    assert len(changes) == 1 and "multislice-dev" in changes[0]
    assert {g["description"] for g in groups(world)} == {REPLACES_QUEUED_RESOURCE}


@pytest.mark.parametrize(
    ("config_map", "outputs"),
    [
        (None, QR_DEPLOYED),  # the dev stack on its own backend
        (ce_map("v5p-16"), {"backend": "compute-engine", "instanceGroupNames": ["multislice-dev-0"]}),
        (ce_map("v5p-16"), None),  # never deployed
    ],
)
def test_an_unchanged_backend_or_a_new_stack_is_silent(monkeypatch, config_map, outputs):
    import infra.__main__ as program

    warned: list[str] = []
    monkeypatch.setattr(program.pulumi.log, "warn", lambda message, *a, **k: warned.append(message))
    world = evaluate("dev", config_map, stack_outputs=outputs)
    assert not [w for w in warned if "multislice:backend" in w]
    assert world.registrations
    assert all(g["description"] == GROUP_DESCRIPTION for g in groups(world))

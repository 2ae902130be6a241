"""How a compute-engine slice's group gets and keeps its VMs, per capacity mode and slice size,
under mocks (infra/backends/compute_engine/provisioning.py, docs/compute-engine.md section 3b):
bulk mode for every multi-host slice whatever the capacity, an empty group and a resize request
for a one-VM flex-start slice, per-VM repair off where a VM cannot rejoin its slice alone, NO_RESERVATION
on flex-start, the TPU7x boot disk and NIC, the boot disk size; the replacements Compute Engine
forces (a new accelerator type), and the stacks that ask for a mode the slice size does not give.
Expected values are written out by hand from the sources docs/compute-engine.md quotes (Google's
tpu-operator README and CRD, "About bulk mode", the resize-request examples), not derived from the
code under test."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfigError, validate_stack
from tests.fakes.pulumi_program import evaluate
from tests.helpers.compute_engine import GROUP, IMAGE, POLICY, SHAPES, TEMPLATE, ce_map

RESIZE_REQUEST = "gcp:compute/resizeRequest:ResizeRequest"
FLEX = {"multislice:computeEngine": {"maxRunDuration": "3d"}}
NAMED = {"multislice:reservationName": "acme-v5p"}
DO_NOTHING = {"defaultActionOnFailure": "DO_NOTHING"}
#: Repair on, sent explicitly: a group moved from flex-start keeps no DO_NOTHING left behind.
REPAIR = {"defaultActionOnFailure": "REPAIR"}
BULK = [{"mode": "BULK"}]
#: What Compute Engine does not change on a group with VMs, so the program replaces the group.
REPLACED_ON = ["targetSizePolicies", "resourcePolicies", "allInstancesConfig"]


@pytest.mark.parametrize(
    ("accelerator", "capacity", "extra", "target_size", "mode", "lifecycle", "request_vms"),
    [
        # Multi-host: bulk mode whatever the capacity (tpu-operator: multi-host slices "must" be
        # BULK; "About bulk mode": "supports only TPU machine types"); no per-VM repair.
        ("v5p-16", "spot", {}, 2, BULK, DO_NOTHING, None),
        ("v5p-16", "on-demand", {}, 2, BULK, DO_NOTHING, None),
        ("v5p-16", "reserved", NAMED, 2, BULK, DO_NOTHING, None),
        ("v5p-16", "reserved", {}, 2, BULK, DO_NOTHING, None),
        # Flex-start multi-host: bulk mode takes no resize request; the target size at creation.
        ("v5p-16", "flex-start", FLEX, 2, BULK, DO_NOTHING, None),
        ("tpu7x-16", "reserved", NAMED, 2, BULK, DO_NOTHING, None),
        ("tpu7x-16", "spot", {}, 2, BULK, DO_NOTHING, None),
        ("tpu7x-16", "flex-start", FLEX, 2, BULK, DO_NOTHING, None),
        # Single-host: individual mode (the API's default, not sent); the group repairs its VM.
        ("v6e-8", "spot", {}, 1, None, REPAIR, None),
        ("v6e-8", "reserved", NAMED, 1, None, REPAIR, None),
        # One-VM flex-start: an empty group and one resize request for the VM (Cluster Toolkit's way).
        ("v6e-8", "flex-start", FLEX, 0, None, DO_NOTHING, 1),
    ],
)
def test_each_capacity_mode_gives_its_groups_their_size_mode_and_repair(
    accelerator, capacity, extra, target_size, mode, lifecycle, request_vms
):
    world = evaluate("dev", ce_map(accelerator, capacity=capacity, **extra))
    registered = {r.inputs["name"]: r for r in world.of(GROUP)}
    assert sorted(registered) == ["multislice-dev-0", "multislice-dev-1"]
    for group in registered.values():
        assert group.inputs["targetSize"] == target_size
        assert group.inputs.get("targetSizePolicies") == mode
        assert group.inputs.get("instanceLifecyclePolicy") == lifecycle
        # What Compute Engine refuses in place replaces the group, deleted first; a resize request's
        # group keeps the size the request gave it.
        assert group.replace_on_changes == REPLACED_ON + ([] if request_vms else ["targetSize"])
        assert group.delete_before_replace
        assert group.ignore_changes == (["targetSize"] if request_vms else [])
    requests = {r.inputs["instanceGroupManager"]: r for r in world.of(RESIZE_REQUEST)}
    if request_vms is None:
        assert requests == {}
        return
    assert sorted(requests) == sorted(registered)
    for group, request in requests.items():
        assert request.inputs["name"] == f"{group}-flex-start"
        assert request.inputs["resizeBy"] == request_vms
        assert request.inputs["requestedRunDuration"] == {"seconds": str(3 * 86400)}
        assert (request.inputs["zone"], request.inputs["project"]) == (SHAPES[accelerator][0], "acme-ml-dev")
        assert request.delete_before_replace


@pytest.mark.parametrize(
    ("capacity", "extra", "affinity"),
    [
        # Every resize-request example (terraform-provider-google, pulumi-gcp) sets NO_RESERVATION.
        ("flex-start", FLEX, {"type": "NO_RESERVATION"}),
        (
            "reserved",
            NAMED,
            {
                "type": "SPECIFIC_RESERVATION",
                "specificReservation": {"key": "compute.googleapis.com/reservation-name", "values": ["acme-v5p"]},
            },
        ),
        ("reserved", {}, {"type": "ANY_RESERVATION"}),
        # Spot consumes no reservation (Cluster Toolkit's rule, as the gke backend sends it).
        ("spot", {}, {"type": "NO_RESERVATION"}),
        ("on-demand", {}, None),
    ],
)
@pytest.mark.parametrize("accelerator", ["v5p-16", "tpu7x-16", "v6e-8"])
def test_each_capacity_mode_gives_the_template_its_reservation_affinity(accelerator, capacity, extra, affinity):
    template = evaluate("dev", ce_map(accelerator, capacity=capacity, **extra)).one(TEMPLATE).inputs
    assert template.get("reservationAffinity") == affinity


@pytest.mark.parametrize(
    ("accelerator", "disk_type", "nic_type"),
    [("tpu7x-16", "hyperdisk-balanced", "GVNIC"), ("v5p-16", None, None), ("v6e-16", "hyperdisk-balanced", None)],
)
def test_the_boot_disk_and_nic_follow_the_generation(accelerator, disk_type, nic_type):
    template = evaluate("dev", ce_map(accelerator, capacity="spot")).one(TEMPLATE).inputs
    assert template["disks"][0].get("diskType") == disk_type
    assert template["networkInterfaces"][0].get("nicType") == nic_type
    family = "ubuntu-accel-2404-amd64-tpu-tpu7x" if accelerator == "tpu7x-16" else IMAGE.rsplit("/", 1)[-1]
    assert template["disks"][0]["sourceImage"].endswith(f"/family/{family}")
    # 100 GB, the smallest boot disk of the references (tpu-operator's README).
    assert template["disks"][0]["diskSizeGb"] == 100


def test_the_boot_disk_size_is_the_stacks_where_it_names_one():
    config = ce_map("v5p-16", **{"multislice:computeEngine": {"bootDiskSizeGb": 250}})
    assert evaluate("dev", config).one(TEMPLATE).inputs["disks"][0]["diskSizeGb"] == 250


@pytest.mark.parametrize(
    ("size", "words"),
    [
        (49, "49 GB is outside 50..65536: below 50 GB the image, the releases and their virtualenvs may not fit"),
        (65537, "65537 GB is outside 50..65536"),
        (0, "0 GB is outside 50..65536"),
    ],
)
def test_a_boot_disk_outside_its_bounds_is_refused_naming_the_key(size, words):
    with pytest.raises(StackConfigError) as err:
        validate_stack("dev", ce_map("v5p-16", **{"multislice:computeEngine": {"bootDiskSizeGb": size}}), "test")
    (line,) = err.value.lines
    assert line.startswith("multislice:computeEngine.bootDiskSizeGb: ") and words in line, line


MODE_KEY = "multislice:computeEngine.targetSizePolicyMode"


@pytest.mark.parametrize(
    ("accelerator", "capacity", "extra", "mode", "words"),
    [
        ("v5p-16", "spot", {}, "INDIVIDUAL", "INDIVIDUAL cannot be used for v5p-16, a slice of 2 VMs"),
        ("v5p-16", "reserved", NAMED, "INDIVIDUAL", 'multi-host slices "must explicitly configure'),
        ("tpu7x-16", "flex-start", FLEX, "INDIVIDUAL", "each multi-host slice's group is in bulk mode"),
        ("v6e-8", "reserved", NAMED, "BULK", "v6e-8 is one VM per slice"),
        ("v6e-8", "spot", {}, "BULK", "targetSizePolicyMode must be INDIVIDUAL when nodeCount is 1 or less"),
    ],
)
def test_a_mode_the_slice_size_does_not_give_is_refused_naming_the_key(accelerator, capacity, extra, mode, words):
    config = ce_map(accelerator, capacity=capacity, **extra)
    config.setdefault("multislice:computeEngine", {})["targetSizePolicyMode"] = mode
    with pytest.raises(StackConfigError) as err:
        validate_stack("dev", config, "test")
    (line,) = err.value.lines
    assert line.startswith(f"{MODE_KEY}: ") and words in line, line


@pytest.mark.parametrize(("accelerator", "mode"), [("v5p-16", "BULK"), ("v6e-8", "INDIVIDUAL")])
def test_the_mode_the_slice_size_gives_may_be_named(accelerator, mode):
    config = ce_map(accelerator, **{"multislice:computeEngine": {"targetSizePolicyMode": mode}})
    assert evaluate("dev", config).of(GROUP)[0].inputs.get("targetSizePolicies") == (BULK if mode == "BULK" else None)


def test_a_reservation_name_on_flex_start_is_refused_naming_the_key():
    with pytest.raises(StackConfigError) as err:
        validate_stack("dev", ce_map("v5p-16", capacity="flex-start", **FLEX, **NAMED), "test")
    assert [line.split(":", 2)[:2] for line in err.value.lines] == [["multislice", "reservationName"]]


def changes(before: dict, after: dict) -> dict[str, object]:
    """``multislice diff``'s resource changes between two stack files, by resource name."""
    from infra.review.revision_diff import _resource_changes

    return {c.name: c for c in _resource_changes(evaluate("dev", before), evaluate("dev", after))}


@pytest.mark.parametrize("capacity", ["spot", "reserved", "flex-start"])
def test_a_new_accelerator_type_of_a_deployed_stack_replaces_each_slice_as_one_step(capacity):
    """v5p-16 to v5p-32 (2 to 4 VMs a slice, topology 2x2x2 to 2x2x4): a new workload policy (which
    Compute Engine attaches only to a group without VMs), a new bulk target size (added only while
    it is 0) and a new machine type's template. Each group is replaced, deleted first, and the
    diff says the slice's VMs are; nothing is patched in place that the API refuses."""
    extra = FLEX if capacity == "flex-start" else {}
    before = ce_map("v5p-16", capacity=capacity, **extra)
    after = ce_map("v5p-16", capacity=capacity, **extra)
    after["multislice:acceleratorType"] = "v5p-32"
    after["multislice:training"]["parallelism"]["ici"]["fsdp"] = 16
    after["multislice:training"]["global_batch_size"] = 2 * 16 * 2
    found = changes(before, after)
    for group in ("slices-0", "slices-1"):
        change = found[group]
        assert change.action == "replace"  # type: ignore[attr-defined]
        assert set(change.replace_keys) == {"allInstancesConfig", "resourcePolicies", "targetSize"}  # type: ignore[attr-defined]
        assert "the slice's VMs are replaced" in change.note  # type: ignore[attr-defined]
    assert found["slices-template"].action == "replace"  # type: ignore[attr-defined]
    assert "workloadPolicy" in found["slices-workload-policy"].keys  # type: ignore[attr-defined]
    world = evaluate("dev", after)
    assert {g.inputs["targetSize"] for g in world.of(GROUP)} == {4}
    assert world.one(POLICY).inputs["workloadPolicy"]["acceleratorTopology"] == "2x2x4"


def test_a_deployed_stack_in_individual_mode_moves_to_bulk_mode_by_a_replacement():
    """A multi-host Spot stack deployed before bulk mode was used for it: its groups' recorded
    inputs lack the target size policy, and the program's now have it, which Compute Engine does
    not change on an existing group: each group is replaced (the upgrade note of
    docs/compute-engine.md, section 3b)."""
    from infra.review.revision_diff import _pulumi_gcp_change

    group = next(r for r in evaluate("dev", ce_map("v5p-16")).of(GROUP) if r.name == "slices-0")
    change = _pulumi_gcp_change(group.name, GROUP, ("targetSizePolicies",), tuple(group.replace_on_changes))
    assert (change.action, change.replace_keys) == ("replace", ("targetSizePolicies",))


def test_a_new_run_duration_replaces_each_resize_request_and_the_diff_warns_of_the_vms_it_adds():
    longer = ce_map("v6e-8", capacity="flex-start", **{"multislice:computeEngine": {"maxRunDuration": "5d"}})
    found = changes(ce_map("v6e-8", capacity="flex-start", **FLEX), longer)
    for request in ("slices-0-resize-request", "slices-1-resize-request"):
        change = found[request]
        assert change.action == "replace" and "requestedRunDuration" in change.keys  # type: ignore[attr-defined]
        assert "asks for the slice's VMs again" in change.note  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("accelerator", "capacity", "extra", "words"),
    [
        (
            "v6e-8",
            "flex-start",
            FLEX,
            "each group is created empty (target size 0) and given one resize request for its 1 VM",
        ),
        (
            "v5p-16",
            "flex-start",
            FLEX,
            "each group in bulk mode: its 2 VMs are created all at once or not at all, for a run of 3d",
        ),
        ("v5p-16", "flex-start", FLEX, "billed until their run duration ends"),
        (
            "v5p-16",
            "reserved",
            NAMED,
            "each group in bulk mode: its 2 VMs are created all at once or not at all, from reservation acme-v5p",
        ),
        ("v5p-16", "reserved", NAMED, "the reservation is paid for either way; the VMs stay until pulumi destroy"),
        ("v5p-16", "spot", {}, "each group in bulk mode: its 2 VMs are created all at once or not at all"),
        ("v5p-16", "spot", {}, "the VMs' slice watch recreates a lost slice's VMs together"),
        ("v5p-16", "on-demand", {}, "Compute Engine recovers a failed slice itself (managed capacity mode)"),
        ("v5p-16", "spot", {}, "billed until pulumi destroy (deleteOnComplete is not built for this backend)"),
    ],
)
def test_plan_says_how_each_group_gets_its_vms(tmp_path, accelerator, capacity, extra, words):
    """``multislice plan`` (human and ``--json``) names the capacity mode's resources."""
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": ce_map(accelerator, capacity=capacity, **extra)}))
    human = CliRunner().invoke(app, ["plan", "--config-file", str(path)])
    assert human.exit_code == 0, human.output
    assert words in " ".join(human.output.split())
    assert "per-VM repair off" in " ".join(human.output.split())
    document = CliRunner().invoke(app, ["plan", "--config-file", str(path), "--json"])
    assert document.exit_code == 0, document.output
    assert words in json.loads(document.output)["capacity_plan"]


@pytest.mark.parametrize(
    ("capacity", "extra", "words"),
    [
        ("flex-start", {"multislice:computeEngine": {"maxRunDuration": "36h"}}, "run at most 36 h 0 min"),
        ("spot", {}, "the instance groups' spot VMs: billed until pulumi destroy"),
        ("on-demand", {}, "the instance groups' on-demand VMs: billed until pulumi destroy"),
        ("reserved", {}, "the instance groups' reserved VMs: the reservation is paid for either way"),
    ],
)
def test_the_emulation_tells_what_becomes_of_the_vms_per_capacity(capacity, extra, words):
    """Flex-start VMs are deleted by Compute Engine when their run duration ends ("About resize
    requests in a MIG"); other VMs stay until pulumi destroy, and the line names the mode."""
    from infra.backends.compute_engine.emulation import ComputeEngineEmulation

    config = validate_stack("dev", ce_map("v5p-16", capacity=capacity, **extra), "test")
    line = ComputeEngineEmulation(config).line()
    assert words in line and (("Compute Engine deletes them" in line) == (capacity == "flex-start"))


@pytest.mark.parametrize(("accelerator", "told"), [("v5p-16", True), ("v6e-16", False), ("tpu7x-16", False)])
def test_the_plan_says_where_no_source_decides_the_boot_disk_type(accelerator, told):
    config = validate_stack("dev", ce_map(accelerator), "test")
    line = config.backend_spec.capacity_plan(config)
    note = "boot disk: the template's default type (no Google source read names the disk types ct5p-hightpu-4t takes"
    assert (note in line) is told, line

"""How a compute-engine slice's group gets and keeps its VMs, per capacity mode and slice size,
under mocks (infra/backends/compute_engine/provisioning.py, docs/compute-engine.md section 3):
bulk mode for reservation-bound multi-host slices, an empty group and a resize request for
flex-start, per-VM repair off where a VM cannot rejoin its slice alone, the TPU7x boot disk and
NIC; and the stacks that ask for bulk mode where it cannot be. Expected values are written out by
hand from the sources docs/compute-engine.md quotes, not derived from the code under test."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfigError, validate_stack
from tests.fakes.pulumi_program import evaluate
from tests.helpers.compute_engine import GROUP, IMAGE, SHAPES, TEMPLATE, ce_map

RESIZE_REQUEST = "gcp:compute/resizeRequest:ResizeRequest"
FLEX = {"multislice:computeEngine": {"maxRunDuration": "3d"}}
NAMED = {"multislice:reservationName": "acme-v5p"}
DO_NOTHING = {"defaultActionOnFailure": "DO_NOTHING"}
INDIVIDUAL = {"multislice:computeEngine": {"targetSizePolicyMode": "INDIVIDUAL"}}


@pytest.mark.parametrize(
    ("accelerator", "capacity", "extra", "target_size", "mode", "lifecycle", "request_vms"),
    [
        # Multi-host: a VM recreated alone cannot rejoin its slice, so no per-VM repair.
        ("v5p-16", "spot", {}, 2, None, DO_NOTHING, None),
        ("v5p-16", "on-demand", {}, 2, None, DO_NOTHING, None),
        # Reservation-bound: bulk mode ("About bulk mode": reservation-bound or flex-start only).
        ("v5p-16", "reserved", NAMED, 2, [{"mode": "BULK"}], DO_NOTHING, None),
        ("v5p-16", "reserved", {**NAMED, **INDIVIDUAL}, 2, None, DO_NOTHING, None),
        # Any reservation: STANDARD VMs, which bulk mode does not take.
        ("v5p-16", "reserved", {}, 2, None, DO_NOTHING, None),
        # Flex-start: an empty group and one resize request for the slice's VMs.
        ("v5p-16", "flex-start", FLEX, 0, None, DO_NOTHING, 2),
        # Single-host: the group repairs its VM (the API's default, so no policy is sent).
        ("v6e-8", "spot", {}, 1, None, None, None),
        ("v6e-8", "reserved", NAMED, 1, None, None, None),
        ("v6e-8", "flex-start", FLEX, 0, None, DO_NOTHING, 1),
        ("tpu7x-16", "reserved", NAMED, 2, [{"mode": "BULK"}], DO_NOTHING, None),
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
        # A mode change is a replace (it cannot change on an existing group); a resize request's
        # group keeps the size the request gave it.
        assert group.replace_on_changes == ["targetSizePolicies"] and group.delete_before_replace
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
    ("accelerator", "disk_type", "nic_type"),
    [("tpu7x-16", "hyperdisk-balanced", "GVNIC"), ("v5p-16", None, None), ("v6e-16", None, None)],
)
def test_the_boot_disk_and_nic_follow_the_generation(accelerator, disk_type, nic_type):
    template = evaluate("dev", ce_map(accelerator, capacity="spot")).one(TEMPLATE).inputs
    assert template["disks"][0].get("diskType") == disk_type
    assert template["networkInterfaces"][0].get("nicType") == nic_type
    family = "ubuntu-accel-2404-amd64-tpu-tpu7x" if accelerator == "tpu7x-16" else IMAGE.rsplit("/", 1)[-1]
    assert template["disks"][0]["sourceImage"].endswith(f"/family/{family}")


BULK_KEY = "multislice:computeEngine.targetSizePolicyMode"


@pytest.mark.parametrize(
    ("accelerator", "capacity", "extra", "words"),
    [
        ("v5p-16", "spot", {}, "BULK cannot be used with multislice:capacity spot"),
        ("v5p-16", "on-demand", {}, "BULK cannot be used with multislice:capacity on-demand"),
        ("v5p-16", "flex-start", FLEX, "resize request, which bulk mode does not support"),
        ("v5p-16", "reserved", {}, "set multislice:reservationName"),
        ("v6e-8", "reserved", NAMED, "v6e-8 is one VM per slice"),
    ],
)
def test_bulk_mode_where_it_cannot_be_is_refused_naming_the_key(accelerator, capacity, extra, words):
    config = ce_map(accelerator, capacity=capacity, **extra)
    config.setdefault("multislice:computeEngine", {})["targetSizePolicyMode"] = "BULK"
    with pytest.raises(StackConfigError) as err:
        validate_stack("dev", config, "test")
    (line,) = err.value.lines
    assert line.startswith(f"{BULK_KEY}: ") and words in line, line


def test_a_reservation_name_on_flex_start_is_refused_naming_the_key():
    with pytest.raises(StackConfigError) as err:
        validate_stack("dev", ce_map("v5p-16", capacity="flex-start", **FLEX, **NAMED), "test")
    assert [line.split(":", 2)[:2] for line in err.value.lines] == [["multislice", "reservationName"]]


def changes(before: dict, after: dict) -> dict[str, object]:
    """``multislice diff``'s resource changes between two stack files, by resource name."""
    from infra.review.revision_diff import _resource_changes

    return {c.name: c for c in _resource_changes(evaluate("dev", before), evaluate("dev", after))}


def test_a_change_from_individual_to_bulk_replaces_each_group_and_the_diff_says_why():
    individual = ce_map("v5p-16", capacity="reserved", **NAMED, **INDIVIDUAL)
    found = changes(individual, ce_map("v5p-16", capacity="reserved", **NAMED))
    for group in ("slices-0", "slices-1"):
        change = found[group]
        assert (change.action, change.replace_keys) == ("replace", ("targetSizePolicies",))  # type: ignore[attr-defined]
        assert "cannot change on an existing group" in change.note  # type: ignore[attr-defined]


def test_a_new_run_duration_replaces_each_resize_request_and_the_diff_warns_of_the_vms_it_adds():
    longer = ce_map("v5p-16", capacity="flex-start", **{"multislice:computeEngine": {"maxRunDuration": "5d"}})
    found = changes(ce_map("v5p-16", capacity="flex-start", **FLEX), longer)
    for request in ("slices-0-resize-request", "slices-1-resize-request"):
        change = found[request]
        assert change.action == "replace" and "requestedRunDuration" in change.keys  # type: ignore[attr-defined]
        assert "asks for the slice's VMs again" in change.note  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("capacity", "extra", "words"),
    [
        ("flex-start", FLEX, "each group is created empty (target size 0) and given one resize request for its 2 VMs"),
        ("flex-start", FLEX, "billed until their run duration ends"),
        ("reserved", NAMED, "each group in bulk mode: its 2 VMs are created all at once or not at all"),
        ("reserved", NAMED, "the reservation is paid for either way; the VMs stay until pulumi destroy"),
        ("spot", {}, "each group creates its 2 VMs one by one"),
        ("spot", {}, "billed until pulumi destroy (deleteOnComplete is not built for this backend)"),
    ],
)
def test_plan_says_how_each_group_gets_its_vms(tmp_path, capacity, extra, words):
    """``multislice plan`` (human and ``--json``) names the capacity mode's resources."""
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": ce_map("v5p-16", capacity=capacity, **extra)}))
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

"""``multislice plan``'s capacity line for a queued resource: the capacity mode, whose VMs they are,
whether Cloud TPU can preempt them, and until when they are billed (deleteOnComplete: on for spot
and on-demand, off for reserved, unless the stack says otherwise)."""

from __future__ import annotations

from infra import planner
from infra.config import validate_stack


def config(**extra):
    keys = {
        "gcp:project": "acme-ml-test",
        "gcp:zone": "us-central2-b",
        "multislice:acceleratorType": "v4-8",
        "multislice:slices": 2,
        "multislice:training": {"parallelism": {"ici": {"fsdp": 4}, "dcn": {"data": 2}}},
        **extra,
    }
    return validate_stack("t", keys, "test")


def test_spot_capacity_says_preemptible_and_deleted_on_completion():
    line = planner.plan(config(**{"multislice:capacity": "spot"})).capacity
    assert line is not None and line.startswith("capacity: spot (Spot VMs: Cloud TPU can preempt them at any time;")
    assert "deletes the queued resource once the run is complete (deleteOnComplete), which ends their billing" in line


def test_reserved_capacity_is_kept_and_paid_for_either_way():
    line = planner.plan(config(**{"multislice:capacity": "reserved", "multislice:reservationName": "acme-v4"})).capacity
    assert line == (
        "capacity: reserved (VMs of reservation acme-v4); the queued resource is kept after the run "
        "(deleteOnComplete off); the reservation is paid for either way"
    )


def test_on_demand_capacity_kept_by_the_stack_is_billed_until_destroyed():
    line = planner.plan(
        config(**{"multislice:capacity": "on-demand", "multislice:queuedResource": {"deleteOnComplete": False}})
    ).capacity
    assert line == (
        "capacity: on-demand (on-demand VMs); the queued resource is kept after the run (deleteOnComplete off); "
        "billed until pulumi destroy"
    )

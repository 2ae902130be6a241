"""A plain `pulumi up` notices a preempted, failed or vanished queued resource: Pulumi.yaml makes
every operation refresh first (``options.refresh: always``), the provider's ``read`` reports
what the live QR is, and ``diff`` replaces it. Each case walks the engine's steps (read, then
diff, then delete + create) against the loopback fake."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.fakes.queued_resource import (  # noqa: F401 (active, dev, fake, no_ambient_credentials, props: fixtures)
    active,
    dev,
    fake,
    no_ambient_credentials,
    props,
    qr_name,
)

PROJECT_FILE = Path(__file__).resolve().parents[3] / "Pulumi.yaml"


def node(props, index: int) -> str:
    return f"projects/{props['project']}/locations/{props['zone']}/nodes/{props['nodeIdPrefix']}-{index}"


def up(provider, id_, outs, props):
    """What `pulumi up` does with this resource: refresh (read), diff, then replace or update.
    Returns (diff, final outputs, resulting id)."""
    refreshed = provider.read(id_, outs)
    if refreshed.id == "":  # gone: the engine drops it from the state and creates it
        result = provider.create(props)
        return None, result.outs, result.id
    diff = provider.diff(id_, refreshed.outs, props)
    if diff.replaces:
        assert diff.delete_before_replace is True
        provider.delete(id_, refreshed.outs)
        result = provider.create(props)
        return diff, result.outs, result.id
    if diff.changes:
        return diff, provider.update(id_, refreshed.outs, props).outs, id_
    return diff, refreshed.outs, id_


def test_the_project_refreshes_before_every_operation():
    project = yaml.safe_load(PROJECT_FILE.read_text())
    assert project["options"] == {"refresh": "always"}


def test_a_healthy_unchanged_stack_refreshes_to_no_change(fake, active, props):
    provider, id_, outs = active
    diff, final, _ = up(provider, id_, outs, props)
    assert diff.changes is False and diff.replaces == []
    assert final["lostNodes"] == [] and final["ready"] is True
    assert fake.rpcs(include_reads=False) == []


def test_a_preempted_spot_qr_is_replaced_by_a_plain_up(fake, active, props):
    provider, id_, outs = active
    fake.preempt(qr_name(props))  # SUSPENDING now; SUSPENDED with its nodes deleted at the next read

    refreshed = provider.read(id_, outs).outs
    assert refreshed["state"] == "SUSPENDED" and refreshed["ready"] is False
    assert [n["state"] for n in refreshed["nodes"]] == ["NOT_CREATED", "NOT_CREATED"]

    diff, final, new_id = up(provider, id_, outs, props)
    assert diff.replaces == ["state"]
    assert fake.rpcs(include_reads=False) == ["DeleteQueuedResource", "CreateQueuedResource"]
    delete = next(c for c in fake.calls if c.rpc == "DeleteQueuedResource")
    assert delete.query["force"] == ["true"]
    assert new_id == id_ and final["state"] == "ACTIVE" and final["ready"] is True
    assert [n["state"] for n in final["nodes"]] == ["READY", "READY"]


def test_an_active_qr_that_lost_a_node_is_replaced(fake, active, props):
    provider, id_, outs = active
    fake.lose_node(node(props, 1))

    refreshed = provider.read(id_, outs).outs
    assert refreshed["state"] == "ACTIVE" and refreshed["ready"] is False
    assert refreshed["lostNodes"] == ["multislice-dev-1"]
    assert "node(s) gone: multislice-dev-1" in refreshed["statusMessage"]

    diff, final, _ = up(provider, id_, outs, props)
    assert diff.replaces == ["lostNodes"]
    assert fake.rpcs(include_reads=False) == ["DeleteQueuedResource", "CreateQueuedResource"]
    assert final["lostNodes"] == [] and [n["state"] for n in final["nodes"]] == ["READY", "READY"]


def test_a_preempted_node_of_an_active_qr_counts_as_lost(fake, active, props):
    provider, id_, outs = active
    fake.node(node(props, 0)).state = "PREEMPTED"
    refreshed = provider.read(id_, outs).outs
    assert refreshed["lostNodes"] == ["multislice-dev-0"]
    assert provider.diff(id_, refreshed, props).replaces == ["lostNodes"]


def test_a_qr_deleted_outside_pulumi_is_created_again(fake, active, props):
    provider, id_, outs = active
    provider.delete(id_, outs)
    fake.calls.clear()
    diff, final, new_id = up(provider, id_, outs, props)
    assert diff is None and new_id == id_ and final["ready"] is True
    assert fake.rpcs(include_reads=False) == ["CreateQueuedResource"]


def test_a_queued_qr_refreshes_without_listing_nodes(fake, props):
    from tests.fakes.queued_resource import provider_for

    fake.progression = ["CREATING", "WAITING_FOR_RESOURCES"]
    provider = provider_for(fake)
    queued = {**props, "waitFor": "WAITING_FOR_RESOURCES"}
    outs = provider.create(queued).outs
    fake.calls.clear()
    diff, final, _ = up(provider, qr_name(props), outs, queued)
    assert diff.changes is False and final["state"] == "WAITING_FOR_RESOURCES"
    assert fake.rpcs() == ["GetQueuedResource"]  # nothing to list while it waits for capacity

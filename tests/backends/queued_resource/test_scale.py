"""At the 256-slice limit (https://cloud.google.com/tpu/docs/multislice-introduction): a queued
resource of 256 slices (4 hosts each: 1,024 TPU VMs) is created, read, updated in place (every
node's metadata) under injected 429/5xx storms, fails part-way and is finished by the next
`pulumi up`, and is deleted, each with a number of API calls bounded by a small multiple of
the node count, at most ``MULTISLICE_TPU_CONCURRENCY`` requests in flight, and progress stated.

Against the loopback fake with 2 ms per request (so concurrent requests overlap as against the
real service) and millisecond poll/retry intervals. The bounds asserted here are on calls, not
on time; ``pytest -s`` prints each case's calls per RPC and wall time (a measurement, not an
assertion)."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import pytest

from infra.queued_resource import QueuedResourceFailed
from tests.fakes.queued_resource import (  # noqa: F401 (dev, no_ambient_credentials, props: fixtures)
    dev,
    no_ambient_credentials,
    props,
    props_for,
    provider_for,
    qr_name,
    script,
)
from tests.fakes.tpu_api import FakeTpuApi
from tests.fakes.tpu_faults import FaultPlan

SLICES = 256
CONCURRENCY = 8
#: Requests that touch one node in an update: UpdateNode, its GetOperation, and retries.
PER_NODE_BOUND = 4


@contextmanager
def measured(fake: FakeTpuApi, label: str):
    """Print the calls per RPC (with their failed answers) and the wall time of the block."""
    start, first = time.perf_counter(), len(fake.calls)
    fake.max_in_flight = 0
    yield
    seconds = time.perf_counter() - start
    calls = fake.calls[first:]
    per_rpc: dict[str, list[int]] = {}
    for call in calls:
        per_rpc.setdefault(call.rpc, [0, 0])[0 if call.status == 200 else 1] += 1
    detail = ", ".join(f"{rpc} {ok}" + (f"+{bad} failed" if bad else "") for rpc, (ok, bad) in sorted(per_rpc.items()))
    print(f"\n[{label}] {len(calls)} calls in {seconds:.1f} s, at most {fake.max_in_flight} in flight: {detail}")


@pytest.fixture
def big(dev, monkeypatch):
    """(fake, provider, props, progress lines) of an ACTIVE 256-slice QR; the call log is cleared."""
    monkeypatch.setenv("MULTISLICE_TPU_CONCURRENCY", str(CONCURRENCY))
    with FakeTpuApi(hosts_per_slice=4) as fake:
        fake.latency = 0.002
        lines: list[str] = []
        props256 = {**props_for(dev), "slices": SLICES}
        provider = provider_for(fake, lines, retry_deadline_seconds=1.0)
        with measured(fake, "create 256 slices"):
            outs = provider.create(props256).outs
        assert outs["ready"] is True and len(outs["nodes"]) == SLICES
        fake.calls.clear()
        fake.max_in_flight = 0
        lines.clear()
        yield fake, provider, props256, outs, lines


def new_script(props256, dev, text="#!/bin/bash\necho v2\n"):
    return {**props_for(dev, script(text)), "slices": SLICES}


def node_name(props256, index: int) -> str:
    return f"projects/{props256['project']}/locations/{props256['zone']}/nodes/{props256['nodeIdPrefix']}-{index}"


def test_create_and_read_of_256_slices_list_nodes_by_page(dev):
    with FakeTpuApi(hosts_per_slice=4) as fake:
        props256 = {**props_for(dev), "slices": SLICES}
        provider = provider_for(fake)
        outs = provider.create(props256).outs
        assert outs["ready"] is True and outs["nodesInSync"] is True
        assert len(outs["nodes"]) == SLICES and all(len(n["ipAddresses"]) == 4 for n in outs["nodes"])
        pages = math.ceil(SLICES / fake.page_size)
        counts = fake.counts()
        assert counts["CreateQueuedResource"] == 1 and counts["ListNodes"] == pages and counts["GetNode"] == 0
        assert sum(counts.values()) <= 1 + 2 + len(fake.progression) + pages
        fake.calls.clear()
        with measured(fake, "refresh (read) 256 slices"):
            refreshed = provider.read(qr_name(props256), outs).outs  # what every `pulumi up` now does first
        assert refreshed["lostNodes"] == [] and provider.diff(qr_name(props256), refreshed, props256).changes is False
        assert fake.counts() == {"GetQueuedResource": 1, "ListNodes": pages}


def test_every_node_updates_in_place_through_429_and_5xx_storms(big, dev):
    fake, _, props256, outs, lines = big
    # Each call may retry for 30 s, not the fixture's 1 s: under a loaded test machine a
    # stalled second can use up a short deadline, and a node whose retries run out is a correct
    # part-way update (the next test), not what this test measures. The backoff starts at 5 ms,
    # so the longer deadline costs nothing when the machine is quiet.
    provider = provider_for(fake, lines, retry_deadline_seconds=30.0)
    fake.flaky(
        0.2,
        ("RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL"),
        rpcs=("UpdateNode", "GetOperation", "ListNodes", "GetQueuedResource", "ResetQueuedResource"),
        seed=7,
    )
    new = new_script(props256, dev)
    with measured(fake, "update 256 nodes' metadata, 20% of calls answered 429/500/503"):
        updated = provider.update(qr_name(props256), outs, new).outs

    assert updated["ready"] is True and updated["nodesInSync"] is True and updated["pendingNodeSync"] is False
    assert all(
        fake.node(node_name(props256, i)).metadata["startup-script"] == "#!/bin/bash\necho v2\n" for i in range(SLICES)
    )
    assert fake.resets(qr_name(props256)) == 1
    counts = fake.counts()
    storms = sum(1 for c in fake.calls if c.status in (429, 500, 503))
    assert storms > 50  # the storm really happened ...
    assert sum(1 for c in fake.calls if c.rpc == "UpdateNode" and c.status == 200) == SLICES  # ... each node once
    assert counts["UpdateNode"] <= 2 * SLICES
    assert sum(counts.values()) <= PER_NODE_BOUND * SLICES
    assert fake.max_in_flight <= CONCURRENCY  # never more than the configured requests at once
    # Progress: a line per 10% of the nodes, ending at all of them.
    progress = [line for line in lines if "node(s)" in line and "updated" in line]
    assert len(progress) >= 10 and progress[-1].endswith(f"updated {SLICES}/{SLICES} node(s)")
    assert any("retrying with backoff" in line for line in lines)


def test_an_update_that_fails_part_way_is_finished_by_the_next_up(big, dev):
    fake, provider, props256, outs, lines = big
    stuck = [f"{props256['nodeIdPrefix']}-{i}" for i in range(240, 250)]
    for node_id in stuck:  # these nodes answer 500 until retries run out
        fake.fault("UpdateNode", "INTERNAL", "backend error", times=10**6, path_contains=f"/nodes/{node_id}")
    new = new_script(props256, dev)
    with measured(fake, "update 256 nodes, 10 answer 500 until retries run out"):
        partial = provider.update(qr_name(props256), outs, new).outs

    assert partial["ready"] is False and partial["pendingNodeSync"] is True and partial["pendingReset"] is True
    assert partial["pendingNodes"] == stuck
    assert "updated 246 of 256 node(s) that differ; 10 not updated" in partial["statusMessage"]
    assert "Run `pulumi up` again to finish" in partial["statusMessage"]
    # The state still describes the old script, so the next diff sees the change; no reset yet.
    assert partial["startupScriptSha256"] == outs["startupScriptSha256"] != new["startupScriptSha256"]
    assert partial["metadata"] == outs["metadata"]
    assert fake.resets(qr_name(props256)) == 0
    diff = provider.diff(qr_name(props256), partial, new)
    assert diff.changes is True and diff.replaces == []

    # The next `pulumi up`: the API recovered; only the 10 nodes left are updated, then one reset.
    fake.faults = FaultPlan()
    fake.calls.clear()
    lines.clear()
    with measured(fake, "the next `pulumi up` finishes it"):
        done = provider.update(qr_name(props256), partial, new).outs
    assert done["ready"] is True and done["nodesInSync"] is True and done["pendingNodes"] == []
    assert done["startupScriptSha256"] == new["startupScriptSha256"] and done["pendingReset"] is False
    updated_paths = sorted(c.path.rsplit("/", 1)[-1] for c in fake.calls if c.rpc == "UpdateNode")
    assert updated_paths == sorted(stuck)
    assert fake.resets(qr_name(props256)) == 1
    assert any("resuming the update the last run left part-way (10 node(s)" in line for line in lines)
    assert provider.diff(qr_name(props256), done, new).changes is False


def test_an_error_every_node_would_get_stops_the_update_at_once(big, dev):
    fake, provider, props256, outs, lines = big
    fake.fault("UpdateNode", "PERMISSION_DENIED", "Permission 'tpu.nodes.update' denied", times=10**6)
    with measured(fake, "update 256 nodes, every UpdateNode refused (403)"):
        partial = provider.update(qr_name(props256), outs, new_script(props256, dev)).outs
    assert partial["ready"] is False and len(partial["pendingNodes"]) == SLICES
    assert "permission denied" in partial["statusMessage"]
    # Only the requests already in flight when the first refusal came back: no storm of 256.
    assert fake.counts()["UpdateNode"] <= CONCURRENCY


def test_a_reset_refused_part_way_is_done_by_the_next_up(big, dev):
    fake, provider, props256, outs, lines = big
    fake.fault("ResetQueuedResource", "INTERNAL", times=10**6)
    new = new_script(props256, dev)
    partial = provider.update(qr_name(props256), outs, new).outs
    assert partial["ready"] is False and partial["pendingReset"] is True and partial["pendingNodes"] == []
    assert "the reset did not finish" in partial["statusMessage"]
    fake.faults = FaultPlan()
    fake.calls.clear()
    done = provider.update(qr_name(props256), partial, new).outs
    assert done["ready"] is True and fake.rpcs(include_reads=False) == ["ResetQueuedResource"]


def test_a_256_slice_qr_that_fails_part_way_is_deleted_with_a_short_message(dev):
    with FakeTpuApi() as fake:
        fake.fail_after(
            ["CREATING", "PROVISIONING"], active_slices=200, message="Insufficient capacity in us-central2-b"
        )
        with pytest.raises(QueuedResourceFailed) as err:
            provider_for(fake).create({**props_for(dev), "slices": SLICES})
        text = str(err.value)
        assert "nodes: 200 READY, 56 NOT_CREATED" in text
        assert "not READY/HEALTHY: multislice-dev-200, multislice-dev-201" in text and "and 48 more" in text
        assert len(text.splitlines()) <= 6  # not one line per node
        assert fake.rpcs(include_reads=False) == ["CreateQueuedResource", "DeleteQueuedResource"]
        assert not fake.nodes


def test_delete_of_256_slices_is_one_request_and_a_bounded_wait(big):
    fake, provider, props256, outs, lines = big
    with measured(fake, "delete 256 slices"):
        provider.delete(qr_name(props256), outs)
    assert fake.counts()["DeleteQueuedResource"] == 1
    assert sum(fake.counts().values()) <= 1 + fake.delete_polls + 2
    assert not fake.nodes

"""Bounded waits: everything create, update and delete do (requests, their retries, operation
polling, state waits) draws on one deadline, so a call never runs past ``createTimeoutSeconds``
/ ``deleteTimeoutSeconds`` in total. On a virtual clock (tests/fakes/clock.py) with the
production poll schedule (10 s growing to 60 s) and retry settings (1 s doubling, 300 s), so
the real defaults are checked without waiting."""

from __future__ import annotations

import pytest

from infra.queued_resource import QueuedResourceError
from tests.fakes.clock import clock  # noqa: F401 (fixture)
from tests.fakes.queued_resource import dev, no_ambient_credentials, props, provider_for, qr_name  # noqa: F401 (fixtures)
from tests.fakes.tpu_api import FakeTpuApi, rate_limited

#: The provider's defaults (infra/backends/queued_resource/provider/__init__.py), as a real `pulumi up` runs.
PRODUCTION = dict(poll_seconds=10.0, max_poll_seconds=60.0, retry_initial_seconds=1.0, retry_deadline_seconds=300.0)


def test_create_with_a_stuck_operation_waits_at_most_create_timeout_in_total(clock, props):
    # The create operation never reports done and the QR never leaves the queue.
    with FakeTpuApi(["CREATING", "WAITING_FOR_RESOURCES"], op_polls=10**9) as fake:
        provider = provider_for(fake, **PRODUCTION)
        start = clock.now
        outs = provider.create({**props, "createTimeoutSeconds": 1800}).outs
        elapsed = clock.now - start
        assert outs["ready"] is False and outs["state"] == "WAITING_FOR_RESOURCES"
        assert "recorded in the stack" in outs["statusMessage"]
        assert elapsed <= 1800
        # Both phases ran within that one budget: the operation was polled, then the state read.
        counts = fake.counts()
        assert counts["GetOperation"] >= 10 and counts["GetQueuedResource"] >= 1


def test_create_with_a_failing_state_read_stops_at_the_deadline(clock, props):
    with FakeTpuApi(["CREATING", "WAITING_FOR_RESOURCES"]) as fake:
        fake.fault("GetQueuedResource", "UNAVAILABLE", times=10**6)
        outs = provider_for(fake, **PRODUCTION).create({**props, "createTimeoutSeconds": 120}).outs
        assert outs["ready"] is False and "ServiceUnavailable" in outs["statusMessage"]
        assert clock.now - 1000.0 <= 120
        assert qr_name(props) in fake.queued_resources  # recorded, never orphaned


def test_delete_retrying_and_waiting_takes_at_most_delete_timeout(clock, props, monkeypatch):
    with FakeTpuApi(delete_polls=10**9) as fake:
        provider = provider_for(fake, **PRODUCTION)
        outs = provider.create(props).outs
        fake.fault(
            "DeleteQueuedResource",
            "RESOURCE_EXHAUSTED",
            "Quota exceeded for quota metric 'Requests'",
            details=rate_limited(),
            times=4,
        )
        start = clock.now
        with pytest.raises(QueuedResourceError, match="still being deleted after 20m00s"):
            provider.delete(qr_name(props), {**outs, "deleteTimeoutSeconds": 1200})
        assert clock.now - start <= 1200
        assert [c.status for c in fake.calls if c.rpc == "DeleteQueuedResource"] == [429, 429, 429, 429, 200]


def test_an_update_whose_node_operations_never_finish_stops_at_create_timeout(clock, dev, props, monkeypatch):
    monkeypatch.setenv("MULTISLICE_TPU_CONCURRENCY", "1")  # one worker: the virtual clock is exact
    with FakeTpuApi() as fake:
        provider = provider_for(fake, **PRODUCTION)
        outs = provider.create(props).outs
        fake.op_polls = 10**9  # UpdateNode operations never report done
        new = {**props, "labels": {**props["labels"], "team": "research"}, "createTimeoutSeconds": 900}
        start = clock.now
        updated = provider.update(qr_name(props), outs, new).outs
        assert clock.now - start <= 900
        assert updated["ready"] is False and updated["pendingNodeSync"] is True
        assert updated["pendingNodes"] == ["multislice-dev-0", "multislice-dev-1"]
        assert "Run `pulumi up` again to finish" in updated["statusMessage"]

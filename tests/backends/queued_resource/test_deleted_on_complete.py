"""deleteOnComplete on the provider's side: a queued resource that worker 0 deleted after the
run completed reads as deleted on complete (converged) and `pulumi up` leaves it so, until the inputs
start a new run. Against the loopback TPU fake and the session's emulated Cloud Storage
(fake-gcs-server), where the run's COMPLETE marker lives as the trainer writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from infra.backends.queued_resource.provider.completion import completed_step, marker_url, new_run_reason
from tests.fakes.queued_resource import (  # noqa: F401 (dev, no_ambient_credentials: fixtures)
    dev,
    no_ambient_credentials,
    props_for,
    provider_for,
    qr_name,
)
from tests.fakes.startup_vm import run_delete_on_complete
from tests.fakes.tpu_api import FakeTpuApi

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def world(dev, bucket, gcs_server):
    """(fake TPU API, provider, props, outputs of the created QR, progress lines); the run
    directory is in a fresh bucket of the emulated storage."""
    lines: list[str] = []
    with FakeTpuApi(delete_polls=0) as fake:
        props = {**props_for(dev), "runDir": f"gs://{bucket}/runs/dev"}
        provider = provider_for(fake, lines)
        outs = provider.create(props).outs
        yield fake, provider, props, outs, lines


def write_marker(gcs_server, run_dir: str, record: dict) -> None:
    """``<run_dir>/COMPLETE`` as training.checkpoint.completion.write_completion writes it."""
    bucket, _, prefix = run_dir[len("gs://") :].partition("/")
    response = requests.post(
        f"{gcs_server.url}/upload/storage/v1/b/{bucket}/o",
        params={"uploadType": "media", "name": f"{prefix}/COMPLETE"},
        data=json.dumps(record, sort_keys=True).encode(),
        timeout=30,
    )
    assert response.status_code == 200, response.text


def vm_deletes_it(fake: FakeTpuApi, name: str) -> None:
    """Worker 0 of slice 0 after its trainer exited 0: the release's own script."""
    result = run_delete_on_complete(fake.endpoint, name)
    assert "capacity: deleted:" in result.stdout, result.stdout + result.stderr
    assert name not in fake.queued_resources


def test_complete_and_deleted_by_the_vm_is_converged_until_steps_grow(world, gcs_server):
    fake, provider, props, outs, lines = world
    name = qr_name(props)
    steps = props["trainer"]["steps"]
    write_marker(gcs_server, props["runDir"], {"step": steps, "loss": 2.36})
    vm_deletes_it(fake, name)

    fake.calls.clear()
    refreshed = provider.read(name, outs)  # what `pulumi up` / `preview` does first
    assert refreshed.id == name  # still in the stack: not a create
    assert refreshed.outs["deletedOnComplete"] is True and refreshed.outs["completedStep"] == steps
    assert refreshed.outs["ready"] is True and refreshed.outs["nodes"] == []
    message = refreshed.outs["statusMessage"]
    assert (
        f"completed at step {steps}" in message
        and "multislice:training.steps" in message
        and props["runDir"] in message
    )
    diff = provider.diff(name, refreshed.outs, props)
    assert diff.changes is False and diff.replaces == []  # `pulumi up` is a no-op
    assert fake.rpcs(include_reads=False) == []

    # A change that does not start a new run (the trainer would find the run complete) keeps it deleted.
    relabelled = {**props, "labels": {**props["labels"], "team": "x"}}
    assert provider.diff(name, refreshed.outs, relabelled).changes is False

    # More steps: the finished run continues from its last checkpoint, so the QR comes back.
    more = {**props, "trainer": {**props["trainer"], "steps": steps + 100}}
    diff = provider.diff(name, refreshed.outs, more)
    assert diff.changes is True and diff.replaces == ["trainer"] and diff.delete_before_replace is True
    provider.delete(name, refreshed.outs)  # the engine's replace: delete (already gone) ...
    created = provider.create(more)  # ... then create
    assert created.outs["ready"] is True and not created.outs["deletedOnComplete"]
    assert fake.counts()["CreateQueuedResource"] == 1 and name in fake.queued_resources


def as_the_former_provider_recorded(outs: dict) -> dict:
    """``outs`` as a provider from before the rename recorded them: ``released``, not
    ``deletedOnComplete`` (infra.backends.queued_resource.provider.inputs.FORMER_OUTPUT_KEYS)."""
    former = {k: v for k, v in outs.items() if k != "deletedOnComplete"}
    return former | {"released": outs["deletedOnComplete"]}


def test_a_state_recorded_with_released_reads_and_diffs_as_deleted_on_complete(world, gcs_server):
    fake, provider, props, outs, _ = world
    name = qr_name(props)
    # A live QR recorded by the former provider (released false) diffs as the current record does.
    live_old = as_the_former_provider_recorded(outs)
    assert "released" in live_old and "deletedOnComplete" not in live_old
    relabelled = {**props, "labels": {**props["labels"], "team": "x"}}
    for news in (props, relabelled):
        assert vars(provider.diff(name, live_old, news)) == vars(provider.diff(name, outs, news))

    write_marker(gcs_server, props["runDir"], {"step": props["trainer"]["steps"], "loss": 2.36})
    vm_deletes_it(fake, name)
    refreshed = provider.read(name, outs).outs
    old = as_the_former_provider_recorded(refreshed)
    assert old["released"] is True
    more = {**props, "trainer": {**props["trainer"], "steps": props["trainer"]["steps"] + 100}}
    renamed = {**props, "runDir": props["runDir"].replace("/runs/dev", "/runs/dev-2")}
    for news in (props, relabelled, more, renamed):
        assert vars(provider.diff(name, old, news)) == vars(provider.diff(name, refreshed, news)), news
    assert provider.diff(name, old, props).changes is False  # still converged: `pulumi up` is a no-op
    # Its refresh (the first step of the next `pulumi up`) records the current key only.
    again = provider.read(name, old)
    assert again.id == name and again.outs["deletedOnComplete"] is True and "released" not in again.outs
    assert again.outs == refreshed


def test_a_new_run_name_brings_it_back(world, gcs_server):
    fake, provider, props, outs, _ = world
    name = qr_name(props)
    write_marker(gcs_server, props["runDir"], {"step": props["trainer"]["steps"], "loss": None})
    vm_deletes_it(fake, name)
    refreshed = provider.read(name, outs)
    renamed = {**props, "runDir": props["runDir"].replace("/runs/dev", "/runs/dev-2")}
    diff = provider.diff(name, refreshed.outs, renamed)
    assert diff.changes is True and diff.replaces == ["runDir"]


def test_gone_without_completion_is_created_again(world, gcs_server):
    fake, provider, props, outs, _ = world
    name = qr_name(props)
    vm_deletes_it(fake, name)  # deleted (by hand, say) while the run has no COMPLETE marker
    assert provider.read(name, outs).id == ""


def test_a_marker_for_fewer_steps_is_not_completion(world, gcs_server):
    fake, provider, props, outs, _ = world
    name = qr_name(props)
    write_marker(gcs_server, props["runDir"], {"step": props["trainer"]["steps"] - 1, "loss": 2.5})
    vm_deletes_it(fake, name)
    assert provider.read(name, outs).id == ""


def test_deleting_after_completion_reads_as_deleted_on_complete(dev, bucket, gcs_server):
    with FakeTpuApi(delete_polls=5) as fake:  # DELETING for a while
        props = {**props_for(dev), "runDir": f"gs://{bucket}/runs/dev"}
        provider = provider_for(fake)
        outs = provider.create(props).outs
        write_marker(gcs_server, props["runDir"], {"step": props["trainer"]["steps"], "loss": 2.0})
        requests.delete(f"{fake.endpoint}/v2/{qr_name(props)}", params={"force": "true"}, timeout=30)
        refreshed = provider.read(qr_name(props), outs)
        assert refreshed.outs["state"] == "DELETING" and refreshed.outs["deletedOnComplete"] is True
        assert provider.diff(qr_name(props), refreshed.outs, props).changes is False


def test_unreadable_completion_falls_back_to_gone_and_says_why(world, monkeypatch):
    fake, provider, props, outs, lines = world
    name = qr_name(props)
    vm_deletes_it(fake, name)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")  # nothing listens there
    assert provider.read(name, outs).id == ""
    assert any("whether its run completed is unknown" in line for line in lines), lines


def test_marker_url_and_record_parsing():
    env = {"STORAGE_EMULATOR_HOST": "127.0.0.1:4443"}
    assert (
        marker_url("gs://b/runs/dev", env) == "http://127.0.0.1:4443/storage/v1/b/b/o/runs%2Fdev%2FCOMPLETE?alt=media"
    )
    assert marker_url("gs://b", {}) == "https://storage.googleapis.com/storage/v1/b/b/o/COMPLETE?alt=media"
    with pytest.raises(ValueError, match="not a gs://bucket/path"):
        marker_url("/tmp/run", env)
    assert completed_step(b'{"loss": 2.3, "step": 120}', 120) == 120
    assert completed_step(b'{"loss": 2.3, "step": 120}', 121) is None
    for bad in (b"not json", b'{"step": true}', b'{"step": 0}', b'{"loss": 1}', b"\xff"):
        assert completed_step(bad, 1) is None, bad


def test_new_run_reason():
    olds = {"runDir": "gs://b/runs/a", "trainer": {"steps": 100}, "completedStep": 100}
    assert new_run_reason(olds, {"runDir": "gs://b/runs/a", "trainer": {"steps": 100.0}}) is None
    assert new_run_reason(olds, {"runDir": "gs://b/runs/a", "trainer": {"steps": 80}}) is None  # fewer: still complete
    assert new_run_reason(olds, {"runDir": "gs://b/runs/a", "trainer": {"steps": 101}}) == "trainer"
    assert new_run_reason(olds, {"runDir": "gs://b/runs/b", "trainer": {"steps": 100}}) == "runDir"

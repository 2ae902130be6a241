"""``multislice logs`` on a ``multislice:backend: compute-engine`` stack, against the loopback
Cloud Logging fake (tests/fakes/logging_api.py): the trainer's lines of ``gce_instance`` entries
in the stack's project and zone, labelled with the stack's run (and slice and worker), are
printed; other VMs', other runs', other logs' and TPU nodes' entries are not."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack_file
from infra.logs import cloud
from infra.logs.filter import TRAINER_LOG, logging_filter, trainer_filter
from tests.fakes.logging_api import FakeLoggingApi
from tests.helpers.compute_engine_stack import stack_file

T0 = datetime(2026, 11, 30, 17, 0, tzinfo=UTC)


@pytest.fixture
def fake():
    server = FakeLoggingApi()
    yield server
    server.stop()


@pytest.fixture
def env(fake, tmp_path):
    key = {
        "type": "service_account",
        "client_email": "ci@p.iam.gserviceaccount.com",
        "private_key": "unused",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key))
    return {cloud.ENDPOINT_ENV: fake.url, "GOOGLE_APPLICATION_CREDENTIALS": str(path), "COLUMNS": "250"}


def gce_entry(
    slice_id: int,
    worker: int,
    text: str,
    at: datetime,
    *,
    run: str = "ceops",
    zone: str = "us-east5-a",
    resource_type: str = "gce_instance",
    log: str = TRAINER_LOG,
) -> dict:
    """An entry as a Compute Engine VM's log shipping writes it (resource labels as the
    ``gce_instance`` resource defines them: project_id, instance_id, zone)."""
    return dict(
        logName=f"projects/multislice-tests/logs/{log}",
        resource={
            "type": resource_type,
            "labels": {
                "project_id": "multislice-tests",
                "instance_id": str(7000 + 10 * slice_id + worker),
                "zone": zone,
            },
        },
        labels={"slice": str(slice_id), "worker": str(worker), "run": run},
        textPayload=text,
        timestamp=(at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")),
    )


def test_the_filter_is_the_gce_instance_trainer_lines_of_the_run(tmp_path):
    config = load_stack_file(stack_file(tmp_path))
    base = (
        'resource.type="gce_instance" AND resource.labels.project_id="multislice-tests" AND '
        'resource.labels.zone="us-east5-a" AND logName="projects/multislice-tests/logs/multislice-trainer" AND '
        'labels.run="ceops"'
    )
    assert logging_filter(config) == base
    assert trainer_filter(config) == base
    assert trainer_filter(config, slice_id=1, worker=0, since=T0) == (
        base + ' AND labels.slice="1" AND labels.worker="0" AND timestamp>="2026-11-30T17:00:00.000000Z"'
    )
    assert "tpu_worker" not in trainer_filter(config) and "node_id" not in trainer_filter(config)
    with pytest.raises(IndexError):
        trainer_filter(config, slice_id=2)


def test_logs_prints_the_stacks_lines_only(tmp_path, fake, env):
    stack = stack_file(tmp_path)
    fake.add(**gce_entry(1, 1, "step 10", T0 + timedelta(seconds=5)))
    fake.add(**gce_entry(0, 0, "trainer: starting", T0))
    fake.add(**gce_entry(0, 0, "another run", T0, run="other"))
    fake.add(**gce_entry(0, 0, "another zone", T0, zone="us-central1-a"))
    fake.add(**gce_entry(0, 0, "a TPU node", T0, resource_type="tpu_worker"))
    fake.add(**gce_entry(0, 0, "libtpu", T0, log="tpu-runtime"))
    result = CliRunner().invoke(app, ["logs", "--config-file", str(stack)], env=env, color=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[slice 0 worker 0] trainer: starting", "[slice 1 worker 1] step 10"]


def test_slice_and_worker_narrow_by_the_entry_labels(tmp_path, fake, env):
    stack = stack_file(tmp_path)
    for s in (0, 1):
        for w in (0, 1):
            fake.add(**gce_entry(s, w, f"line of {s}/{w}", T0))
    args = ["logs", "--config-file", str(stack), "--slice", "1", "--worker", "0"]
    result = CliRunner().invoke(app, args, env=env, color=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[slice 1 worker 0] line of 1/0"]


def test_a_stack_with_no_lines_is_named(tmp_path, fake, env):
    stack = stack_file(tmp_path)
    fake.add(**gce_entry(0, 0, "another run", T0, run="other"))
    result = CliRunner().invoke(app, ["logs", "--config-file", str(stack)], env=env, color=False)
    assert result.exit_code == 1
    assert "stack ceops has no trainer lines of run ceops in project multislice-tests" in result.stderr

"""``multislice status`` on a ``multislice:backend: compute-engine`` stack: each slice's instance
group and its VMs from the stand-in ``gcloud`` (tests/fakes/gcloud_cli.py), the run from the
session's emulated Cloud Storage as on Cloud TPU, and never a Cloud TPU API call (its endpoint
points at a closed port: a call would fail the command)."""

from __future__ import annotations

import json
import socket

import pytest
from typer.testing import CliRunner

from infra.backends.queued_resource.capacity import ENDPOINT_ENV
from infra.cli import app
from infra.config import load_stack_file
from infra.remote.gcloud import GCLOUD_ENV
from tests.fakes import gcloud_cli
from tests.fakes.synthetic_run import SyntheticRun, upload
from tests.helpers.compute_engine_stack import GROUPS, NAMES, listed, stack_file


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def stack(tmp_path, bucket):
    return stack_file(tmp_path, bucket=bucket)


def status(tmp_path, stack, groups: dict, *args: str):
    installed = gcloud_cli.install(tmp_path / "gcloud", {"groups": groups})
    return CliRunner().invoke(
        app,
        ["status", "--config-file", str(stack), *args],
        env={**installed, "COLUMNS": "250", GCLOUD_ENV: None, ENDPOINT_ENV: closed_port()},
        color=False,
    )


def running_run() -> SyntheticRun:
    return SyntheticRun(total_steps=24, steps_done=12, log_every=2, checkpoint_every=6)


def test_the_groups_and_their_vms_in_worker_order_as_json(tmp_path, stack):
    upload(load_stack_file(stack).run_dir, running_run().objects())
    result = status(tmp_path, stack, {group: listed(group) for group in GROUPS}, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    cap = data["queued_resource"]
    assert (cap["backend"], cap["id"], cap["state"]) == ("compute-engine", "multislice-ceops", "READY")
    assert [(s["node"], s["state"], s["vms_running"], s["vms"]) for s in cap["slices"]] == [
        ("multislice-ceops-0", "READY", 2, 2),
        ("multislice-ceops-1", "READY", 2, 2),
    ]
    # worker order = sorted names (the VMs number themselves so: infra/startup)
    assert [[i["name"] for i in s["instances"]] for s in cap["slices"]] == [sorted(NAMES[g]) for g in GROUPS]
    assert data["run"]["step"] == 12
    calls = [c["argv"] for c in gcloud_cli.calls(tmp_path / "gcloud")]
    assert calls == [
        [
            "compute",
            "instance-groups",
            "managed",
            "list-instances",
            group,
            "--zone=us-east5-a",
            "--project=multislice-tests",
            "--format=json",
        ]
        for group in GROUPS
    ]


def test_a_slice_being_created_is_not_ready_and_shown_per_vm(tmp_path, stack):
    upload(load_stack_file(stack).run_dir, running_run().objects())
    groups = {GROUPS[0]: listed(GROUPS[0]), GROUPS[1]: listed(GROUPS[1])}
    groups[GROUPS[1]][0] |= {"instanceStatus": None, "currentAction": "CREATING"}
    result = status(tmp_path, stack, groups)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.splitlines()[0] == "stack ceops: instance groups multislice-ceops-0, multislice-ceops-1 are NOT_READY"
    assert "multislice-ceops-0  READY  2/2 VMs running" in out
    assert "multislice-ceops-1  NOT_READY  1/2 VMs running" in out
    assert "worker 1: multislice-ceops-1-m4dd  not created  CREATING" in out
    assert "worker 0: multislice-ceops-1-c9aa  RUNNING  NONE" in out


def test_one_group_missing_is_a_missing_slice(tmp_path, stack):
    upload(load_stack_file(stack).run_dir, running_run().objects())
    data = json.loads(status(tmp_path, stack, {GROUPS[0]: listed(GROUPS[0])}, "--json").stdout)
    assert data["queued_resource"]["state"] == "NOT_READY"
    assert [s["state"] for s in data["queued_resource"]["slices"]] == ["READY", "MISSING"]


def test_a_stack_never_deployed(tmp_path, stack):
    result = status(tmp_path, stack, {})
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "error: stack ceops: instance groups multislice-ceops-0, multislice-ceops-1 not found" in result.stderr
    assert "its instance groups were deleted" in result.stderr


def test_groups_gone_after_the_run_completed_are_deleted(tmp_path, stack):
    upload(
        load_stack_file(stack).run_dir,
        SyntheticRun(total_steps=24, steps_done=24, log_every=2, checkpoint_every=6).objects(),
    )
    result = status(tmp_path, stack, {})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "stack ceops: instance groups multislice-ceops-* are DELETED"


def test_gcloud_failing_is_one_line(tmp_path, stack):
    groups = {g: {"exit": 1, "stderr": "ERROR: (gcloud.compute) PERMISSION_DENIED: nope"} for g in GROUPS}
    result = status(tmp_path, stack, groups)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "gcloud could not list instance group multislice-ceops-0" in result.stderr
    assert "PERMISSION_DENIED" in result.stderr


def test_an_emulated_compute_engine_stack_is_shown_as_emulated_instance_groups():
    # `multislice local status` of a compute-engine stack: the emulator's state, worded per backend.
    from rich.console import Console

    from infra.backends.capacity import CapacityStatus, SliceStatus
    from infra.status.progress import RunProgress
    from infra.status.report import StackStatus, render

    cap = CapacityStatus(
        "multislice-ceops",
        "ACTIVE",
        emulated=True,
        detail="emulator pid 7",
        slices=[SliceStatus(0, "multislice-ceops-0", "READY", None, 2, 2)],
        backend="compute-engine",
    )
    console = Console(width=200, record=True)
    console.print(render(StackStatus("ceops", cap, RunProgress("gs://b/runs/ceops", 24))))
    text = console.export_text()
    assert "emulated instance groups" in text and "multislice-ceops-0  READY  2/2 VMs running" in text
    assert "queued resource" not in text

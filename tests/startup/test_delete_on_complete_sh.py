"""The VM side of deleteOnComplete (infra/startup/delete_on_complete.sh, delete-on-complete.sh
in the software release): run with a loopback metadata server against the loopback TPU API fake, alone and as
the rendered startup script runs it on an emulated VM whose trainer exits 0."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from google.cloud import tpu_v2

from infra import startup
from infra.emulated.metadata import EMULATED_TOKEN, MetadataServer
from infra.vm_contract import DELETE_QUEUED_RESOURCE_KEY
from tests.fakes.startup_vm import RUN_DIR, Vm, dev_stack, gcs, prefixed, script  # noqa: F401 (fixtures)
from tests.fakes.tpu_api import FakeTpuApi

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "startup" / startup.DELETE_ON_COMPLETE_RESOURCE
PARENT = "projects/acme-ml-dev/locations/us-central2-b"
NAME = f"{PARENT}/queuedResources/multislice-dev"


def _seed(fake: FakeTpuApi) -> None:
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base")
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=PARENT,
        node=node,
        multislice_params=tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=2, node_id_prefix="multislice-dev"
        ),
    )
    fake.add_active(tpu_v2.QueuedResource(name=NAME, tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec])))


@pytest.fixture
def fake():
    with FakeTpuApi(delete_polls=0) as api:
        _seed(api)
        yield api


def run(fake: FakeTpuApi, attributes: dict[str, str], slice_: str = "0", worker: str = "0", **env: str) -> list[str]:
    with MetadataServer(attributes) as metadata:
        environ = {
            "PATH": os.environ["PATH"],
            "GCE_METADATA_IP": metadata.address,
            "MULTISLICE_TPU_API_ENDPOINT": fake.endpoint,
            "MULTISLICE_RETRY_DELAY_S": "0.01",
            "MULTISLICE_SLICE": slice_,
            "MULTISLICE_WORKER": worker,
            **env,
        }
        result = subprocess.run(["bash", str(SCRIPT)], env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr  # never fails the unit's stop
    return prefixed(result.stdout + result.stderr, f"[slice {slice_} worker {worker}] ")


def deletes(fake: FakeTpuApi) -> list:
    return [c for c in fake.calls if c.rpc == "DeleteQueuedResource"]


def test_worker_zero_of_slice_zero_force_deletes_the_named_queued_resource(fake):
    lines = run(fake, {DELETE_QUEUED_RESOURCE_KEY: NAME})
    assert lines == [
        f"capacity: the run is complete: deleting queued resource {NAME} (force: its nodes first)",
        f"capacity: deleted: the TPU API accepted the delete of {NAME}",
    ]
    (call,) = deletes(fake)
    assert call.path == f"/v2/{NAME}" and call.query == {"force": ["true"]}
    assert call.headers["authorization"] == f"Bearer {EMULATED_TOKEN}"  # the VM's own token
    assert NAME not in fake.queued_resources and not fake.nodes


@pytest.mark.parametrize(("slice_", "worker"), [("0", "1"), ("1", "0")])
def test_other_workers_leave_it_to_worker_zero(fake, slice_, worker):
    with MetadataServer({DELETE_QUEUED_RESOURCE_KEY: NAME}) as metadata:
        env = {
            "PATH": os.environ["PATH"],
            "GCE_METADATA_IP": metadata.address,
            "MULTISLICE_TPU_API_ENDPOINT": fake.endpoint,
            "MULTISLICE_SLICE": slice_,
            "MULTISLICE_WORKER": worker,
        }
        result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert metadata.requests == []
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert deletes(fake) == [] and NAME in fake.queued_resources


def test_the_slice_that_wrote_the_completion_marker_deletes_when_it_is_not_slice_0(fake):
    """An elastic run that finished without slice 0: trainer.sh names the marker's writer, slice 1."""
    lines = run(fake, {DELETE_QUEUED_RESOURCE_KEY: NAME}, slice_="1", MULTISLICE_COMPLETION_SLICE="1")
    assert lines[-1] == f"capacity: deleted: the TPU API accepted the delete of {NAME}"
    assert len(deletes(fake)) == 1 and NAME not in fake.queued_resources


def test_slice_0_leaves_it_to_the_slice_that_wrote_the_completion_marker(fake):
    with MetadataServer({DELETE_QUEUED_RESOURCE_KEY: NAME}) as metadata:
        env = {
            "PATH": os.environ["PATH"],
            "GCE_METADATA_IP": metadata.address,
            "MULTISLICE_TPU_API_ENDPOINT": fake.endpoint,
            "MULTISLICE_SLICE": "0",
            "MULTISLICE_WORKER": "0",
            "MULTISLICE_COMPLETION_SLICE": "1",
        }
        result = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
        assert metadata.requests == []
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert deletes(fake) == [] and NAME in fake.queued_resources


def test_without_the_metadata_key_the_capacity_is_kept(fake):
    lines = run(fake, {})
    assert lines == ["capacity: kept: no queued resource to delete in the metadata (deleteOnComplete off)"]
    assert fake.calls == [] and NAME in fake.queued_resources


def test_5xx_then_success_is_retried(fake):
    fake.fault("DeleteQueuedResource", "UNAVAILABLE", "backend unavailable", times=2)
    lines = run(fake, {DELETE_QUEUED_RESOURCE_KEY: NAME})
    assert [c.status for c in deletes(fake)] == [503, 503, 200]
    assert sum("HTTP 503; retry" in line for line in lines) == 2
    assert lines[-1] == f"capacity: deleted: the TPU API accepted the delete of {NAME}"
    assert NAME not in fake.queued_resources


def test_permission_denied_is_not_retried_and_says_what_to_grant(fake):
    fake.fault("DeleteQueuedResource", "PERMISSION_DENIED", "Permission 'tpu.nodes.delete' denied", times=5)
    lines = run(fake, {DELETE_QUEUED_RESOURCE_KEY: NAME})
    assert [c.status for c in deletes(fake)] == [403]
    assert lines[-1].startswith(f"capacity: error: HTTP 403 from the TPU API deleting {NAME} (")
    assert "Permission 'tpu.nodes.delete' denied" in lines[-1] and "needs tpu.nodes.delete" in lines[-1]
    assert "KEPT" in lines[-1] and NAME in fake.queued_resources


def test_a_queued_resource_already_gone_counts_as_deleted(fake):
    fake.fault("DeleteQueuedResource", "NOT_FOUND", "not found")
    assert run(fake, {DELETE_QUEUED_RESOURCE_KEY: NAME})[-1] == f"capacity: deleted: {NAME} is already gone"


def test_retries_stop_at_the_deadline(fake):
    fake.fault("DeleteQueuedResource", "UNAVAILABLE", times=1000)
    lines = run(
        fake, {DELETE_QUEUED_RESOURCE_KEY: NAME}, MULTISLICE_RETRY_DELAY_S="1", MULTISLICE_DELETE_DEADLINE_S="2"
    )
    assert lines[-1].startswith(f"capacity: error: DELETE {NAME}: HTTP 503 after ")
    assert "KEPT" in lines[-1] and 1 <= len(deletes(fake)) <= 3


def test_a_malformed_name_is_refused_without_a_request(fake):
    lines = run(fake, {DELETE_QUEUED_RESOURCE_KEY: "projects/x/../../nodes/y"})
    assert lines[-1].startswith(
        "capacity: error: metadata key multislice-delete-queued-resource is not a queued resource name"
    )
    assert deletes(fake) == []


def test_the_booted_vm_deletes_its_queued_resource_after_its_trainer_exits_0(tmp_path, script, gcs, fake):  # noqa: F811
    """The rendered startup script on worker 0 of slice 0: the (fake) trainer exits 0, the unit's
    ExecStopPost runs trainer.sh stopped, which deletes the QR named in the metadata."""
    attributes = {
        "agent-worker-number": "0",
        "tpu-env": "MEGASCALE_SLICE_ID: '0'\n",
        "multislice-run-dir": RUN_DIR,
        DELETE_QUEUED_RESOURCE_KEY: NAME,
    }
    vm = Vm(tmp_path, script.text, attributes, gcs)
    with vm.metadata:
        result = vm.run(MULTISLICE_TPU_API_ENDPOINT=fake.endpoint)
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout, "[slice 0 worker 0] ")
    done = lines.index("trainer: exited with status 0: training is complete")
    assert lines[done + 1 :] == [
        f"capacity: the run is complete: deleting queued resource {NAME} (force: its nodes first)",
        f"capacity: deleted: the TPU API accepted the delete of {NAME}",
    ]
    assert len(deletes(fake)) == 1 and NAME not in fake.queued_resources


def test_a_failing_trainer_never_deletes_the_queued_resource(tmp_path, script, gcs, fake):  # noqa: F811
    attributes = {
        "agent-worker-number": "0",
        "tpu-env": "MEGASCALE_SLICE_ID: '0'\n",
        "multislice-run-dir": RUN_DIR,
        DELETE_QUEUED_RESOURCE_KEY: NAME,
    }
    vm = Vm(tmp_path, script.text, attributes, gcs)
    with vm.metadata:
        result = vm.run(MULTISLICE_TPU_API_ENDPOINT=fake.endpoint, FAKE_MODE="config-error")
    assert "trainer: exited with status 78" in result.stdout
    assert "capacity:" not in result.stdout and deletes(fake) == []

"""infra.backends.queued_resource.emulated_api: the emulated Cloud TPU API's one call (DELETE of the stack's queued
resource, answered with a long-running Operation; every other request refused), the release's
own script against it, and the emulator's side through ``EmulatedStack.up`` with a
stand-in startup script (no trainer): the release recorded, the VMs still running stopped, the
summary's ``capacity``; with deleteOnComplete off, nothing deleted. The real trainer's run is
asserted in tests/local/test_emulation.py (test_the_completed_run_deleted_its_queued_resource)."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests
from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import json_format

from infra import startup
from infra.backends.queued_resource.emulated_api import EmulatedTpuApi
from infra.config import load_stack_file
from infra.emulated import state as state_lib
from infra.emulated.metadata import EMULATED_TOKEN
from infra.emulated.state import LocalPaths
from infra.local.emulated_stack import EmulatedStack, Options
from tests.fakes import discovery
from tests.fakes.startup_vm import prefixed, run_delete_on_complete

ROOT = Path(__file__).resolve().parents[3]
STACK = Path(__file__).parents[2] / "stacks" / "Pulumi.emu.yaml"
PARENT = "projects/multislice-tests/locations/us-central2-b"
NAME = f"{PARENT}/queuedResources/multislice-emu"
AUTH = {"Authorization": f"Bearer {EMULATED_TOKEN}"}


@pytest.fixture
def api():
    deleted: list[str] = []
    with EmulatedTpuApi(NAME, on_delete=deleted.append) as server:
        yield server, deleted


def delete(server: EmulatedTpuApi, name: str = NAME, query: str = "?force=true", headers=AUTH) -> requests.Response:
    return requests.delete(f"{server.endpoint}/v2/{name}{query}", headers=headers, timeout=10)


def error_status(response: requests.Response) -> tuple[int, str]:
    error = response.json()["error"]
    assert error["code"] == response.status_code and error["message"]
    return response.status_code, error["status"]


def test_the_force_delete_is_answered_with_a_done_operation(api):
    server, deleted = api
    response = delete(server)
    assert response.status_code == 200, response.text
    # Parsed as the client library parses it: unknown fields are an error.
    operation = json_format.Parse(response.text, operations_pb2.Operation())
    metadata = tpu_v2.OperationMetadata.pb(tpu_v2.OperationMetadata())
    assert operation.metadata.Unpack(metadata)
    assert (metadata.target, metadata.verb, metadata.api_version) == (NAME, "delete", "v2")
    assert operation.done and operation.name.startswith(f"{PARENT}/operations/")
    assert operation.response.type_url == "type.googleapis.com/google.protobuf.Empty"
    assert deleted == [NAME] and server.deleted_at is not None
    assert error_status(delete(server)) == (404, "NOT_FOUND")  # gone: deleted once
    assert deleted == [NAME]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer someone-else"}, {"Authorization": EMULATED_TOKEN}])
def test_a_missing_or_wrong_token_is_unauthenticated(api, headers):
    server, deleted = api
    assert error_status(delete(server, headers=headers)) == (401, "UNAUTHENTICATED")
    assert deleted == [] and server.deleted_at is None


@pytest.mark.schema_refusals  # a node's delete with the queued resource's force parameter
def test_another_queued_resource_is_not_found(api):
    server, deleted = api
    other = f"{PARENT}/queuedResources/multislice-prod"
    assert error_status(delete(server, name=other)) == (404, "NOT_FOUND")
    assert error_status(delete(server, name=NAME.replace("us-central2-b", "europe-west4-a"))) == (404, "NOT_FOUND")
    # nodes.delete has no force parameter (the TPU API's discovery document): Google refuses the query.
    assert error_status(delete(server, name=f"{PARENT}/nodes/multislice-emu-0")) == (400, "INVALID_ARGUMENT")
    assert error_status(delete(server, name=f"{PARENT}/nodes/multislice-emu-0", query="")) == (404, "NOT_FOUND")
    assert deleted == []


def test_without_force_its_running_nodes_block_the_delete(api):
    server, deleted = api
    for query in ("", "?force=false"):
        assert error_status(delete(server, query=query)) == (400, "FAILED_PRECONDITION")
    assert deleted == []


@pytest.mark.schema_refusals
@pytest.mark.parametrize(
    ("method", "answer"),
    [
        ("GET", (501, "UNIMPLEMENTED")),  # queuedResources.get: Google's API has it, the emulation does not
        ("POST", (404, "NOT_FOUND")),  # the TPU API v2 has no such method (its discovery document)
        ("PATCH", (404, "NOT_FOUND")),
        ("PUT", (404, "NOT_FOUND")),
    ],
)
def test_other_methods_are_refused(api, method, answer):
    server, deleted = api
    response = requests.request(method, f"{server.endpoint}/v2/{NAME}", headers=AUTH, timeout=10)
    assert error_status(response) == answer
    assert deleted == [] and [r[0] for r in server.requests] == [method]


def test_with_delete_on_complete_off_the_service_account_may_not_delete():
    with EmulatedTpuApi(None) as server:
        assert error_status(delete(server)) == (403, "PERMISSION_DENIED")
        assert "tpu.nodes.delete" in delete(server).json()["error"]["message"]
        assert server.deleted_at is None


def test_the_delete_on_complete_script_deletes_through_it(api):
    """The VM side (delete-on-complete.sh of the release) against the emulated API."""
    server, deleted = api
    result = run_delete_on_complete(server.endpoint, NAME)
    assert prefixed(result.stdout + result.stderr, "[slice 0 worker 0] ") == [
        f"capacity: the run is complete: deleting queued resource {NAME} (force: its nodes first)",
        f"capacity: deleted: the TPU API accepted the delete of {NAME}",
    ]
    assert deleted == [NAME] and server.requests == [("DELETE", f"/v2/{NAME}?force=true", 200)]


def test_the_delete_names_the_slice_that_sent_it(api):
    """An elastic run that finished without slice 0: slice 1's worker 0 sends the delete, and the
    emulator says so (the request's User-Agent), not slice 0."""
    server, deleted = api
    result = run_delete_on_complete(server.endpoint, NAME, slice_id=1)
    assert result.returncode == 0 and deleted == [NAME], result.stdout + result.stderr
    assert server.deleted_by == 1


def stand_in(others: str) -> str:
    """A startup script: worker 0 of slice 0 runs the release's script as trainer.sh runs it
    after the trainer exited 0; the other VMs run ``others``."""
    return f"""#!/bin/bash
if [[ $MULTISLICE_HOME == */slice-0-worker-0 ]]; then
  MULTISLICE_SLICE=0 MULTISLICE_WORKER=0 exec bash {ROOT / "infra" / "startup" / startup.DELETE_ON_COMPLETE_RESOURCE}
fi
{others}
"""


def emulate(tmp_path: Path, config, script: str) -> tuple[EmulatedStack, dict, list[str]]:
    lines: list[str] = []
    resource = EmulatedStack(config, LocalPaths(tmp_path / "emu"), script, report=lines.append)
    with resource.running():
        summary = resource.up(Options(poll_s=0.05, node_delete_delay_s=1.0, stall_timeout_s=120, timeout_s=300))
    assert state_lib.find_processes(resource.emulation_id) == []
    return resource, summary, lines


@pytest.mark.timeout(300)
def test_the_emulated_queued_resource_is_deleted_and_its_vms_stopped(tmp_path):
    config = load_stack_file(STACK)
    assert config.capacity == "spot" and config.delete_on_complete  # the default for spot
    name = f"projects/{config.project}/locations/{config.zone}/queuedResources/{config.queued_resource_id}"
    # Slice 1's VM would run on; the force delete deletes its node.
    resource, summary, lines = emulate(tmp_path, config, stand_in("exec sleep 600"))
    assert summary["capacity"] == "deleted"
    assert resource.capacity.api.requests == [("DELETE", f"/v2/{name}?force=true", 200)]
    record = state_lib.read_deletion(resource.paths)
    assert (record["queued_resource"], record["run_dir"]) == (name, config.run_dir)
    assert "capacity: the queued resource was deleted; stopping its VMs still running: slice 1 worker 0" in lines
    assert lines[-1] == (
        f"capacity: deleted: worker 0 of slice 0 deleted the queued resource {name} once the run "
        "was complete (multislice:queuedResource.deleteOnComplete); its spot VMs' billing ended there"
    )
    log = resource.paths.vm_log(0, 0).read_text()
    assert f"[slice 0 worker 0] capacity: deleted: the TPU API accepted the delete of {name}" in log


@pytest.mark.timeout(300)
def test_with_delete_on_complete_off_the_vms_keep_it(tmp_path):
    stack = load_stack_file(STACK)
    config = stack.model_copy(
        update={"queued_resource": stack.queued_resource.model_copy(update={"delete_on_complete": False})}
    )
    assert not config.delete_on_complete
    paths = LocalPaths(tmp_path / "emu")
    paths.root.mkdir(parents=True)
    state_lib.record_deletion(paths, "projects/p/locations/z/queuedResources/q", config.run_dir)  # an earlier run's
    resource, summary, lines = emulate(tmp_path, config, stand_in("exit 0"))
    assert summary["capacity"] == "kept"
    assert resource.capacity.api.requests == []
    assert state_lib.read_deletion(paths) is None  # created again by this `local up`: no longer deleted
    assert lines[-1].startswith("capacity: kept: multislice:queuedResource.deleteOnComplete is off")
    assert lines[-1].endswith("(on Cloud TPU its spot VMs: billed until pulumi destroy)")
    log = paths.vm_log(0, 0).read_text()
    assert "[slice 0 worker 0] capacity: kept: no queued resource to delete in the metadata" in log


def test_a_reset_through_the_real_client_is_accepted_and_reported():
    from google.api_core import exceptions
    from google.oauth2.credentials import Credentials

    from infra.backends.queued_resource.provider.api import TpuApi

    resets: list[str] = []
    with EmulatedTpuApi(None, resettable=NAME, on_reset=resets.append) as server:
        client = TpuApi.client_for(server.endpoint, Credentials(token=EMULATED_TOKEN))
        operation = client.reset_queued_resource(name=NAME)
        qr = operation.result(timeout=10)
        assert (qr.name, qr.state.state.name) == (NAME, "ACTIVE")
        assert operation.metadata.verb == "reset" and operation.metadata.target == NAME
        assert resets == [NAME] and server.resets == 1
        with pytest.raises(exceptions.NotFound):
            client.reset_queued_resource(name=f"{PARENT}/queuedResources/multislice-prod")
        wrong = {"Authorization": "Bearer someone-else"}
        response = requests.post(f"{server.endpoint}/v2/{NAME}:reset", headers=wrong, json={}, timeout=10)
        assert error_status(response) == (401, "UNAUTHENTICATED")
        assert resets == [NAME]
        # A GET of the reset path is no reset (the discovery document reads it as queuedResources.get
        # of a queued resource "multislice-emu:reset", which the emulation does not serve).
        response = requests.get(f"{server.endpoint}/v2/{NAME}:reset", headers=AUTH, timeout=10)
        assert error_status(response) == (501, "UNIMPLEMENTED") and server.resets == 1


def test_a_deleted_queued_resource_cannot_be_reset(api):
    server, deleted = api
    assert delete(server).status_code == 200
    response = requests.post(f"{server.endpoint}/v2/{NAME}:reset", headers=AUTH, json={}, timeout=10)
    assert error_status(response) == (404, "NOT_FOUND") and server.resets == 0


@pytest.mark.schema_refusals
def test_a_refused_delete_keeps_the_queued_resource_and_names_it(monkeypatch):
    """The TPU API refuses the delete (its document without ``force``, as if Google had renamed it):
    one line naming the queued resource, which is kept."""

    def rename_force(data: dict) -> None:
        methods = data["resources"]["projects"]["resources"]["locations"]["resources"]["queuedResources"]["methods"]
        del methods["delete"]["parameters"]["force"]

    discovery.refuse_with(monkeypatch, "tpu.v2", rename_force)
    deleted: list[str] = []
    with EmulatedTpuApi(NAME, on_delete=deleted.append) as server:
        result = run_delete_on_complete(server.endpoint, NAME)
    lines = prefixed(result.stdout, "[slice 0 worker 0] ")
    assert result.returncode == 0 and result.stderr == ""
    assert lines[0].startswith("capacity: the run is complete: deleting queued resource")
    (error,) = lines[1:]
    assert error.startswith(f"capacity: error: HTTP 400 from the TPU API deleting {NAME} (")
    assert "unknown query parameter 'force'" in error and error.endswith("the queued resource is KEPT (and billed)")
    assert deleted == [] and server.deleted_at is None
    assert server.requests == [("DELETE", f"/v2/{NAME}?force=true", 400)]

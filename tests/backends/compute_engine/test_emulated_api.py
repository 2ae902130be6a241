"""infra.backends.compute_engine.emulated_api: the loopback Compute API answers listManagedInstances and instances.get
in the Compute API v1's shapes (gcloud's compute_v1_messages.py: InstanceGroupManagersListManaged
InstancesResponse.managedInstances/nextPageToken, ManagedInstance.instance, Instance.networkInterfaces
[].networkIP), with Google's errors."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

from infra.backends.compute_engine.emulated_api import ComputeApi

BASE = "/compute/v1/projects/p1/zones/us-central2-b/"


def call(api: ComputeApi, method: str, path: str, *, token: bool = True, body: bytes | None = b"") -> tuple[int, dict]:
    request = urllib.request.Request(f"{api.endpoint}{BASE}{path}", method=method, data=body)
    if token:
        request.add_header("Authorization", "Bearer t")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_pages_instances_and_errors():
    with ComputeApi("p1", "us-central2-b", page_size=2) as api:
        api.add_group("g")
        for name, ip in (("g-aaaa", "10.0.0.1"), ("g-bbbb", "10.0.0.2"), ("g-cccc", None)):
            api.add_vm("g", name, ip, "NONE" if ip else "CREATING")
        code, first = call(api, "POST", "instanceGroupManagers/g/listManagedInstances")
        assert code == 200 and first["nextPageToken"] == "2"
        assert [m["instance"].rsplit("/", 1)[-1] for m in first["managedInstances"]] == ["g-aaaa", "g-bbbb"]
        assert first["managedInstances"][0]["instance"] == (
            "https://www.googleapis.com/compute/v1/projects/p1/zones/us-central2-b/instances/g-aaaa"
        )
        code, last = call(api, "POST", "instanceGroupManagers/g/listManagedInstances?pageToken=2")
        assert code == 200 and "nextPageToken" not in last
        assert [(m["currentAction"], m["instanceStatus"]) for m in last["managedInstances"]] == [
            ("CREATING", "PROVISIONING")
        ]
        code, vm = call(api, "GET", "instances/g-bbbb", body=None)
        assert code == 200 and vm["networkInterfaces"][0]["networkIP"] == "10.0.0.2"
        assert call(api, "GET", "instances/g-cccc", body=None)[0] == 404  # listed, not created yet
        assert call(api, "POST", "instanceGroupManagers/other/listManagedInstances")[0] == 404
        code, error = call(api, "POST", "instanceGroupManagers/g/listManagedInstances", token=False)
        assert code == 401 and error["error"]["status"] == "UNAUTHENTICATED"


def test_a_post_without_content_length_is_refused_as_google_s_front_end_does():

    with ComputeApi("p1", "us-central2-b") as api:
        api.add_group("g")
        host, port = api.endpoint.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.putrequest("POST", f"{BASE}instanceGroupManagers/g/listManagedInstances")
        connection.putheader("Authorization", "Bearer t")
        connection.endheaders()
        assert connection.getresponse().status == 411
        connection.close()


def test_recreate_instances_marks_the_vms_and_records_the_request():
    """recreateInstances (Compute API v1: body ``{"instances": [URL…]}``, partial URLs allowed;
    the operation is DONE once the flag is set) sets each VM's action to RECREATING; a VM of
    another group is refused."""
    with ComputeApi("p1", "us-central2-b") as api:
        for group, vm in (("g", "g-aaaa"), ("g", "g-bbbb"), ("h", "h-cccc")):
            api.add_group(group)
            api.add_vm(group, vm, "10.0.0.1")
        api.set_vm("g-bbbb", ip="10.0.0.1", status="TERMINATED")
        code, page = call(api, "POST", "instanceGroupManagers/g/listManagedInstances")
        assert [(m["instanceStatus"], m["currentAction"]) for m in page["managedInstances"]] == [
            ("RUNNING", "NONE"),
            ("TERMINATED", "NONE"),
        ]
        partial = ["zones/us-central2-b/instances/g-aaaa", "zones/us-central2-b/instances/g-bbbb"]
        body = json.dumps({"instances": partial})
        code, operation = call(api, "POST", "instanceGroupManagers/g/recreateInstances", body=body.encode())
        assert code == 200 and (operation["operationType"], operation["status"]) == ("recreateInstances", "DONE")
        assert api.take_recreations() == [("g", ["g-aaaa", "g-bbbb"])] and api.take_recreations() == []
        code, page = call(api, "POST", "instanceGroupManagers/g/listManagedInstances")
        assert {m["currentAction"] for m in page["managedInstances"]} == {"RECREATING"}
        other = json.dumps({"instances": ["zones/us-central2-b/instances/h-cccc"]}).encode()
        code, error = call(api, "POST", "instanceGroupManagers/g/recreateInstances", body=other)
        assert code == 400 and error["error"]["status"] == "INVALID_ARGUMENT"
        assert call(api, "POST", "instanceGroupManagers/x/recreateInstances", body=other)[0] == 404
        assert api.take_recreations() == []

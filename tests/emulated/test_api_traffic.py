"""infra/emulated/api_traffic.py and the judge the tests give it (tests/fakes/discovery.py): a fake's
exchanges are recorded and vetted, and what Google's discovery document refuses is found, in a
request and in an answer. The fake here is the emulated Compute API; every other fake goes through
the same two calls."""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request

import pytest

from infra.backends.compute_engine import emulated_api
from infra.backends.compute_engine.emulated_api import ComputeApi
from infra.emulated import api_traffic
from tests.fakes import discovery

BASE = "/compute/v1/projects/p1/zones/us-central2-b/"


def post(api: ComputeApi, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"{api.endpoint}{BASE}{path}", data=b"", method="POST", headers={"Authorization": "Bearer t"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def traffic(tmp_path, monkeypatch):
    """The exchanges recorded while the test runs (its own file, read with :func:`read`)."""
    path = tmp_path / "traffic.jsonl"
    monkeypatch.setenv(api_traffic.TRAFFIC_ENV, str(path))
    return path


def read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_an_exchange_is_recorded_and_judged_clean(traffic):
    with ComputeApi("p1", "us-central2-b") as api:
        api.add_group("g")
        api.add_vm("g", "g-aaaa", "10.0.0.1")
        assert post(api, "instanceGroupManagers/g/listManagedInstances")[0] == 200
    (exchange,) = read(traffic)
    assert (exchange["api"], exchange["method"], exchange["status"]) == ("compute.v1", "POST", 200)
    assert exchange["response"]["managedInstances"][0]["instanceStatus"] == "RUNNING"
    assert discovery.traffic_problems(read(traffic)) == []


def test_a_field_renamed_in_a_fakes_answer_is_found(traffic, monkeypatch):
    real = ComputeApi._list

    def renamed(self, group, page_token):
        answer = real(self, group, page_token)
        for managed in answer["managedInstances"]:
            managed["instanceState"] = managed.pop("instanceStatus")
        return answer

    monkeypatch.setattr(ComputeApi, "_list", renamed)
    with ComputeApi("p1", "us-central2-b") as api:
        api.add_group("g")
        api.add_vm("g", "g-aaaa", "10.0.0.1")
        post(api, "instanceGroupManagers/g/listManagedInstances")
    (problem,) = discovery.traffic_problems(read(traffic))
    assert problem.endswith(
        "InstanceGroupManagersListManagedInstancesResponse.managedInstances[0]: unknown field 'instanceState' "
        "(not in ManagedInstance)"
    )
    assert "compute.v1 (revision " in problem


@pytest.mark.schema_refusals
def test_a_request_the_document_refuses_is_answered_in_googles_shape(traffic):
    previous = api_traffic.set_vetter(discovery.vetter)
    try:
        with ComputeApi("p1", "us-central2-b") as api:
            api.add_group("g")
            code, body = post(api, "instanceGroupManagers/g/listManagedInstances?maxResult=5")
            missing = post(api, "instanceGroupManagers/g/listManagedInstance")
    finally:
        api_traffic.set_vetter(previous)
    assert code == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    assert "unknown query parameter 'maxResult'" in body["error"]["message"]
    assert missing[0] == 404 and missing[1]["error"]["status"] == "NOT_FOUND"
    assert [e["status"] for e in read(traffic)] == [400, 404]
    assert len(discovery.traffic_problems(read(traffic))) == 2  # the requests; the answers are Google's shape
    assert discovery.traffic_problems(read(traffic), requests=False) == []


def test_an_error_without_googles_shape_is_found():
    assert discovery.error_problems(405, {"error": {"code": 405, "message": "m", "status": "METHOD_NOT_ALLOWED"}}) == [
        "error.status 'METHOD_NOT_ALLOWED' is not a google.rpc.Code name"
    ]
    assert discovery.error_problems(404, {"message": "no"})[0].startswith("an error answer must be")
    assert discovery.error_problems(404, {"error": {"code": 404, "message": "m"}}, rpc_status=False) == []


def test_the_front_ends_411_is_no_api_exchange(traffic):
    # Google's front end refuses a POST without a length with its own page; the API never sees it.
    with ComputeApi("p1", "us-central2-b") as api:
        api.add_group("g")
        host, port = api.endpoint.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        connection.putrequest("POST", f"{BASE}instanceGroupManagers/g/listManagedInstances")
        connection.putheader("Authorization", "Bearer t")
        connection.endheaders()  # no Content-Length
        response = connection.getresponse()
        assert (response.status, response.read().decode()) == (411, emulated_api.FRONT_END_411)
        connection.close()
    assert not traffic.exists()

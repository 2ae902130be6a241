"""training.cluster: identity from a real (loopback) metadata server."""

from __future__ import annotations

import time

import pytest

from infra.local.metadata import MetadataServer
from training import cluster

TPU_ENV = (
    "ACCELERATOR_TYPE: 'v4-16'\nMEGASCALE_COORDINATOR_ADDRESS: '10.0.0.7:8080'\n"
    "MEGASCALE_NUM_SLICES: '4'\nMEGASCALE_SLICE_ID: '2'\n"
)


def test_parse_tpu_env_strips_quotes():
    env = cluster.parse_tpu_env(TPU_ENV)
    assert env["MEGASCALE_NUM_SLICES"] == "4"
    assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.0.7:8080"


def test_parse_worker_endpoints_both_formats():
    assert cluster.parse_worker_endpoints("a:0:10.0.0.1,b:1:10.0.0.2") == ["10.0.0.1", "10.0.0.2"]
    assert cluster.parse_worker_endpoints("host-a,host-b") == ["host-a", "host-b"]
    with pytest.raises(cluster.MetadataError, match="unsupported worker-network-endpoints entry"):
        cluster.parse_worker_endpoints("a:b")


def test_identity_of_a_multislice_worker(monkeypatch):
    attributes = {
        "agent-worker-number": "1",
        "worker-network-endpoints": "n-w-0:0:10.0.0.5,n-w-1:1:10.0.0.6",
        "tpu-env": TPU_ENV,
        "accelerator-type": "v4-16",
    }
    with MetadataServer(attributes) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        monkeypatch.delenv("MULTISLICE_COORDINATOR_PORT", raising=False)
        identity = cluster.identity_from_metadata()
    # process_id = slice_id × workers_per_slice + worker (JAX's cloud_tpu_cluster.py; docs/cloud-tpu.md)
    assert identity.process_id == 2 * 2 + 1
    assert identity.num_processes == 4 * 2
    assert identity.coordinator_address == "10.0.0.7:8482"
    assert identity.accelerator_type == "v4-16"


def test_single_slice_uses_first_worker_as_coordinator(monkeypatch):
    attributes = {
        "agent-worker-number": "0",
        "worker-network-endpoints": "n:0:10.1.1.1",
        "tpu-env": "ACCELERATOR_TYPE: 'v4-8'\n",
    }
    with MetadataServer(attributes) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        monkeypatch.setenv("MULTISLICE_COORDINATOR_PORT", "1234")
        identity = cluster.identity_from_metadata()
    assert (identity.process_id, identity.num_processes) == (0, 1)
    assert identity.coordinator_address == "10.1.1.1:1234"


def test_metadata_needs_the_flavor_header_and_reports_missing_keys(monkeypatch):
    import urllib.error
    import urllib.request

    with MetadataServer({"a": "1"}) as server:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://{server.address}/computeMetadata/v1/instance/attributes/a")
        assert info.value.code == 403
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        assert cluster.get_metadata("a") == "1"
        assert cluster.get_metadata("b", required=False) is None
        with pytest.raises(cluster.MetadataError, match="metadata key 'b' is not set"):
            cluster.get_metadata("b")


def test_unreachable_metadata_server_fails_within_bounded_time(monkeypatch):
    from infra.local.emulator import free_port

    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{free_port()}")
    start = time.monotonic()
    with pytest.raises(cluster.MetadataError, match="metadata server unreachable"):
        cluster.get_metadata("agent-worker-number", attempts=3, timeout_s=1)
    assert time.monotonic() - start < 10


def test_worker_outside_slice_is_rejected(monkeypatch):
    attributes = {"agent-worker-number": "3", "worker-network-endpoints": "n:0:10.1.1.1", "tpu-env": ""}
    with MetadataServer(attributes) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        with pytest.raises(cluster.MetadataError, match="agent-worker-number 3 is outside the slice's 1 workers"):
            cluster.identity_from_metadata()

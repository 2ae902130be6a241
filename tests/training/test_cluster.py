"""training.cluster: identity from a real (loopback) metadata server."""

from __future__ import annotations

import re
import time

import pytest

from infra.emulated.metadata import MetadataServer
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
    from infra.emulated.ports import free_port

    monkeypatch.setenv("GCE_METADATA_IP", f"127.0.0.1:{free_port()}")
    start = time.monotonic()
    with pytest.raises(cluster.MetadataError, match="metadata server unreachable"):
        cluster.get_metadata("agent-worker-number", attempts=3, timeout_s=1)
    assert time.monotonic() - start < 60  # gave up (3 attempts, 1 s each), not a hang


def test_worker_outside_slice_is_rejected(monkeypatch):
    attributes = {"agent-worker-number": "3", "worker-network-endpoints": "n:0:10.1.1.1", "tpu-env": ""}
    with MetadataServer(attributes) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        with pytest.raises(cluster.MetadataError, match="agent-worker-number 3 is outside the slice's 1 workers"):
            cluster.identity_from_metadata()


# Compute Engine: the identity boot.sh writes into the unit's environment -------------------------
# Expected values follow JAX's own rules (jax/_src/clusters/cloud_tpu_cluster.py): GkeTpuCluster's
# process id in slice = int(TPU_WORKER_ID), worker list = TPU_WORKER_HOSTNAMES.split(','), and
# BaseTpuCluster's process id = in-slice id + slice id × workers per slice.
CE_MULTISLICE = {
    "TPU_WORKER_ID": "2",
    "TPU_WORKER_HOSTNAMES": "10.2.0.4,10.2.0.9,10.2.0.11,10.2.0.12",
    "MEGASCALE_COORDINATOR_ADDRESS": "10.1.0.3",
    "MEGASCALE_NUM_SLICES": "3",
    "MEGASCALE_SLICE_ID": "1",
}


def test_identity_from_the_environment_of_a_multislice_compute_engine_vm():
    identity = cluster.identity_from_environment(CE_MULTISLICE, accelerator_type="v5p-32")
    assert (identity.worker, identity.workers_per_slice, identity.slice_id, identity.num_slices) == (2, 4, 1, 3)
    assert identity.process_id == 1 * 4 + 2
    assert identity.num_processes == 12
    assert identity.coordinator_address == "10.1.0.3:8482"
    assert identity.accelerator_type == "v5p-32"


def test_a_single_slice_compute_engine_vm_uses_its_first_host_and_the_port_knob():
    env = {"TPU_WORKER_ID": "0", "TPU_WORKER_HOSTNAMES": "10.9.0.2,10.9.0.3", "MULTISLICE_COORDINATOR_PORT": "9999"}
    identity = cluster.identity_from_environment(env)
    assert (identity.process_id, identity.num_processes) == (0, 2)
    assert identity.coordinator_address == "10.9.0.2:9999"
    assert identity.accelerator_type is None


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"TPU_WORKER_ID": None}, "TPU_WORKER_ID is not set"),
        ({"TPU_WORKER_ID": "two"}, "TPU_WORKER_ID='two' is not an integer"),
        ({"TPU_WORKER_ID": "-1"}, "TPU_WORKER_ID='-1' is negative"),
        ({"TPU_WORKER_ID": "4"}, "TPU_WORKER_ID 4 is outside the slice's 4 workers"),
        ({"TPU_WORKER_HOSTNAMES": "10.2.0.4,,10.2.0.9"}, "TPU_WORKER_HOSTNAMES='10.2.0.4,,10.2.0.9' has an empty"),
        ({"TPU_WORKER_HOSTNAMES": None}, "TPU_WORKER_HOSTNAMES is not set"),
        ({"MEGASCALE_NUM_SLICES": "x"}, "MEGASCALE_NUM_SLICES='x' is not an integer"),
        ({"MEGASCALE_SLICE_ID": "3"}, "MEGASCALE_SLICE_ID 3 is outside MEGASCALE_NUM_SLICES 3"),
        ({"MEGASCALE_NUM_SLICES": "0", "MEGASCALE_SLICE_ID": "0"}, "outside MEGASCALE_NUM_SLICES 0"),
    ],
)
def test_a_malformed_environment_identity_names_the_variable(change, message):
    env = {**CE_MULTISLICE, **change}
    env = {k: v for k, v in env.items() if v is not None}
    with pytest.raises(cluster.MetadataError, match=re.escape(message)):
        cluster.identity_from_environment(env)


def test_current_identity_prefers_the_environment_and_reads_the_accelerator_from_metadata(monkeypatch):
    # A Compute Engine VM's metadata has no Cloud TPU keys, only the program's accelerator key.
    with MetadataServer({"multislice-accelerator-type": "v5p-32"}) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        monkeypatch.delenv("MULTISLICE_COORDINATOR_PORT", raising=False)
        for name, value in CE_MULTISLICE.items():
            monkeypatch.setenv(name, value)
        identity = cluster.current_identity()
    assert (identity.process_id, identity.num_processes, identity.accelerator_type) == (6, 12, "v5p-32")


def test_current_identity_without_the_environment_reads_the_metadata(monkeypatch):
    for name in CE_MULTISLICE:
        monkeypatch.delenv(name, raising=False)
    attributes = {"agent-worker-number": "0", "worker-network-endpoints": "n:0:10.1.1.1", "tpu-env": ""}
    with MetadataServer(attributes) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        monkeypatch.delenv("MULTISLICE_COORDINATOR_PORT", raising=False)
        identity = cluster.current_identity()
    assert identity.coordinator_address == "10.1.1.1:8482"


def test_the_units_identity_source_decides_whatever_else_is_set(monkeypatch):
    """The boot writes MULTISLICE_IDENTITY from the stack's backend: a queued resource's trainer reads
    Cloud TPU's keys even where TPU_WORKER_HOSTNAMES happens to be set, a Compute Engine VM's the
    environment even where Cloud TPU's keys are served too."""
    attributes = {
        "agent-worker-number": "0",
        "worker-network-endpoints": "n:0:10.1.1.1",
        "tpu-env": "",
        "multislice-accelerator-type": "v5p-32",
    }
    with MetadataServer(attributes) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        monkeypatch.delenv("MULTISLICE_COORDINATOR_PORT", raising=False)
        for name, value in CE_MULTISLICE.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv(cluster.IDENTITY_ENV, "metadata")
        assert cluster.current_identity().coordinator_address == "10.1.1.1:8482"
        monkeypatch.setenv(cluster.IDENTITY_ENV, "environment")
        assert cluster.current_identity().num_processes == 12
        monkeypatch.setenv(cluster.IDENTITY_ENV, "gke")
        with pytest.raises(
            cluster.MetadataError, match="MULTISLICE_IDENTITY='gke' is not one of metadata, environment"
        ):
            cluster.current_identity()

"""The rendered startup script on a Compute Engine TPU VM (``multislice:backend: compute-engine``):
the VM has none of Cloud TPU's identity keys, finds its place from its slice's managed instance
group and slice 0's (a loopback Compute API, ``infra.backends.compute_engine.emulated_api``), and writes it into
the trainer unit's environment as GKE gives it to a TPU Pod. Waits for late VMs; gives up with
one clear line; refuses a group that does not list it."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest

from infra.backends.compute_engine.emulated_api import ComputeApi
from infra.startup import contract
from tests.fakes.startup_vm import (  # noqa: F401 (fixtures)
    CE_GROUPS,
    CE_PROJECT,
    CE_ZONE,
    ce_script,
    ce_stack,
    compute_engine_vm,
    gcs,
    prefixed,
)
from training import cluster

OWN = "multislice-dev-1-m4n5"
#: Slice 1's VMs: sorted by name, the other one comes first, so this VM is worker 1.
SLICE_1 = {"multislice-dev-1-c8d2": "10.1.0.7", OWN: "10.1.0.3"}
#: Slice 0's: sorted, worker 0 is multislice-dev-0-a1b2 (the coordinator).
SLICE_0 = {"multislice-dev-0-k2m9": "10.0.0.5", "multislice-dev-0-a1b2": "10.0.0.4"}


@pytest.fixture
def api():
    with ComputeApi(CE_PROJECT, CE_ZONE, page_size=1) as server:  # one VM a page: nextPageToken is followed
        yield server


def fill(api: ComputeApi, *groups: Mapping[str, str | None]) -> None:
    for group, vms in zip(CE_GROUPS, groups, strict=False):
        api.add_group(group)
        for name, ip in vms.items():
            api.add_vm(group, name, ip)


@pytest.fixture
def machine(tmp_path, ce_script, gcs):
    vm = compute_engine_vm(tmp_path, ce_script.text, gcs, name=OWN, slice_id=1, workers_per_slice=2)
    with vm.metadata:
        yield vm


def boot(machine, api, wait_s: float = 60):
    return machine.run(
        **{contract.COMPUTE_API_ENDPOINT_ENV: api.endpoint, contract.GROUP_WAIT_ENV: str(wait_s)},
    )


def test_the_identity_is_exported_to_the_trainer(machine, api):
    fill(api, SLICE_0, SLICE_1)
    result = boot(machine, api)
    assert result.returncode == 0, result.stdout
    # The slice is known from the metadata, the worker once the group is listed.
    finding, found = result.stdout.split("[slice 1 worker ?] compute engine: worker 1 of slice 1, ", 1)
    assert prefixed(finding, "[slice 1 worker ?] ")
    lines = prefixed(found.split("\n", 1)[1], "[slice 1 worker 1] ")
    assert "fake trainer attempt 1 on stdout" in lines
    assert found.startswith("hosts 10.1.0.7,10.1.0.3, coordinator 10.0.0.4\n")
    env = machine.environ(1)
    assert {name: env.get(name) for name in contract.COMPUTE_ENGINE_IDENTITY_ENV} == {
        "TPU_WORKER_ID": "1",
        "TPU_WORKER_HOSTNAMES": "10.1.0.7,10.1.0.3",  # sorted-name order
        "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.4",
        "MEGASCALE_NUM_SLICES": "2",
        "MEGASCALE_SLICE_ID": "1",
    }
    assert (env["MULTISLICE_SLICE"], env["MULTISLICE_WORKER"]) == ("1", "1")
    # What the trainer makes of it: process 1 × 2 + 1 of 4, coordinator slice 0's first VM.
    identity = cluster.identity_from_environment(env)
    assert (identity.process_id, identity.num_processes, identity.coordinator_address) == (3, 4, "10.0.0.4:8482")
    # The calls: both groups listed page by page (POST), then each VM's IP (GET), all authorized.
    base = f"/compute/v1/projects/{CE_PROJECT}/zones/{CE_ZONE}/"
    lists = [path for method, path in api.requests if method == "POST"]
    assert f"{base}instanceGroupManagers/{CE_GROUPS[1]}/listManagedInstances" in lists
    assert f"{base}instanceGroupManagers/{CE_GROUPS[1]}/listManagedInstances?pageToken=1" in lists
    assert f"{base}instanceGroupManagers/{CE_GROUPS[0]}/listManagedInstances?pageToken=1" in lists
    gets = {path for method, path in api.requests if method == "GET"}
    assert gets == {f"{base}instances/{name}" for name in (*SLICE_1, *SLICE_0)}
    # The release knows its backend: the program's own keys are asked first; Cloud TPU's keys,
    # which Compute Engine may set too, only to check the place found from the groups.
    asked = [r.split("?")[0].rsplit("/", 1)[-1] for r in machine.metadata.requests]
    assert asked[0] == "multislice-backend"
    assert asked.index(contract.INSTANCE_GROUPS_KEY) < asked.index(contract.WORKER_NUMBER_KEY)


def test_a_single_slice_exports_no_megascale_values(tmp_path, ce_script, gcs, api):
    vm = compute_engine_vm(tmp_path, ce_script.text, gcs, name=OWN, slice_id=0, workers_per_slice=2)
    vm.metadata.update({contract.INSTANCE_GROUPS_KEY: CE_GROUPS[0]})
    fill(api, SLICE_1)  # as slice 0's group's VMs
    with vm.metadata:
        result = boot(vm, api, wait_s=20)
    assert result.returncode == 0, result.stdout
    env = vm.environ(1)
    assert (env["TPU_WORKER_ID"], env["TPU_WORKER_HOSTNAMES"]) == ("1", "10.1.0.7,10.1.0.3")
    assert not {name for name in env if name.startswith("MEGASCALE_")}


def test_it_waits_for_a_late_vm_and_a_late_group(machine, api):
    fill(api, {}, {OWN: "10.1.0.3", "multislice-dev-1-c8d2": None})  # listed, not created yet
    api.remove_group(CE_GROUPS[0])  # slice 0's group is not created yet either
    proc = machine.popen(**{contract.COMPUTE_API_ENDPOINT_ENV: api.endpoint, contract.GROUP_WAIT_ENV: "120"})
    try:
        machine.wait_for_output(proc, "lists VM multislice-dev-1-c8d2, which has no internal IP yet", timeout=120)
        api.set_vm("multislice-dev-1-c8d2", ip="10.1.0.7")
        machine.wait_for_output(proc, f"group {CE_GROUPS[0]} does not exist yet", timeout=120)
        api.add_group(CE_GROUPS[0])
        machine.wait_for_output(proc, f"group {CE_GROUPS[0]} lists 0 of its 2 VMs", timeout=120)
        late = threading.Timer(0.3, lambda: [api.add_vm(CE_GROUPS[0], n, ip) for n, ip in SLICE_0.items()])
        late.start()
        # The boot ends once the fake trainer exited 0 (its records complete: the "count" file
        # comes before the environment it records).
        assert proc.wait(timeout=120) == 0, machine.console.read_text()
    finally:
        machine.kill_all(proc)
    env = machine.environ(1)
    assert (env["TPU_WORKER_ID"], env["MEGASCALE_COORDINATOR_ADDRESS"]) == ("1", "10.0.0.4")


def test_a_group_that_never_fills_stops_the_boot_with_one_clear_line(machine, api):
    fill(api, SLICE_0, {OWN: "10.1.0.3"})
    start = time.monotonic()
    result = boot(machine, api, wait_s=2)
    assert result.returncode == 1, result.stdout
    assert time.monotonic() - start < 60
    errors = [line for line in prefixed(result.stdout, "[slice 1 worker ?] ") if line.startswith("error: ")]
    assert errors == [
        f"error: compute engine: group {CE_GROUPS[1]} lists 1 of its 2 VMs after 2s; not starting the trainer "
        "(this VM's boot stops here; a reboot tries again)"
    ]
    assert machine.attempts == 0 and not machine.unit_dir.exists()


def test_a_group_that_does_not_list_this_vm_is_refused(machine, api):
    fill(api, SLICE_0, {"multislice-dev-1-c8d2": "10.1.0.7", "multislice-dev-1-zz99": "10.1.0.8"})
    result = boot(machine, api)
    assert result.returncode == 1, result.stdout
    assert (
        f"[slice 1 worker ?] error: compute engine: this VM ({OWN}) is not among the VMs of its group "
        f"{CE_GROUPS[1]} (multislice-dev-1-c8d2 multislice-dev-1-zz99); not starting the trainer"
    ) in result.stdout.splitlines()
    assert machine.attempts == 0


#: Cloud TPU's keys as a public TPU7x deployment reports Compute Engine sets them on a slice's VMs
#: (docs/compute-engine.md, section 4), agreeing with the groups: this VM is worker 1 of hosts
#: 10.1.0.7 and 10.1.0.3. tpu-env has no MEGASCALE_SLICE_ID: read as Cloud TPU's, "slice 0".
CLOUD_TPU_KEYS = {
    contract.WORKER_NUMBER_KEY: "1",
    contract.WORKER_ENDPOINTS_KEY: "unknown:unknown:10.1.0.7,unknown:unknown:10.1.0.3",
    contract.TPU_ENV_KEY: "ACCELERATOR_TYPE: 'v5p-16'\nWORKER_ID: '1'\n",
}


@pytest.mark.parametrize(
    "keys",
    [CLOUD_TPU_KEYS, {**CLOUD_TPU_KEYS, contract.WORKER_ENDPOINTS_KEY: "10.1.0.7,10.1.0.3"}, {}],
    ids=["name-id-ip-endpoints", "bare-endpoints", "none"],
)
def test_cloud_tpus_keys_on_a_compute_engine_vm_do_not_decide_its_place(machine, api, keys):
    """A Compute Engine TPU VM may carry Cloud TPU's keys too (a public TPU7x deployment reads
    them: docs/compute-engine.md): a compute-engine release still finds its slice from its
    program's keys and its groups, with them or without."""
    machine.metadata.update(keys)
    fill(api, SLICE_0, SLICE_1)
    result = boot(machine, api)
    assert result.returncode == 0, result.stdout
    env = machine.environ(1)
    assert (env["MULTISLICE_SLICE"], env["MULTISLICE_WORKER"], env["MEGASCALE_SLICE_ID"]) == ("1", "1", "1")
    assert (env["TPU_WORKER_ID"], env["TPU_WORKER_HOSTNAMES"]) == ("1", "10.1.0.7,10.1.0.3")
    assert (env[contract.IDENTITY_ENV], env[contract.LOG_RESOURCE_ENV]) == ("environment", "gce_instance")


@pytest.mark.parametrize(
    ("keys", "error"),
    [
        (
            {contract.WORKER_NUMBER_KEY: "0"},
            f"compute engine: metadata key agent-worker-number says this VM ({OWN}) is worker 0, but it is worker 1 "
            f"of group {CE_GROUPS[1]} by sorted name (multislice-dev-1-c8d2 {OWN}); not starting the trainer",
        ),
        (
            {contract.WORKER_ENDPOINTS_KEY: "unknown:unknown:10.1.0.3,unknown:unknown:10.1.0.7"},
            "compute engine: metadata key worker-network-endpoints lists hosts 10.1.0.3,10.1.0.7, but group "
            f"{CE_GROUPS[1]} lists 10.1.0.7,10.1.0.3 in worker order; not starting the trainer",
        ),
        (
            {contract.WORKER_ENDPOINTS_KEY: "10.1.0.7,10.1.0.3,10.1.0.9"},
            "compute engine: metadata key worker-network-endpoints lists hosts 10.1.0.7,10.1.0.3,10.1.0.9, but group "
            f"{CE_GROUPS[1]} lists 10.1.0.7,10.1.0.3 in worker order; not starting the trainer",
        ),
    ],
    ids=["worker", "order", "hosts"],
)
def test_cloud_tpus_keys_that_disagree_with_the_groups_stop_the_boot_with_one_line(machine, api, keys, error):
    machine.metadata.update(keys)
    fill(api, SLICE_0, SLICE_1)
    result = boot(machine, api)
    assert result.returncode == 1, result.stdout
    errors = [line for line in result.stdout.splitlines() if "error: " in line]
    assert errors == [f"[slice 1 worker ?] error: {error}"]
    assert machine.attempts == 0


def test_a_compute_engine_release_on_a_vm_without_its_backend_key_stops_with_one_line(machine, api):
    machine.metadata.remove(contract.BACKEND_KEY)
    fill(api, SLICE_0, SLICE_1)
    result = boot(machine, api)
    assert result.returncode == 1, result.stdout
    errors = [line for line in result.stdout.splitlines() if "error: " in line]
    assert errors == [
        "[slice ? worker ?] error: metadata key multislice-backend is missing: this release is for the "
        "compute-engine backend, whose instance template sets it"
    ]
    assert machine.attempts == 0 and api.requests == []

"""The rendered startup script on a Compute Engine TPU VM (``multislice:backend: compute-engine``):
the VM finds its place from its slice's managed instance group and slice 0's (a loopback Compute
API, ``infra.backends.compute_engine.emulated_api``) and from the keys Compute Engine may set
(``agent-worker-number``, ``worker-network-endpoints`` in each format jax reads), and writes it
into the trainer unit's environment with the TPU environment of Google's tpu-operator sample.
Waits for late VMs; gives up with one clear line; refuses a group that does not list it and a value
no format explains."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import pytest

from infra import vm_contract as contract
from infra.backends.compute_engine.emulated_api import ComputeApi
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
    finding, found = result.stdout.split("[slice 1 worker ?] compute engine: worker 1 of slice 1 (sorted names), ", 1)
    assert prefixed(finding, "[slice 1 worker ?] ")
    lines = prefixed(found.split("\n", 1)[1], "[slice 1 worker 1] ")
    assert "fake trainer attempt 1 on stdout" in lines
    assert found.startswith("hosts 10.1.0.7,10.1.0.3, coordinator 10.0.0.4\n")
    env = machine.environ(1)
    assert {name: env.get(name) for name in contract.COMPUTE_ENGINE_IDENTITY_ENV} == {
        "TPU_WORKER_ID": "1",
        # Sorted-name order, with the ports of tpu-operator's sample.
        "TPU_WORKER_HOSTNAMES": "10.1.0.7:8471,10.1.0.3:8471",
        "TPU_PROCESS_ADDRESSES": "10.1.0.7:8470,10.1.0.3:8470",
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
    assert (env["TPU_WORKER_ID"], env["TPU_PROCESS_ADDRESSES"]) == ("1", "10.1.0.7:8470,10.1.0.3:8470")
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


#: Slice 1's VMs as Compute Engine may number them (agent-worker-number on each, worker-network-
#: endpoints on every VM of the slice): the other way round from their sorted names.
SWAPPED = "10.1.0.3,10.1.0.7"


@pytest.mark.parametrize(
    ("endpoints", "hosts"),
    [
        # Each format jax's cloud_tpu_cluster.py reads, in sorted-name order.
        ("unknown:unknown:10.1.0.7,unknown:unknown:10.1.0.3", "10.1.0.7,10.1.0.3"),  # name:id:ip
        ("10.1.0.7,10.1.0.3", "10.1.0.7,10.1.0.3"),  # bare IPs
        ("multislice-dev-1-c8d2,multislice-dev-1-m4n5", "10.1.0.7,10.1.0.3"),  # host names
        (
            "multislice-dev-1-c8d2.us-central2-b.c.acme-ml-dev.internal,"
            "multislice-dev-1-m4n5.us-central2-b.c.acme-ml-dev.internal",
            "10.1.0.7,10.1.0.3",
        ),  # zonal DNS names
        (None, "10.1.0.7,10.1.0.3"),
    ],
    ids=["name-id-ip", "bare-ips", "hostnames", "dns-names", "none"],
)
def test_worker_network_endpoints_in_each_format_jax_reads_are_accepted(machine, api, endpoints, hosts):
    """``worker-network-endpoints`` as Compute Engine may set it ("In the new format, it is just a
    list of hostnames. In the old format, it is a list of name:id:ip triples": jax 0.10's
    cloud_tpu_cluster.py), compared like with like: the boot goes on, this VM worker 1."""
    if endpoints is not None:
        machine.metadata.update({contract.WORKER_ENDPOINTS_KEY: endpoints})
    fill(api, SLICE_0, SLICE_1)
    result = boot(machine, api)
    assert result.returncode == 0, result.stdout
    env = machine.environ(1)
    assert (env["MULTISLICE_SLICE"], env["MULTISLICE_WORKER"], env["MEGASCALE_SLICE_ID"]) == ("1", "1", "1")
    assert env["TPU_PROCESS_ADDRESSES"] == ",".join(f"{h}:8470" for h in hosts.split(","))
    source = "sorted names" if endpoints is None else "worker-network-endpoints"
    assert f"compute engine: worker 1 of slice 1 ({source}), hosts {hosts}, coordinator 10.0.0.4" in result.stdout
    assert "Google's numbering decides" not in result.stdout
    assert (env[contract.IDENTITY_ENV], env[contract.LOG_RESOURCE_ENV]) == ("environment", "gce_instance")


@pytest.mark.parametrize(
    "endpoints",
    ["unknown:unknown:10.1.0.3,unknown:unknown:10.1.0.7", SWAPPED, "multislice-dev-1-m4n5,multislice-dev-1-c8d2"],
    ids=["name-id-ip", "bare-ips", "hostnames"],
)
def test_where_google_numbers_the_vms_otherwise_its_numbering_decides_the_worker(machine, api, endpoints):
    """worker-network-endpoints in the other order than the sorted names (with this VM's
    agent-worker-number agreeing): this VM is worker 0, the hosts in Google's order, and the boot
    says so."""
    machine.metadata.update({contract.WORKER_ENDPOINTS_KEY: endpoints, contract.WORKER_NUMBER_KEY: "0"})
    fill(api, SLICE_0, SLICE_1)
    result = boot(machine, api)
    assert result.returncode == 0, result.stdout
    env = machine.environ(1)
    assert (env["TPU_WORKER_ID"], env["MULTISLICE_WORKER"]) == ("0", "0")
    assert env["TPU_WORKER_HOSTNAMES"] == "10.1.0.3:8471,10.1.0.7:8471"
    assert (
        f"compute engine: group {CE_GROUPS[1]}'s workers in worker-network-endpoints order are "
        f"{OWN},multislice-dev-1-c8d2, not their sorted names multislice-dev-1-c8d2,{OWN}: Google's numbering decides"
    ) in result.stdout
    assert f"compute engine: worker 0 of slice 1 (worker-network-endpoints), hosts {SWAPPED}," in result.stdout


def test_agent_worker_numbers_on_every_vm_decide_the_order_of_each_slice(machine, api):
    """Compute Engine's agent-worker-number on each VM (instances.get's metadata items): slice 1 and
    slice 0 in their numbers' order (so slice 0's worker 0, the coordinator, is its other VM)."""
    for group, vms, numbers in ((CE_GROUPS[0], SLICE_0, ("0", "1")), (CE_GROUPS[1], SLICE_1, ("1", "0"))):
        api.add_group(group)
        for (name, ip), number in zip(vms.items(), numbers, strict=True):
            api.add_vm(group, name, ip, metadata={contract.WORKER_NUMBER_KEY: number})
    machine.metadata.update({contract.WORKER_NUMBER_KEY: "0"})
    result = boot(machine, api)
    assert result.returncode == 0, result.stdout
    env = machine.environ(1)
    assert (env["TPU_WORKER_ID"], env["MEGASCALE_COORDINATOR_ADDRESS"]) == ("0", "10.0.0.5")  # dev-0-k2m9
    assert env["TPU_PROCESS_ADDRESSES"] == "10.1.0.3:8470,10.1.0.7:8470"
    assert "compute engine: worker 0 of slice 1 (Compute Engine's agent-worker-number), hosts 10.1.0.3,10.1.0.7, " in (
        result.stdout
    )


@pytest.mark.parametrize(
    ("keys", "numbers", "error"),
    [
        (
            {contract.WORKER_NUMBER_KEY: "0"},
            None,
            f"compute engine: metadata key agent-worker-number says this VM ({OWN}) is worker 0, but sorted names "
            f"make it worker 1 of group {CE_GROUPS[1]} (multislice-dev-1-c8d2,{OWN}); not starting the trainer",
        ),
        (
            {contract.WORKER_ENDPOINTS_KEY: "10.1.0.7,10.1.0.3,10.1.0.9"},
            None,
            f"compute engine: metadata key worker-network-endpoints (10.1.0.7,10.1.0.3,10.1.0.9) does not list each VM "
            f"of group {CE_GROUPS[1]} once (names multislice-dev-1-c8d2 {OWN}, IPs 10.1.0.7 10.1.0.3); not starting "
            "the trainer",
        ),
        (
            {contract.WORKER_ENDPOINTS_KEY: "10.1.0.7,10.1.0.7"},
            None,
            f"compute engine: metadata key worker-network-endpoints (10.1.0.7,10.1.0.7) does not list each VM of group "
            f"{CE_GROUPS[1]} once (names multislice-dev-1-c8d2 {OWN}, IPs 10.1.0.7 10.1.0.3); not starting the trainer",
        ),
        (
            {contract.WORKER_ENDPOINTS_KEY: "10.1.0.7"},
            None,
            f"compute engine: metadata key worker-network-endpoints (10.1.0.7) lists 1 VMs; group {CE_GROUPS[1]} has "
            "2; not starting the trainer",
        ),
        (
            {contract.WORKER_ENDPOINTS_KEY: "a:10.1.0.7,b:10.1.0.3"},
            None,
            "compute engine: metadata key worker-network-endpoints has the entry 'a:10.1.0.7', neither a host nor "
            "name:id:ip (the forms jax's cloud_tpu_cluster.py reads); not starting the trainer",
        ),
        (
            {contract.WORKER_ENDPOINTS_KEY: SWAPPED},
            ("0", "1"),
            f"compute engine: metadata key worker-network-endpoints orders group {CE_GROUPS[1]}'s VMs "
            f"{OWN},multislice-dev-1-c8d2, but their agent-worker-number orders them multislice-dev-1-c8d2,{OWN}; "
            "not starting the trainer",
        ),
        (
            {},
            ("1", ""),
            f"compute engine: Compute Engine numbered only some of group {CE_GROUPS[1]}'s VMs (agent-worker-number: "
            f"multislice-dev-1-c8d2=1, {OWN}=none); not starting the trainer",
        ),
        (
            {},
            ("1", "1"),
            f"compute engine: the agent-worker-number of group {CE_GROUPS[1]}'s VMs (multislice-dev-1-c8d2=1, "
            f"{OWN}=1) are not 0..1 each once; not starting the trainer",
        ),
    ],
    ids=[
        "worker",
        "extra-host",
        "twice",
        "short",
        "two-fields",
        "endpoints-vs-numbers",
        "some-numbered",
        "not-a-permutation",
    ],
)
def test_values_no_format_explains_stop_the_boot_with_one_line(machine, api, keys, numbers, error):
    machine.metadata.update(keys)
    api.add_group(CE_GROUPS[0])
    for name, ip in SLICE_0.items():
        api.add_vm(CE_GROUPS[0], name, ip)
    api.add_group(CE_GROUPS[1])
    for (name, ip), number in zip(SLICE_1.items(), numbers or ("", ""), strict=True):
        api.add_vm(CE_GROUPS[1], name, ip, metadata={contract.WORKER_NUMBER_KEY: number} if number else None)
    result = boot(machine, api)
    assert result.returncode == 1, result.stdout
    errors = [line for line in result.stdout.splitlines() if "error: " in line]
    assert errors == [f"[slice 1 worker ?] error: {error}"]
    assert machine.attempts == 0


#: The trainer's TPU environment per slice size, written out by hand: tpu-operator's sample for 2
#: VMs of TPU7x 2x2x2 (its README, "Step 4"), and the same derivation (docs/compute-engine.md,
#: section 4b) for one 8-chip v6e VM (2x4) and 4 v6e VMs of 4 chips (4x4).
TPU_ENVIRONMENTS = {
    "tpu7x-16": {
        "JAX_PLATFORMS": "tpu",
        "TPU_TOPOLOGY": "2x2x2",
        "TPU_HOST_BOUNDS": "1,1,2",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TPU_PROCESS_PORT": "8470",
        "TPU_RUNTIME_METRICS_PORTS": "8431,8432,8433,8434",
    },
    "v6e-8": {
        "JAX_PLATFORMS": "tpu",
        "TPU_TOPOLOGY": "2x4",
        "TPU_HOST_BOUNDS": "1,1,1",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,4,1",
        "TPU_PROCESS_PORT": "8470",
        "TPU_RUNTIME_METRICS_PORTS": "8431,8432,8433,8434,8435,8436,8437,8438",
    },
    "v6e-16": {
        "JAX_PLATFORMS": "tpu",
        "TPU_TOPOLOGY": "4x4",
        "TPU_HOST_BOUNDS": "2,2,1",
        "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1",
        "TPU_PROCESS_PORT": "8470",
        "TPU_RUNTIME_METRICS_PORTS": "8431,8432,8433,8434",
    },
}


@pytest.mark.parametrize("accelerator", sorted(TPU_ENVIRONMENTS))
def test_the_trainer_gets_the_tpu_environment_of_googles_sample(tmp_path, gcs, api, accelerator):
    """1, 2 and 4 VMs a slice: the instance template's metadata (the program under mocks) on the
    VM, the boot exports it with the slice's addresses in worker order, as tpu-operator's sample
    sets them: TPU_PROCESS_ADDRESSES on port 8470 and TPU_WORKER_HOSTNAMES on 8471."""
    from tests.fakes.pulumi_program import evaluate
    from tests.helpers.compute_engine import SHAPES, TEMPLATE, ce_map

    stack = ce_map(accelerator, slices=1)
    template = evaluate("dev", stack).one(TEMPLATE).inputs
    vms = SHAPES[accelerator][2]
    names = [f"multislice-dev-0-{chr(97 + i) * 4}" for i in range(vms)]
    ips = [f"10.0.0.{10 + i}" for i in range(vms)]
    api.add_group(CE_GROUPS[0])
    for name, ip in zip(names, ips, strict=True):
        api.add_vm(CE_GROUPS[0], name, ip)
    from infra import startup
    from infra.config import validate_stack

    script = startup.render(validate_stack("dev", stack, "tests"))
    vm = compute_engine_vm(
        tmp_path,
        script.text,
        gcs,
        name=names[-1],
        slice_id=0,
        workers_per_slice=vms,
        accelerator=accelerator,
        tpu_env=template["metadata"][contract.COMPUTE_ENGINE_TPU_ENV_KEY],
    )
    vm.metadata.update({contract.INSTANCE_GROUPS_KEY: CE_GROUPS[0]})
    with vm.metadata:
        result = boot(vm, api, wait_s=20)
    assert result.returncode == 0, result.stdout
    env = vm.environ(1)
    assert {name: env[name] for name in TPU_ENVIRONMENTS[accelerator]} == TPU_ENVIRONMENTS[accelerator]
    assert env["TPU_WORKER_ID"] == str(vms - 1)
    assert env["TPU_PROCESS_ADDRESSES"] == ",".join(f"{ip}:8470" for ip in ips)
    assert env["TPU_WORKER_HOSTNAMES"] == ",".join(f"{ip}:8471" for ip in ips)
    # What the trainer makes of it (training/cluster.py reads TPU_PROCESS_ADDRESSES first, as JAX).
    identity = cluster.identity_from_environment(env)
    assert (identity.process_id, identity.num_processes, identity.coordinator_address) == (
        vms - 1,
        vms,
        f"{ips[0]}:8482",
    )


def boot_with_tpu_env(tmp_path, ce_script, gcs, api, tpu_env: str | None):
    """Boot worker 1 of slice 1 (both slices listed) with ``tpu_env`` as its template's
    ``multislice-tpu-env`` (None: a template without the key); the VM and the boot's result."""
    vm = compute_engine_vm(tmp_path, ce_script.text, gcs, name=OWN, slice_id=1, workers_per_slice=2, tpu_env=tpu_env)
    fill(api, SLICE_0, SLICE_1)
    with vm.metadata:
        return vm, boot(vm, api)


def test_a_vm_of_an_older_template_boots_without_the_tpu_environment(tmp_path, ce_script, gcs, api):
    """A running VM that its release watch moves to this release was created from a template
    without the TPU environment: it says so and starts the trainer with the identity alone."""
    vm, result = boot_with_tpu_env(tmp_path, ce_script, gcs, api, None)
    assert result.returncode == 0, result.stdout
    assert "metadata key multislice-tpu-env is absent (a VM created from an older instance template)" in result.stdout
    assert "TPU_TOPOLOGY" not in vm.environ(1) and vm.environ(1)["TPU_WORKER_ID"] == "1"


@pytest.mark.parametrize(
    "tpu_env",
    ["PATH=/tmp/x TPU_TOPOLOGY=2x2x2", "TPU_TOPOLOGY=2x2x2 JAX_PLATFORMS=tpu;true", "LD_PRELOAD=/tmp/x.so"],
)
def test_a_tpu_environment_of_other_names_or_characters_is_refused(tmp_path, ce_script, gcs, api, tpu_env):
    """Only TPU_* and JAX_PLATFORMS, with plain values, reach the trainer's unit from the metadata."""
    vm, result = boot_with_tpu_env(tmp_path, ce_script, gcs, api, tpu_env)
    assert result.returncode == 1, result.stdout
    assert "error: metadata key multislice-tpu-env: malformed value" in result.stdout
    assert vm.attempts == 0


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

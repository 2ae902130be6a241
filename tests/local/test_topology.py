"""infra.local.topology: the metadata and environment each emulated TPU VM gets. The node
names are the stack's real ones (StackConfig.node_ids), and the trainer's own metadata reader
(training.cluster) finds each VM's place in the queued resource from them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra import vm_contract as contract
from infra.backends.compute_engine import emulation as ce_emulation
from infra.config import StackConfig, load_stack_file
from infra.emulated.gcs import client_env
from infra.emulated.metadata import MetadataServer
from infra.emulated.state import EMULATION_ID_ENV, LocalPaths
from infra.local import topology
from tests.helpers.compute_engine import on_cpu
from training import cluster

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"


def stack(tmp_path: Path, *, accelerator: str = "v4-8", slices: int = 2, ici_fsdp: int = 4) -> StackConfig:
    """The emu stack with another shape (dcn data = slices)."""
    text = STACK.read_text()
    text = text.replace("multislice:acceleratorType: v4-8", f"multislice:acceleratorType: {accelerator}")
    text = text.replace("multislice:slices: 2", f"multislice:slices: {slices}")
    text = text.replace("ici: {data: 1, fsdp: 4, tensor: 1}", f"ici: {{data: 1, fsdp: {ici_fsdp}, tensor: 1}}")
    text = text.replace("dcn: {data: 2, fsdp: 1, tensor: 1}", f"dcn: {{data: {slices}, fsdp: 1, tensor: 1}}")
    text = text.replace("global_batch_size: 8", f"global_batch_size: {slices * ici_fsdp * 2}")
    path = tmp_path / "Pulumi.emu.yaml"
    path.write_text(text)
    return load_stack_file(path)


def identity_seen_by_the_trainer(attributes: dict[str, str], monkeypatch) -> cluster.ClusterIdentity:
    with MetadataServer(attributes) as server:
        monkeypatch.setenv("GCE_METADATA_IP", server.address)
        monkeypatch.setenv("MULTISLICE_COORDINATOR_PORT", "1234")
        return cluster.identity_from_metadata()


@pytest.mark.parametrize(("accelerator", "slices", "ici_fsdp"), [("v4-8", 2, 4), ("v4-16", 3, 8), ("v4-8", 1, 4)])
def test_every_vm_is_named_and_placed_as_on_cloud_tpu(tmp_path, monkeypatch, accelerator, slices, ici_fsdp):
    config = stack(tmp_path, accelerator=accelerator, slices=slices, ici_fsdp=ici_fsdp)
    hosts = config.accelerator.hosts
    assert len(config.node_ids) == slices  # the names the real queued resource's nodes get
    for slice_id in range(slices):
        node = config.node_ids[slice_id]
        for worker in range(hosts):
            attributes = topology.vm_metadata(config, slice_id, worker, startup_script="echo hi", run_dir="/r")
            tpu_env = cluster.parse_tpu_env(attributes["tpu-env"])
            assert tpu_env["NODE_ID"] == node
            assert tpu_env["WORKER_ID"] == str(worker)
            assert attributes["worker-network-endpoints"].split(",") == [
                f"{node}-w-{i}:{i}:127.0.0.1" for i in range(hosts)
            ]
            assert (attributes["startup-script"], attributes["multislice-run-dir"]) == ("echo hi", "/r")
            assert attributes["accelerator-type"] == accelerator
            identity = identity_seen_by_the_trainer(attributes, monkeypatch)
            assert (identity.slice_id, identity.worker) == (slice_id, worker)
            assert (identity.num_slices, identity.workers_per_slice) == (slices, hosts)
            assert identity.coordinator_address == "127.0.0.1:1234"
            assert identity.accelerator_type == accelerator


def test_one_slice_has_no_megascale_settings(tmp_path):
    config = stack(tmp_path, slices=1)
    tpu_env = cluster.parse_tpu_env(topology.vm_metadata(config, 0, 0, startup_script="", run_dir="/r")["tpu-env"])
    assert not [key for key in tpu_env if key.startswith("MEGASCALE_")]
    assert tpu_env["NODE_ID"] == config.queued_resource_id  # one slice: the node id is the QR id


@pytest.mark.parametrize(
    ("capacity", "key", "expected"),
    [
        ("spot", None, True),
        ("on-demand", None, True),
        ("reserved", None, False),
        ("spot", False, False),
        ("reserved", True, True),
    ],
)
def test_delete_on_complete_names_the_queued_resource_as_pulumi_up_does(tmp_path, capacity, key, expected):
    from infra.backends.queued_resource.program import queued_resource_inputs
    from infra.startup import render
    from infra.vm_contract import DELETE_QUEUED_RESOURCE_KEY

    path = tmp_path / "Pulumi.emu.yaml"
    variant = STACK.read_text().replace("multislice:capacity: spot", f"multislice:capacity: {capacity}")
    if capacity == "reserved":
        variant += "  multislice:reservationName: my-reservation\n"
    if key is not None:
        variant += f"  multislice:queuedResource: {{deleteOnComplete: {str(key).lower()}}}\n"
    path.write_text(variant)
    config = load_stack_file(path)
    assert config.delete_on_complete is expected
    inputs = queued_resource_inputs(config, render(config), network="n", subnetwork="s", service_account="a", tags=[])
    pulumi_sets = inputs.metadata.get(DELETE_QUEUED_RESOURCE_KEY)  # the nodes' metadata on Cloud TPU
    for slice_id in range(config.slices):
        attributes = topology.vm_metadata(config, slice_id, 0, startup_script="", run_dir=config.run_dir)
        assert attributes.get(DELETE_QUEUED_RESOURCE_KEY) == pulumi_sets
    if expected:
        assert (
            pulumi_sets
            == f"projects/{config.project}/locations/{config.zone}/queuedResources/{config.queued_resource_id}"
        )
    else:
        assert pulumi_sets is None


def test_the_vm_environment(tmp_path, monkeypatch):
    config = stack(tmp_path)
    for inherited in (
        "JAX_PLATFORMS",
        "XLA_FLAGS",
        "TPU_NAME",
        "MEGASCALE_SLICE_ID",
        "GCE_METADATA_IP",
        "MULTISLICE_HOME",
    ):
        monkeypatch.setenv(inherited, "from-the-host")
    monkeypatch.delenv(topology.VM_XLA_FLAGS_ENV, raising=False)  # the tests' own (tests/conftest.py)
    monkeypatch.setenv("SOME_USER_SETTING", "kept")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")  # e.g. another emulation's
    storage = client_env("http://127.0.0.1:4443")
    env = topology.vm_environment(
        config, emulation_id="abc", coordinator_port=4321, heartbeat_timeout_s=7, init_timeout_s=99, storage_env=storage
    )
    assert env["SOME_USER_SETTING"] == "kept"
    assert "XLA_FLAGS" not in env and "TPU_NAME" not in env and "MEGASCALE_SLICE_ID" not in env
    assert "GCE_METADATA_IP" not in env and "MULTISLICE_HOME" not in env  # the VM sets its own
    assert env[EMULATION_ID_ENV] == "abc"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["JAX_NUM_CPU_DEVICES"] == str(config.accelerator.chips_per_host)
    assert env["MULTISLICE_PYTHON"] == sys.executable
    assert (
        env["MULTISLICE_COORDINATOR_PORT"],
        env["MULTISLICE_HEARTBEAT_TIMEOUT_S"],
        env["MULTISLICE_INIT_TIMEOUT_S"],
    ) == ("4321", "7", "99")
    # The trainer's storage clients reach the emulated Cloud Storage (infra.emulated.gcs).
    assert env["STORAGE_EMULATOR_HOST"] == env["TENSORSTORE_GCS_HTTP_URL"] == "http://127.0.0.1:4443"
    assert {key: env[key] for key in storage} == storage


def test_a_shared_compilation_cache_is_passed_on_to_the_vms(tmp_path, monkeypatch):
    from training.compile_cache import SHARED_DIR_ENV

    config = stack(tmp_path)
    kwargs = dict(emulation_id="abc", coordinator_port=4321, heartbeat_timeout_s=7, init_timeout_s=99, storage_env={})
    monkeypatch.delenv(SHARED_DIR_ENV, raising=False)
    assert SHARED_DIR_ENV not in topology.vm_environment(config, **kwargs)
    monkeypatch.setenv(SHARED_DIR_ENV, str(tmp_path / "cache"))
    assert topology.vm_environment(config, **kwargs)[SHARED_DIR_ENV] == str(tmp_path / "cache")
    assert topology.SHARED_COMPILATION_CACHE_ENV == SHARED_DIR_ENV  # infra/ names the trainer's variable


def test_the_vms_xla_flags_are_the_ones_named_for_them_never_the_hosts(tmp_path, monkeypatch):
    config = stack(tmp_path)
    kwargs = dict(emulation_id="abc", coordinator_port=4321, heartbeat_timeout_s=7, init_timeout_s=99, storage_env={})
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/host")
    monkeypatch.delenv(topology.VM_XLA_FLAGS_ENV, raising=False)
    assert "XLA_FLAGS" not in topology.vm_environment(config, **kwargs)
    monkeypatch.setenv(topology.VM_XLA_FLAGS_ENV, "--xla_cpu_multi_thread_eigen=false")
    env = topology.vm_environment(config, **kwargs)
    assert env["XLA_FLAGS"] == "--xla_cpu_multi_thread_eigen=false"
    assert topology.VM_XLA_FLAGS_ENV not in env  # a MULTISLICE_ setting of the host's


def test_vms_keep_their_bytecode_where_this_machine_does_not_write_it(tmp_path, monkeypatch):
    config = stack(tmp_path)
    kwargs = dict(
        emulation_id="abc",
        coordinator_port=4321,
        heartbeat_timeout_s=7,
        init_timeout_s=99,
        storage_env={},
        paths=LocalPaths(tmp_path),
    )
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    env = topology.vm_environment(config, **kwargs)
    assert "PYTHONDONTWRITEBYTECODE" not in env and env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "bytecode")
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "mine"))  # the user's own prefix is kept
    env = topology.vm_environment(config, **kwargs)
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path / "mine")
    monkeypatch.delenv("PYTHONPYCACHEPREFIX")
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")  # Python's default: __pycache__ next to the sources
    env = topology.vm_environment(config, **kwargs)
    assert "PYTHONPYCACHEPREFIX" not in env and "PYTHONDONTWRITEBYTECODE" not in env


def test_the_vms_python3_is_the_interpreter_behind_this_machine_s_shim(tmp_path, monkeypatch):
    """A ``python3`` that is a script (pyenv's shim) is asked once for its interpreter, which the
    VMs' ``PATH`` then offers first; a ``python3`` that is the interpreter, none, or a script that
    fails leave ``PATH`` as it was and write nothing."""
    config = stack(tmp_path)
    kwargs = dict(emulation_id="abc", coordinator_port=4321, heartbeat_timeout_s=7, init_timeout_s=99, storage_env={})
    paths = LocalPaths(tmp_path / "emu")
    shims, binaries = tmp_path / "shims", tmp_path / "binaries"
    shims.mkdir()
    binaries.mkdir()
    (shims / "python3").write_text(f'#!/bin/bash\nexec {sys.executable} "$@"\n')
    (shims / "python3").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}/usr/bin{os.pathsep}/bin")
    env = topology.vm_environment(config, **kwargs, paths=paths)
    assert env["PATH"] == f"{paths.python3_dir}{os.pathsep}{shims}{os.pathsep}/usr/bin{os.pathsep}/bin"
    assert shutil.which("python3", path=env["PATH"]) == str(paths.python3_dir / "python3")
    assert os.readlink(paths.python3_dir / "python3") == sys.executable  # what the shim ran
    ran = subprocess.run(["python3", "-c", "print(6 * 7)"], env=env, capture_output=True, text=True, check=True)
    assert ran.stdout == "42\n"

    shutil.rmtree(paths.python3_dir)
    (binaries / "python3").symlink_to(sys.executable)  # the interpreter itself
    (shims / "python3").write_text("#!/bin/bash\nexit 1\n")  # a shim that finds no interpreter
    for path in (f"{binaries}{os.pathsep}/bin", str(shims), str(tmp_path / "nowhere")):
        monkeypatch.setenv("PATH", path)
        assert topology.vm_environment(config, **kwargs, paths=paths)["PATH"] == path
        assert not paths.python3_dir.exists()


# The compute-engine backend --------------------------------------------------------------------


def test_a_compute_engine_vm_gets_the_template_s_and_group_s_keys_and_none_of_cloud_tpu_s(tmp_path):
    config = stack(tmp_path, accelerator="v4-16", slices=2, ici_fsdp=8).model_copy(
        update={"backend": contract.COMPUTE_ENGINE_BACKEND}
    )  # 2 slices × 2 workers
    attributes = topology.vm_metadata(config, 1, 1, startup_script="#!/bin/bash", run_dir=config.run_dir)
    assert attributes == {
        contract.STARTUP_SCRIPT_KEY: "#!/bin/bash",
        contract.RUN_DIR_KEY: config.run_dir,
        contract.BACKEND_KEY: "compute-engine",
        contract.INSTANCE_GROUPS_KEY: "multislice-emu-0,multislice-emu-1",
        contract.SLICE_ID_KEY: "1",
        contract.WORKERS_PER_SLICE_KEY: "2",
        contract.COMPUTE_ENGINE_ACCELERATOR_KEY: "v4-16",
        # v4-16: 8 chips in a 2x2x2 cube, 2 hosts of 2x2x1 chips stacked along z (4 chips a host,
        # one runtime-metrics port each from 8431), as Google's tpu-operator sample writes it
        contract.COMPUTE_ENGINE_TPU_ENV_KEY: (
            "TPU_TOPOLOGY=2x2x2 TPU_HOST_BOUNDS=1,1,2 TPU_CHIPS_PER_HOST_BOUNDS=2,2,1 "
            "TPU_PROCESS_PORT=8470 TPU_RUNTIME_METRICS_PORTS=8431,8432,8433,8434"
        ),
    }  # no deleteOnComplete key either: not built on this backend
    values = ce_emulation.compute_engine_values(config, "multislice-emu-1-ab12")
    assert values == {
        "instance/name": "multislice-emu-1-ab12",
        "instance/zone": f"projects/{ce_emulation.EMULATED_PROJECT_NUMBER}/zones/us-central2-b",
        "project/project-id": "multislice-tests",
    }


def test_compute_engine_names_are_a_mig_s_sorted_per_slice(tmp_path):
    import random
    import re

    config = stack(tmp_path, accelerator="v4-16", slices=2, ici_fsdp=8)
    names = ce_emulation.compute_engine_names(config, random.Random(7))
    assert len(names) == 2
    for group, vms in zip(config.node_ids, names, strict=True):
        assert len(vms) == 2 and vms == sorted(set(vms))
        assert all(re.fullmatch(rf"{group}-[a-z0-9]{{4}}", name) for name in vms), vms


def test_an_emulated_compute_engine_vm_has_the_metadata_the_program_declares():
    """The emulation's VM metadata is the program's template metadata plus its group's."""
    from infra import startup
    from infra.backends.compute_engine import program as ce_program
    from infra.config import validate_stack
    from tests.helpers.compute_engine import ce_map

    config = validate_stack("dev", ce_map("v5p-16", slices=2), "test")
    script = startup.render(config)
    inputs = ce_program.compute_engine_inputs(
        config, script, network="n", subnetwork="s", service_account="a", tags=["t"]
    )
    for slice_id in range(config.slices):
        emulated = topology.vm_metadata(config, slice_id, 0, startup_script=script.text, run_dir=config.run_dir)
        assert emulated == on_cpu(inputs.template_metadata() | inputs.group_metadata(slice_id))

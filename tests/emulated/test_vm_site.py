"""infra/emulated/vm_site/sitecustomize.py: in an emulated VM, JAX's own cluster detection (what
``jax.distributed.initialize()`` without arguments runs) finds the job from the VM's metadata
server, as GceTpuCluster does on a TPU VM; elsewhere it changes nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from infra import vm_contract as contract
from infra.backends.compute_engine import emulation as ce_emulation
from infra.config import load_stack_file
from infra.emulated.metadata import MetadataServer
from infra.emulated.ports import free_port
from infra.local import topology

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu-command.yaml"

DETECT = """
import json
from jax._src import clusters
from jax._src.clusters import cloud_tpu_cluster  # noqa: F401 (jax.distributed imports it too)
found = clusters.ClusterEnv.auto_detect_unset_distributed_params(None, None, None, None, None, 10)
print(json.dumps(list(found)))
"""


def detect(env: dict[str, str]) -> list:
    result = subprocess.run([sys.executable, "-c", DETECT], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_the_emulated_job_is_detected_through_the_metadata_server():
    config = load_stack_file(STACK)  # 2 slices × 1 worker of v4-8
    attributes = topology.vm_metadata(config, 1, 0, startup_script="", run_dir=config.run_dir)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "MULTISLICE_", "GCE_", "TPU_"))}
    with MetadataServer(attributes) as server:
        env = {
            **base,
            "PYTHONPATH": str(topology.VM_SITE_DIR),
            topology.EMULATED_TPU_ENV: "1",
            "JAX_COORDINATOR_PORT": "12345",
            "GCE_METADATA_IP": server.address,
            "JAX_PLATFORMS": "cpu",
        }
        # Slice 1's only worker: process 1 of 2; the coordinator is the MEGASCALE host, on the port given.
        assert detect(env) == ["127.0.0.1:12345", 2, 1, None]
        # Outside an emulated VM nothing is detected (JAX's own environments only).
        assert detect({**env, topology.EMULATED_TPU_ENV: ""}) == [None, None, None, None]


def vm_env(base: dict[str, str], server: MetadataServer | None, home: Path, port: int) -> dict[str, str]:
    """An emulated VM's environment as the emulator gives it (topology.vm_environment's JAX part)."""
    return {
        **base,
        "PYTHONPATH": str(topology.VM_SITE_DIR),
        topology.EMULATED_TPU_ENV: "1",
        "JAX_COORDINATOR_PORT": str(port),
        "GCE_METADATA_IP": server.address if server else "127.0.0.1:9",  # port 9: nothing answers
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": "4",
        "MULTISLICE_HOME": str(home),
        topology.EMULATED_SLICES_ENV: "2",
    }


def clean_base() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "MULTISLICE_", "GCE_", "TPU_", "XLA_"))}


#: The Multislice overview's shardings.py does not call jax.distributed.initialize(): on Cloud TPU
#: the runtime finds every host of every slice. Neither does this program.
NO_INITIALIZE = """
import json, jax
counts = [jax.device_count(), jax.local_device_count(), jax.process_count(), jax.process_index()]
print(json.dumps(counts + [[d.slice_index for d in jax.devices()]]))
"""
#: Each emulated chip's slice (point 4): slice 0's VM owns devices 0-3, slice 1's devices 4-7.
SLICES = [0] * 4 + [1] * 4


def test_a_program_that_never_initializes_sees_every_chip_of_every_slice(tmp_path):
    config = load_stack_file(STACK)  # 2 slices × 1 worker of v4-8: 8 chips, 4 per VM
    port = free_port()
    servers = [
        MetadataServer(topology.vm_metadata(config, s, 0, startup_script="", run_dir=config.run_dir)) for s in (0, 1)
    ]
    with servers[0], servers[1]:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", NO_INITIALIZE],
                env=vm_env(clean_base(), servers[s], tmp_path / f"vm{s}", port),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for s in (0, 1)
        ]
        outputs = [p.communicate(timeout=240) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    seen = sorted(json.loads(out.splitlines()[-1]) for out, _ in outputs)
    assert seen == [[8, 4, 2, 0, SLICES], [8, 4, 2, 1, SLICES]]


#: A program that joins its job with arguments, as the trainer does, then reports each device's
#: process and slice.
JOINED = """
import json, sys, jax
jax.distributed.initialize(coordinator_address=sys.argv[1], num_processes=int(sys.argv[2]), process_id=int(sys.argv[3]))
print(json.dumps([[d.process_index, getattr(d, "slice_index", None)] for d in jax.devices()]))
"""


def run_joined(tmp_path: Path, processes: int, slices: int) -> list:
    """Every process's report of :data:`JOINED` in a job of ``processes`` emulated VMs (2 chips
    each) whose environment names ``slices`` slices."""
    address = f"127.0.0.1:{free_port()}"
    procs = []
    for index in range(processes):
        env = {**vm_env(clean_base(), None, tmp_path / f"vm{index}", 9), "JAX_NUM_CPU_DEVICES": "2"}
        env[topology.EMULATED_SLICES_ENV] = str(slices)
        command = [sys.executable, "-c", JOINED, address, str(processes), str(index)]
        procs.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=240) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    return [json.loads(out.splitlines()[-1]) for out, _ in outputs]


def test_each_chip_carries_the_slice_of_the_vm_that_owns_it(tmp_path):
    # 2 slices × 2 workers: processes 0-1 are slice 0's VMs, 2-3 slice 1's (JAX numbers a job's
    # processes slice after slice); every process sees the same.
    seen = run_joined(tmp_path, 4, 2)
    assert seen == [[[p, p // 2] for p in (0, 0, 1, 1, 2, 2, 3, 3)]] * 4
    # Processes that do not split evenly into the slices keep what XLA's CPU client says (one
    # slice per host: 0 on this machine).
    assert run_joined(tmp_path / "uneven", 3, 2) == [[[p, 0] for p in (0, 0, 1, 1, 2, 2)]] * 3


HOLD = """
import sys, time, jax
jax.devices()
print("holding", flush=True)
time.sleep(300)
"""

USE = """
import sys, jax
if sys.argv[1] == "initialize":
    jax.distributed.initialize(coordinator_address="127.0.0.1:9", num_processes=2, process_id=1,
                               initialization_timeout=5)
print(len(jax.devices()))
"""


def test_the_chips_belong_to_one_process_of_the_vm_as_libtpu_s_lock_makes_them(tmp_path):
    # A process holds the VM's chips (as the run's trainer does); a second JAX process on the same
    # VM, whether it only asks for devices or first tries to join a job, fails at once with
    # libtpu's message naming the holder, and never contacts any coordinator. Once the holder is
    # gone (even killed), the chips are free again. Without metadata (port 9) nothing is joined.
    env = vm_env(clean_base(), None, tmp_path / "vm", free_port())
    holder = subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        for mode in ("devices", "initialize"):
            second = subprocess.run(
                [sys.executable, "-c", USE, mode], env=env, capture_output=True, text=True, timeout=60
            )
            assert second.returncode != 0
            assert f"The TPU is already in use by process with pid {holder.pid}" in second.stderr, second.stderr
            assert "multislice local down" in second.stderr
    finally:
        holder.kill()
        holder.wait()
    after = subprocess.run([sys.executable, "-c", USE, "devices"], env=env, capture_output=True, text=True, timeout=60)
    assert after.returncode == 0 and after.stdout.split()[-1] == "4", after.stderr
    # Another VM (its own local disk) has chips of its own.
    other = vm_env(clean_base(), None, tmp_path / "other-vm", free_port())
    holder = subprocess.Popen([sys.executable, "-c", HOLD], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        elsewhere = subprocess.run(
            [sys.executable, "-c", USE, "devices"], env=other, capture_output=True, text=True, timeout=60
        )
        assert elsewhere.returncode == 0, elsewhere.stderr
    finally:
        holder.kill()
        holder.wait()


def test_the_hook_names_the_vm_s_disk_as_the_contract_does():
    # sitecustomize.py imports nothing of infra/ (it runs in every Python of a VM), so it spells
    # the variable itself.
    spec = importlib.util.spec_from_file_location("vm_sitecustomize", topology.VM_SITE_DIR / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.HOME_ENV == contract.HOME_ENV


# The compute-engine backend: no Cloud TPU metadata; boot.sh gives the trainer's unit the identity
# in the environment, as GKE gives it to a TPU Pod, and JAX's GkeTpuCluster reads it there.
def compute_engine_vm(config, slice_id: int) -> tuple[MetadataServer, dict[str, str]]:
    """An emulated compute-engine VM of ``config`` (1 worker a slice): its metadata server and the
    identity its boot.sh writes into the unit (worker 0 of its slice, every host 127.0.0.1)."""
    name = ce_emulation.compute_engine_names(config)[slice_id][0]
    server = MetadataServer(
        ce_emulation.compute_engine_metadata(config, slice_id, startup_script="", run_dir=config.run_dir),
        ce_emulation.compute_engine_values(config, name),
    )
    identity = {
        "TPU_WORKER_ID": "0",
        "TPU_WORKER_HOSTNAMES": ce_emulation.EMULATED_VM_IP,
        "MEGASCALE_COORDINATOR_ADDRESS": ce_emulation.EMULATED_VM_IP,
        "MEGASCALE_NUM_SLICES": str(config.slices),
        "MEGASCALE_SLICE_ID": str(slice_id),
    }
    return server, identity


def compute_engine_stack():
    return load_stack_file(STACK).model_copy(update={"backend": contract.COMPUTE_ENGINE_BACKEND})


def test_a_compute_engine_vm_s_job_is_detected_from_the_environment():
    config = compute_engine_stack()  # 2 slices × 1 worker of v4-8
    server, identity = compute_engine_vm(config, 1)
    assert contract.WORKER_NUMBER_KEY not in server.attributes and contract.TPU_ENV_KEY not in server.attributes
    with server:
        env = {
            **clean_base(),
            "PYTHONPATH": str(topology.VM_SITE_DIR),
            topology.EMULATED_TPU_ENV: "1",
            "JAX_COORDINATOR_PORT": "12345",
            "GCE_METADATA_IP": server.address,
            "JAX_PLATFORMS": "cpu",
            **identity,
        }
        # Slice 1's only worker: process 1 × 1 + 0 of 2 (BaseTpuCluster.get_process_id), the
        # coordinator the MEGASCALE host, on the port given.
        assert detect(env) == ["127.0.0.1:12345", 2, 1, None]
        # Without the identity in the environment (and no Cloud TPU keys) nothing is detected.
        assert detect({k: v for k, v in env.items() if k not in identity}) == [None, None, None, None]


def test_a_program_that_never_initializes_sees_every_chip_on_compute_engine(tmp_path):
    config = compute_engine_stack()  # 8 chips, 4 per VM
    port = free_port()
    vms = [compute_engine_vm(config, s) for s in (0, 1)]
    with vms[0][0], vms[1][0]:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", NO_INITIALIZE],
                env={**vm_env(clean_base(), vms[s][0], tmp_path / f"vm{s}", port), **vms[s][1]},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for s in (0, 1)
        ]
        outputs = [p.communicate(timeout=240) for p in procs]
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
    seen = sorted(json.loads(out.splitlines()[-1]) for out, _ in outputs)
    assert seen == [[8, 4, 2, 0, SLICES], [8, 4, 2, 1, SLICES]]

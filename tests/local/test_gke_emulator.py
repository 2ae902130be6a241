"""infra.local.emulated_stack on a ``multislice:backend: gke`` stack, without a trainer: each Pod's
container runs a stand-in startup script as ``/bin/bash`` (no systemd) with the environment GKE and
the JobSet give it, the kubelet's SIGTERM reaches that process, its node's folder is mounted
non-executable for it as a GKE node mounts it, and a repair starts every Pod again in a new container
(the failed slice's on new nodes), as JobSet recreates every Job after a failure (docs/gke.md sections 4
to 6), and so does a reset (the JobSet suspended and resumed)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from infra import vm_contract as contract
from infra.backends.gke.emulation import request_reset
from infra.emulated import node_mounts
from infra.emulated.service_manager import session_pids
from infra.local.emulated_stack import Options
from tests.helpers.emulation import gke_stack
from tests.helpers.standin_vms import boot_log, booted, running, wait_until_up


@pytest.fixture
def pods(tmp_path):
    with booted(gke_stack(tmp_path), tmp_path) as resource:
        yield resource


def test_every_pod_runs_the_script_as_its_first_process_with_gkes_environment(pods):
    config = pods.config
    assert [(vm.slice_id, vm.worker) for vm in pods.vms] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for vm in pods.vms:
        (container,) = psutil.Process(vm.pgid).children()  # the lifeline's one child: /bin/bash script
        assert container.cmdline()[:2] == ["/bin/bash", str(vm.home / "startup-script")]
        env = container.environ()
        assert {key: env.get(key) for key in ("TPU_WORKER_ID", "MEGASCALE_SLICE_ID", "TPU_WORKER_HOSTNAMES")} == {
            "TPU_WORKER_ID": str(vm.worker),
            "MEGASCALE_SLICE_ID": str(vm.slice_id),
            "TPU_WORKER_HOSTNAMES": "127.0.0.1,127.0.0.1",
        }
        assert env["MEGASCALE_NUM_SLICES"] == "2" and env[contract.RUN_DIR_ENV] == config.run_dir
        assert env[contract.NODE_CACHE_ENV] == str(vm.node_cache) and env[contract.HOME_ENV] == str(vm.home)
        assert not (vm.home / "run").exists() and not vm.unit_dir.exists()  # no systemd in a container


def mount_options(pid: int, folder: Path) -> set[str] | None:
    """The per-mount options of the mount at ``folder`` as process ``pid`` sees it (proc(5),
    /proc/PID/mountinfo: field 5 the mount point, field 6 its options); None: no mount there."""
    for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == str(folder):
            return set(fields[5].split(","))
    return None


def test_each_pods_node_folder_is_non_executable_for_it_alone(pods):
    problem = node_mounts.noexec_problem()
    if problem is not None:
        pytest.skip(f"this machine cannot mount a folder non-executable for a process: {problem}")
    assert pods.workers.node_line is not None and "mounted non-executable" in pods.workers.node_line
    for vm in pods.vms:
        (container,) = psutil.Process(vm.pgid).children()
        assert "noexec" in (mount_options(container.pid, vm.node_cache) or set()), vm.name
        assert mount_options(container.pid, vm.home) is None  # the container's own files: executable
        assert mount_options(os.getpid(), vm.node_cache) is None  # this machine's view is unchanged


def write_node_and_container_files(pods) -> None:
    """A file in each Pod's node cache (MULTISLICE_NODE_CACHE, a hostPath) and in its container (its
    MULTISLICE_HOME: the releases and virtualenvs unpacked there, its /tmp)."""
    for vm in pods.vms:
        (vm.node_cache / "venvs").mkdir(parents=True, exist_ok=True)
        (vm.node_cache / "venvs" / "node-file").write_text(f"slice {vm.slice_id}")
        (vm.home / "releases").mkdir(exist_ok=True)
        (vm.home / "releases" / "container-file").write_text(f"slice {vm.slice_id}")


def kept(pods, path: str) -> list[str]:
    return [vm.name for vm in pods.vms if (vm.home / path).exists() or (vm.node_cache / path).exists()]


def test_a_repair_starts_every_pod_again_and_the_surviving_nodes_keep_their_cache(pods):
    write_node_and_container_files(pods)
    before = {vm.name: vm.pgid for vm in pods.vms}
    pods.repairs.repair(1, Options(reboot_grace_s=120))
    # JobSet recreates every Job: every Pod is new (no container file is left), but only the failed
    # slice's nodes are new: slice 0's nodes keep the virtualenvs' archives their boots made.
    assert kept(pods, "releases/container-file") == []
    assert kept(pods, "venvs/node-file") == ["slice 0 worker 0", "slice 0 worker 1"]
    assert not [name for name, pid in before.items() if running(pid)]
    slice0 = pods.vms[0]
    # The kubelet's SIGTERM reached the container's script (through the lifeline, which passes it on).
    assert "got SIGTERM" in boot_log(slice0.log_path, 1)
    wait_until_up(pods)
    assert all(vm.boots == 2 and running(vm.pgid) for vm in pods.vms)


def test_a_pods_processes_end_with_its_first_process(pods):
    """A container ends with its first process: what the script left running (its ``sleep``) is
    killed then, as the kernel kills a PID namespace's processes when its init ends."""
    group = pods.vms[0].group
    assert group is not None and len(session_pids(group.pgid)) >= 3  # the lifeline, bash, sleep
    group.signal(signal.SIGTERM)  # the kubelet's: to the container's first process
    assert group.proc.wait(timeout=60) == 0  # the script's trap ran and exited 0
    deadline = time.monotonic() + 10
    while session_pids(group.pgid):
        assert time.monotonic() < deadline, [psutil.Process(pid).cmdline() for pid in session_pids(group.pgid)]
        time.sleep(0.05)


def test_a_requested_reset_starts_every_pod_again_as_a_new_pod(pods):
    """``multislice local reset`` on gke asks through a file; the emulator takes the request once,
    stops every Pod (the kubelet's SIGTERM reaches each script) and starts it again as a new Pod on
    its node, whose cache it finds again."""
    write_node_and_container_files(pods)
    assert not pods.capacity.take_reset()
    request_reset(pods.paths)
    assert pods.capacity.take_reset() and not pods.capacity.take_reset()  # taken once
    pods.repairs.reset(Options())
    assert pods.lines[-1].startswith("reset: JobSet suspended and resumed: every Pod stopped (SIGTERM)")
    assert kept(pods, "releases/container-file") == [] and len(kept(pods, "venvs/node-file")) == len(pods.vms)
    assert all("got SIGTERM" in boot_log(vm.log_path, 1) for vm in pods.vms)
    wait_until_up(pods)
    assert all(vm.boots == 2 and running(vm.pgid) for vm in pods.vms)

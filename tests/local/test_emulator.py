"""infra.local.emulated_stack's lifecycle without a trainer: the VMs boot a stand-in startup script
(served by their metadata servers, like the real one) with the stack's gs:// run directory and
an emulated Cloud Storage, and a fault's repair recreates the failed slice (its disk wiped)
and restarts every other slice (SIGTERM first) on the emu stack's 2 slices × 1 worker. A
storage server that dies stops the run with one message. On the compute-engine backend (2 slices ×
2 VMs, spot) a struck slice waits for a VM to ask the emulated Compute API to recreate it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from infra.config import load_stack_file
from infra.emulated.state import EMULATION_ID_ENV, LocalPaths
from infra.local.emulated_stack import EmulatedStack, EmulationError, Options
from infra.local.faults import Fault
from tests.helpers.emulation import compute_engine_stack
from tests.helpers.standin_vms import SCRIPT, boot_log, booted, running, wait_until_up

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"


@pytest.fixture
def resource(tmp_path):
    with booted(STACK, tmp_path) as resource:
        yield resource


def leaders(resource) -> dict[int, int]:
    return {vm.slice_id: vm.pgid for vm in resource.vms}


def put_on_disks(resource) -> None:
    for vm in resource.vms:
        (vm.home / "checkpoint-cache").write_text(f"slice {vm.slice_id}")


def test_boot_records_every_vm_and_its_node(resource):
    assert [(vm.slice_id, vm.worker) for vm in resource.vms] == [(0, 0), (1, 0)]
    assert [vm.node for vm in resource.vms] == resource.config.node_ids
    state = json.loads(resource.paths.state_file.read_text())
    assert state["pid"] == os.getpid() and state["emulation_id"] == resource.emulation_id
    assert state["vms"] == [
        {"slice": vm.slice_id, "worker": vm.worker, "node": vm.node, "pgid": vm.pgid} for vm in resource.vms
    ]
    for vm in resource.vms:
        assert psutil.Process(vm.pgid).environ()[EMULATION_ID_ENV] == resource.emulation_id


def test_every_vm_gets_the_stack_s_gs_run_dir_and_its_storage(resource):
    config, storage = resource.config, resource.storage
    assert resource.run_dir.root == config.run_dir == f"gs://{config.bucket_name}/runs/{config.effective_run_name}"
    with urllib.request.urlopen(f"{storage.url}/storage/v1/b/{config.bucket_name}") as response:
        assert json.load(response)["name"] == config.bucket_name  # the bucket pulumi up would create
    state = json.loads(resource.paths.state_file.read_text())
    assert state["storage_url"] == storage.url
    assert (
        psutil.Process(storage.group.pgid).environ()[EMULATION_ID_ENV] == resource.emulation_id
    )  # `local down` finds it
    for vm in resource.vms:
        assert vm.metadata.attributes["multislice-run-dir"] == config.run_dir
        env = psutil.Process(vm.pgid).environ()
        assert {key: env.get(key) for key in storage.client_env()} == storage.client_env()
        # Its /tmp is on its own disk: what a killed process leaves there goes with the VM.
        assert env["TMPDIR"] == str(vm.home / "tmp") and (vm.home / "tmp").is_dir()


def test_repair_recreates_the_failed_slice_and_restarts_the_others(resource):
    put_on_disks(resource)
    before = leaders(resource)
    resource.repairs.repair(1, Options(reboot_grace_s=120))
    assert resource.lines[-1] == "repair: recreating slice 1, restarting slice(s) 0"
    slice0, slice1 = resource.vms
    # Recreated: a fresh disk. Restarted: the same disk.
    assert not (slice1.home / "checkpoint-cache").exists()
    assert (slice0.home / "checkpoint-cache").read_text() == "slice 0"
    # Every VM of the first boot is gone, and every VM booted again.
    assert not [pid for pid in before.values() if running(pid)]
    assert all(vm.boots == 2 and running(vm.pgid) for vm in resource.vms)
    assert "got SIGTERM" in boot_log(slice0.log_path, 1)  # a restart is a shutdown: SIGTERM first
    wait_until_up(resource)  # each VM ran its startup script again (asserts within 60 s)
    for vm in resource.vms:
        assert f"up on {vm.home}" in boot_log(vm.log_path, 2)
    assert resource.repairs.repaired == 1
    state = json.loads(resource.paths.state_file.read_text())
    assert [vm["pgid"] for vm in state["vms"]] == [vm.pgid for vm in resource.vms]


#: A stand-in whose shutdown takes longer than a repair's restart grace (5 s), as a trainer's
#: preemption save can on a loaded machine: it writes ``saved`` on its disk when done.
SLOW_TO_SAVE = SCRIPT.replace(
    "trap 'echo \"got SIGTERM\"; exit 0' TERM",
    'trap \'echo "got SIGTERM"; sleep 6; echo done > "$MULTISLICE_HOME/saved"; exit 0\' TERM',
)


def test_a_reset_waits_for_what_each_vm_saves_on_its_sigterm(tmp_path):
    # A reset is each VM's own shutdown: the trainer unit's TimeoutStopSec, not a repair's 5 s.
    assert SLOW_TO_SAVE != SCRIPT
    with booted(STACK, tmp_path, SLOW_TO_SAVE) as resource:
        resource.repairs.reset(Options())
        assert resource.lines[-1] == "reset: restarting every VM of the queued resource (ResetQueuedResource)"
        for vm in resource.vms:
            assert (vm.home / "saved").read_text() == "done\n", boot_log(vm.log_path, 1)
            assert vm.boots == 2  # and booted again, its disk kept


@pytest.mark.parametrize("kind", ["kill", "preempt"])
def test_a_fault_strikes_its_slice_then_repairs(resource, kind):
    put_on_disks(resource)
    before = leaders(resource)
    # The struck attempt's last records, read once it is gone: it had synced step 8 meanwhile
    # (an eval record is not a training step).
    last = ([], [{"step": 8, "loss": 1.0}, {"step": 9, "eval_loss": 2.0}])
    resource.repairs.inject(
        Fault(kind, 0, 5), Options(reboot_grace_s=120, preempt_grace_s=120), observed_step=7, settle=lambda: last
    )
    how = "SIGTERM, then SIGKILL after grace" if kind == "preempt" else "SIGKILL"
    assert resource.lines == [
        f"fault: {kind} slice 0 at step 5 ({how}; training had reported step 7)",
        "repair: recreating slice 0, restarting slice(s) 1",
    ]
    assert resource.repairs.faults_fired == [f"{kind} slice 0 at step 5"]
    assert resource.repairs.fault_steps == [8]  # where it really fired: not 5, not 7
    slice0, slice1 = resource.vms
    # A preempted VM gets the notice (SIGTERM) and may save; a killed one gets no notice.
    assert ("got SIGTERM" in boot_log(slice0.log_path, 1)) == (kind == "preempt")
    assert "got SIGTERM" in boot_log(slice1.log_path, 1)
    assert not (slice0.home / "checkpoint-cache").exists()
    assert (slice1.home / "checkpoint-cache").exists()
    assert not [pid for pid in before.values() if running(pid)]
    assert all(vm.boots == 2 and running(vm.pgid) for vm in resource.vms)


def test_shutdown_stops_every_vm_and_forgets_the_state(resource):
    pids = [
        pid
        for vm in resource.vms
        for pid in [vm.pgid] + [c.pid for c in psutil.Process(vm.pgid).children(recursive=True)]
    ]
    pids.append(resource.storage.group.pgid)
    resource.shutdown()
    assert not [pid for pid in pids if running(pid)]
    assert os.environ.get("STORAGE_EMULATOR_HOST") != resource.storage.url  # this process's clients restored
    assert not resource.paths.state_file.exists()
    for vm in resource.vms:
        assert "got SIGTERM" in boot_log(vm.log_path, 1)


def test_a_storage_server_that_dies_stops_the_run_with_one_message(tmp_path):
    resource = EmulatedStack(load_stack_file(STACK), LocalPaths(tmp_path / "emu"), SCRIPT, report=lambda line: None)

    def kill_storage_once_the_vms_are_up():
        deadline = time.monotonic() + 60
        while len(resource.vms) < 2 or any(vm.group is None for vm in resource.vms):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        wait_until_up(resource)
        resource.storage.group.signal(signal.SIGKILL)

    with resource.running():
        killer = threading.Thread(target=kill_storage_once_the_vms_are_up)
        killer.start()
        with pytest.raises(EmulationError) as failure:
            resource.up(Options(poll_s=0.05))
        killer.join()
        vm_pids = [vm.pgid for vm in resource.vms]
        assert not [pid for pid in vm_pids if running(pid)]  # every VM was stopped
    message = str(failure.value)
    assert message.startswith(
        f"the emulated Cloud Storage (fake-gcs-server on {resource.storage.url}) stopped (killed by SIGKILL)"
    )
    assert "every emulated VM was stopped" in message
    assert "run `multislice local up --config-file " in message and "` again to resume" in message
    assert not resource.paths.state_file.exists()


def test_a_preemption_checkpoint_is_reported_before_the_repair_it_caused(resource):
    # The trainer writes its preemption checkpoint event during the grace period, before the
    # repair; the emulator reports what the events log holds before it reports the repair.
    from infra.local.tails import RecordTail
    from training.metrics.run_log import RecordLog

    resource.reporter.events = RecordTail(resource.run_dir, "events")
    resource.reporter.events.poll()
    events = RecordLog(resource.run_dir, "events")
    events.append({"event": "checkpoint", "step": 7, "preemption": True, "time": 1.0})
    events.append({"event": "preempted", "step": 7, "time": 2.0})
    events.sync()
    resource.repairs.inject(Fault("preempt", 0, 5), Options(reboot_grace_s=120, preempt_grace_s=120), observed_step=6)
    assert resource.lines == [
        "fault: preempt slice 0 at step 5 (SIGTERM, then SIGKILL after grace; training had reported step 6)",
        "preemption checkpoint saved at step 7",
        "training stopped after the preemption checkpoint of step 7",
        "repair: recreating slice 0, restarting slice(s) 1",
    ]


@pytest.fixture
def compute_engine_resource(tmp_path, request):
    """The compute-engine emu stack (2 slices × 2 VMs of v5p-16, spot: neither its groups nor
    Compute Engine recover a lost slice), or with ``request.param`` slices (or a capacity),
    booted with the stand-in script."""
    path = compute_engine_stack(tmp_path)
    param = getattr(request, "param", 2)
    text = path.read_text()
    if isinstance(param, str):
        text = text.replace("  multislice:capacity: spot\n", f"  multislice:capacity: {param}\n")
    elif param != 2:
        text = text.replace("multislice:slices: 2", f"multislice:slices: {param}")
        text = text.replace("dcn: {data: 2,", f"dcn: {{data: {param},")
    path.write_text(text)
    with booted(path, tmp_path) as resource:
        yield resource


def test_a_struck_compute_engine_spot_slice_stays_down_until_a_vm_recreates_its_vms(compute_engine_resource):
    """The struck group's VMs are listed TERMINATED; the repair starts only once its group was
    resized to 0 and back on the emulated Compute API (as slice-watch.sh does)."""
    resource = compute_engine_resource
    api = resource.capacity.api
    group = resource.config.node_ids[1]
    asked = threading.Event()
    repairs_before_asking: list[int] = []

    def watch() -> None:  # stands in for slice 0's slice watch
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            request = urllib.request.Request(
                f"{api.endpoint}/compute/v1/projects/{resource.config.project}/zones/{resource.config.zone}"
                f"/instanceGroupManagers/{group}/listManagedInstances",
                method="POST",
                data=b"",
                headers={"Authorization": "Bearer t"},
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                listed = json.loads(response.read())["managedInstances"]
            if listed and all(m["instanceStatus"] == "TERMINATED" for m in listed):
                time.sleep(0.5)  # the emulator waits meanwhile
                repairs_before_asking.append(resource.repairs.repaired)
                for size in (0, 2):
                    resize = urllib.request.Request(
                        request.full_url.replace("listManagedInstances", f"resize?size={size}"),
                        method="POST",
                        data=b"",
                        headers={"Authorization": "Bearer t"},
                    )
                    urllib.request.urlopen(resize, timeout=10).close()
                    time.sleep(0.2)
                    repairs_before_asking.append(resource.repairs.repaired)
                asked.set()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch)
    thread.start()
    resource.repairs.inject(Fault("kill", 1, 5), Options(reboot_grace_s=120, poll_s=0.05), observed_step=5)
    thread.join(60)
    # Not repaired before the group was asked for its VMs again (resized to 0, then back to 2).
    assert asked.is_set() and repairs_before_asking[:2] == [0, 0] and resource.repairs.repaired == 1
    assert resource.lines == [
        "fault: kill slice 1 at step 5 (SIGKILL; training had reported step 5)",
        "repair: slice 1's VMs are down and neither its group nor Compute Engine recreates a Spot slice; "
        "waiting for a VM's slice watch to recreate the slice's VMs",
        f"repair: a VM asked to recreate group {group}'s VMs (instanceGroupManagers.resize to 0 and back)",
        "repair: recreating slice 1, restarting slice(s) 0 (the slice watch resized its group to 0 and back)",
    ]
    # Recreated: running again under the same names, with no action on them.
    listed = api._list(group, "")
    assert listed is not None
    assert {(m["instanceStatus"], m["currentAction"]) for m in listed["managedInstances"]} == {("RUNNING", "NONE")}


@pytest.mark.parametrize("compute_engine_resource", [1], indirect=True)
def test_a_one_slice_compute_engine_stack_that_loses_its_slice_says_how_to_recreate_it(compute_engine_resource):
    resource = compute_engine_resource
    with pytest.raises(EmulationError, match="no other slice is left whose slice watch could recreate it") as err:
        resource.repairs.inject(Fault("kill", 0, 5), Options(reboot_grace_s=120), observed_step=5)
    group, config = resource.config.node_ids[0], resource.config
    assert (
        f"gcloud compute instance-groups managed resize {group} --size=0 --zone={config.zone} "
        f"--project={config.project}, then the same with --size=2"
    ) in str(err.value)
    assert resource.repairs.repaired == 0


@pytest.mark.parametrize("compute_engine_resource", ["on-demand"], indirect=True)
def test_a_struck_compute_engine_on_demand_slice_is_recovered_by_compute_engine(compute_engine_resource):
    """On-demand (a managed capacity mode: "Compute Engine automatically recovers TPU instances and
    slices"): the struck slice is recreated at once, with no VM asking, and the line says who did it."""
    resource = compute_engine_resource
    resource.repairs.inject(Fault("kill", 1, 5), Options(reboot_grace_s=120, poll_s=0.05), observed_step=5)
    assert resource.repairs.repaired == 1
    assert resource.lines == [
        "fault: kill slice 1 at step 5 (SIGKILL; training had reported step 5)",
        "repair: recreating slice 1, restarting slice(s) 0 (Compute Engine recovers a slice of on-demand VMs itself "
        "(managed capacity mode))",
    ]
    assert not [path for _, path in resource.capacity.api.requests if "/resize" in path]

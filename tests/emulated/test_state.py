"""infra.emulated.state: a stack's state directory, the lock a running emulator holds, and
stopping a recorded run (``multislice local down``) without ever signalling a process that
is not the recorded one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest

from infra.emulated import state as state_lib, supervisor, teardown
from infra.emulated.state import EMULATION_ID_ENV, LocalPaths
from training.run_dir import RunDir

# Stands in for a running emulator: exits 0 on SIGTERM.
EMULATOR = (
    "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); "
    "print('ready', flush=True); time.sleep(600)"
)


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def record(paths: LocalPaths, pid: int, pid_start: float | None, emulation_id: str, vm_pgids: list[int] = ()) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    vms = [{"slice": i, "worker": 0, "node": f"n-{i}", "pgid": pgid} for i, pgid in enumerate(vm_pgids)]
    paths.state_file.write_text(
        json.dumps({"pid": pid, "pid_start": pid_start, "stack": "emu", "emulation_id": emulation_id, "vms": vms})
    )


def start_vm(emulation_id: str) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "600"], env={**os.environ, EMULATION_ID_ENV: emulation_id})


def test_paths(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    assert paths.gcs_root == tmp_path / "emu" / "gcs"
    assert paths.gcs_log == tmp_path / "emu" / "logs" / "fake-gcs-server.log"
    assert paths.vm_home(1, 2) == tmp_path / "emu" / "vms" / "slice-1-worker-2"
    assert paths.vm_log(1, 2) == tmp_path / "emu" / "logs" / "slice-1-worker-2.log"
    assert paths.state_file == tmp_path / "emu" / "emulator.json"


def test_one_lock_holder_at_a_time(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    first = state_lib.acquire_lock(paths)
    assert first is not None
    assert state_lib.acquire_lock(paths) is None  # flock conflicts between open files, in one process too
    first.close()
    second = state_lib.acquire_lock(paths)
    assert second is not None
    second.close()


def test_state_written_and_read_back(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    paths.root.mkdir(parents=True)
    assert state_lib.read_state(paths) is None
    vms = [{"slice": 0, "worker": 0, "node": "n-0", "pgid": 123}]
    state_lib.write_state(paths, stack="emu", emulation_id="abc", vms=vms, storage_url="http://127.0.0.1:9")
    state = state_lib.read_state(paths)
    assert (state["pid"], state["stack"], state["emulation_id"], state["vms"]) == (os.getpid(), "emu", "abc", vms)
    assert state["storage_url"] == "http://127.0.0.1:9"
    assert state["pgid"] == os.getpgid(0)
    assert state_lib.emulator_alive(state)
    assert not state_lib.emulator_alive({**state, "pid_start": state["pid_start"] - 1})
    paths.state_file.write_text("{torn")  # never written so (write_state renames a whole file): damaged
    with pytest.raises(state_lib.DamagedState, match=r"emulator.json is damaged \(not JSON: "):
        state_lib.read_state(paths)


def test_down_stops_the_recorded_emulator_and_its_vms(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    emulation_id = uuid.uuid4().hex
    emulator = subprocess.Popen([sys.executable, "-c", EMULATOR], stdout=subprocess.PIPE, text=True)
    vm = start_vm(emulation_id)
    bystander = start_vm(uuid.uuid4().hex)  # another run's VM
    try:
        assert emulator.stdout.readline() == "ready\n"
        record(paths, emulator.pid, supervisor.start_ticks(emulator.pid), emulation_id)
        deadline = time.monotonic() + 60
        while not supervisor.find_by_env(EMULATION_ID_ENV, emulation_id):  # the VM's environment is readable
            assert time.monotonic() < deadline
            time.sleep(0.01)
        actions = teardown.stop_recorded(paths, wait_s=60)
        assert emulator.wait(timeout=60) == 0  # it got SIGTERM and exited by itself
        assert vm.wait(timeout=60) == -signal.SIGKILL
        assert actions == [f"asked emulator pid {emulator.pid} to stop", f"killed 1 emulated VM process(es): {vm.pid}"]
        assert running(bystander.pid)
        assert not paths.state_file.exists()
        assert teardown.stop_recorded(paths) == []  # nothing recorded any more
    finally:
        for proc in (emulator, vm, bystander):
            proc.kill()
            proc.wait()
        emulator.stdout.close()


# Stands in for an emulator that stops its own VM on SIGTERM (after a moment, like a grace
# period) and then exits: `local down` must wait for it instead of SIGKILLing the VM first.
STOPS_ITS_VM = """
import os, signal, sys, time
vm = int(sys.argv[1])
def stop(*args):
    time.sleep(1)
    os.kill(vm, signal.SIGTERM)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(600)
"""


def test_down_waits_for_the_emulator_to_stop_its_vms(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    emulation_id = uuid.uuid4().hex
    vm = start_vm(emulation_id)
    emulator = subprocess.Popen([sys.executable, "-c", STOPS_ITS_VM, str(vm.pid)], stdout=subprocess.PIPE, text=True)
    try:
        assert emulator.stdout.readline() == "ready\n"
        record(paths, emulator.pid, supervisor.start_ticks(emulator.pid), emulation_id)
        actions = teardown.stop_recorded(paths, wait_s=120)
        assert emulator.poll() is not None  # down returned only once the emulator had gone
        assert vm.wait(timeout=60) == -signal.SIGTERM  # stopped by its emulator, not killed by down
        assert actions == [f"asked emulator pid {emulator.pid} to stop"]
    finally:
        for proc in (emulator, vm):
            proc.kill()
            proc.wait()
        emulator.stdout.close()


# Stands in for an emulator whose main thread is busy: it takes seconds to act on SIGTERM.
SLOW_TO_STOP = (
    "import signal, sys, time; "
    "signal.signal(signal.SIGTERM, lambda *a: "
    "(signal.signal(signal.SIGTERM, signal.SIG_IGN), time.sleep(3), sys.exit(0))); "
    "print('ready', flush=True); time.sleep(600)"
)


def wait_visible(emulation_id: str) -> None:
    deadline = time.monotonic() + 60
    while not supervisor.find_by_env(EMULATION_ID_ENV, emulation_id):  # the VM's environment is readable
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_down_stops_the_recorded_vms_at_once_and_waits_for_the_emulator(tmp_path):
    # The VMs get SIGTERM from `local down` itself (their systemd stops the trainer), not only
    # once the emulator acts on its own SIGTERM; a recorded pgid that is not one of the run's
    # processes (a reused pid) is not signalled.
    paths = LocalPaths(tmp_path / "emu")
    emulation_id = uuid.uuid4().hex
    emulator = subprocess.Popen([sys.executable, "-c", SLOW_TO_STOP], stdout=subprocess.PIPE, text=True)
    vm = start_vm(emulation_id)
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        assert emulator.stdout.readline() == "ready\n"
        record(paths, emulator.pid, supervisor.start_ticks(emulator.pid), emulation_id, [vm.pid, stranger.pid])
        wait_visible(emulation_id)
        actions = teardown.stop_recorded(paths, wait_s=60)
        assert emulator.poll() == 0  # down returned once the emulator had gone
        assert vm.wait(timeout=60) == -signal.SIGTERM
        assert actions == [f"asked emulator pid {emulator.pid} to stop", "sent SIGTERM to 1 emulated VM(s)"]
        assert running(stranger.pid)
        assert not paths.state_file.exists()
    finally:
        for proc in (emulator, vm, stranger):
            proc.kill()
            proc.wait()
        emulator.stdout.close()


def test_an_emulator_that_does_not_stop_keeps_its_state(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(600)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout.readline() == "ready\n"
        record(paths, stubborn.pid, supervisor.start_ticks(stubborn.pid), uuid.uuid4().hex)
        actions = teardown.stop_recorded(paths, wait_s=0.5)
        assert actions[-1].startswith(f"emulator pid {stubborn.pid} is still running after")
        assert paths.state_file.exists() and running(stubborn.pid)
    finally:
        stubborn.kill()
        stubborn.wait()
        stubborn.stdout.close()


def test_a_reused_pid_is_never_signalled(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        started = supervisor.start_ticks(stranger.pid)
        record(paths, stranger.pid, started + 0.5, uuid.uuid4().hex)  # that pid, but another process
        assert not state_lib.emulator_alive(state_lib.read_state(paths))
        assert teardown.stop_recorded(paths, wait_s=0) == []
        assert running(stranger.pid)
        assert not paths.state_file.exists()
    finally:
        stranger.kill()
        stranger.wait()


def test_signal_emulator_false_only_clears_leftover_vms(tmp_path):
    # `local up` holds the lock: a recorded emulator cannot be running; only its VMs are left.
    paths = LocalPaths(tmp_path / "emu")
    emulation_id = uuid.uuid4().hex
    vm = start_vm(emulation_id)
    try:
        record(paths, os.getpid(), supervisor.start_ticks(os.getpid()), emulation_id)
        deadline = time.monotonic() + 60
        while not supervisor.find_by_env(EMULATION_ID_ENV, emulation_id):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert teardown.stop_recorded(paths, signal_emulator=False) == [f"killed 1 emulated VM process(es): {vm.pid}"]
        assert vm.wait(timeout=60) == -signal.SIGKILL
    finally:
        vm.kill()
        vm.wait()


def test_discard_run_keeps_the_bucket_s_other_runs(bucket):
    # Through the emulated Cloud Storage, as `local up --fresh` does.
    run, other = RunDir(f"gs://{bucket}/runs/emu"), RunDir(f"gs://{bucket}/runs/other")
    for run_dir in (run, other):
        run_dir.write("metrics/00000000.jsonl", b"{}\n")
        run_dir.write("checkpoints/6/commit_success.txt", b"x")
    assert teardown.discard_run(run) is True
    assert run.list("*") == []
    assert other.list("*") == ["checkpoints", "metrics"]
    assert teardown.discard_run(run) is False


def test_discard_machines_keeps_the_storage(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    for path in (paths.gcs_root / "b" / "runs" / "emu" / "x", paths.vm_home(0, 0) / "x", paths.vm_log(0, 0)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("x")
    teardown.discard_machines(paths)
    assert not (paths.root / "vms").exists() and not paths.logs_dir.exists()
    assert (paths.gcs_root / "b" / "runs" / "emu" / "x").exists()


def test_a_deletion_is_recorded_read_and_forgotten(tmp_path):
    paths = LocalPaths(tmp_path / "emu")
    paths.root.mkdir()
    assert state_lib.read_deletion(paths) is None
    before = time.time()
    state_lib.record_deletion(paths, "projects/p/locations/z/queuedResources/q", "gs://b/runs/emu")
    record = state_lib.read_deletion(paths)
    assert (record["queued_resource"], record["run_dir"]) == (
        "projects/p/locations/z/queuedResources/q",
        "gs://b/runs/emu",
    )
    assert before - 0.001 <= record["deleted_at"] <= time.time() + 0.001
    assert [p.name for p in paths.root.iterdir()] == ["deleted.json"]  # no temporary file left
    paths.deletion_file.write_text("{not json")
    assert state_lib.read_deletion(paths) is None  # unreadable: not deleted
    state_lib.forget_deletion(paths)
    state_lib.forget_deletion(paths)  # nothing to forget: fine
    assert not paths.deletion_file.exists()


def test_check_writable_names_what_is_wrong_with_the_state_directory(tmp_path, monkeypatch):
    import builtins
    import errno

    from infra.emulated.state import LocalPaths, check_writable

    assert check_writable(LocalPaths(tmp_path / "new" / "emu")) is None
    assert (tmp_path / "new" / "emu").is_dir() and not list((tmp_path / "new" / "emu").iterdir())
    (tmp_path / "file").write_text("")
    assert check_writable(LocalPaths(tmp_path / "file" / "emu")).startswith(
        "a component of the path is not a directory"
    )
    real_open = builtins.open

    def full(path, *args, **kwargs):
        if ".write-test." in str(path):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", full)
    assert check_writable(LocalPaths(tmp_path / "full")).startswith("no space left on device (")
    monkeypatch.setattr(builtins, "open", real_open)
    if os.geteuid() != 0:  # root writes anywhere: the mode bits do not stop it
        (tmp_path / "ro").mkdir(mode=0o555)
        assert check_writable(LocalPaths(tmp_path / "ro" / "emu")).startswith("permission denied")


def test_down_says_in_each_vm_log_that_the_stop_is_the_users(tmp_path):
    # On a TPU VM the trainer cannot tell a preemption from a stop; the emulator can, and says so first.
    paths = LocalPaths(tmp_path / "emu")
    emulation_id = uuid.uuid4().hex
    emulator = subprocess.Popen([sys.executable, "-c", EMULATOR], stdout=subprocess.PIPE, text=True)
    vm = start_vm(emulation_id)
    try:
        assert emulator.stdout.readline() == "ready\n"
        record(paths, emulator.pid, supervisor.start_ticks(emulator.pid), emulation_id, [vm.pid])
        paths.logs_dir.mkdir(parents=True, exist_ok=True)
        paths.vm_log(0, 0).write_text("[slice 0 worker 0] step 40\n")
        teardown.stop_recorded(paths, wait_s=60)
        assert paths.vm_log(0, 0).read_text() == "[slice 0 worker 0] step 40\n" + teardown.DOWN_LINE
    finally:
        for proc in (emulator, vm):
            proc.kill()
            proc.wait()
        emulator.stdout.close()

"""infra.emulated.supervisor: process groups started, signalled, stopped and waited for as a
whole; leftover processes found by an environment marker; recorded pids checked by their
start time. Processes are observed here with psutil directly, not through the module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from infra.emulated import supervisor
from infra.emulated.supervisor import DeadlineExceeded, GroupFailed, ProcessGroup

# A leader with a child of its own (like the startup script and its trainer); on SIGTERM it
# writes a line and exits 0 (like the trainer's preemption save).
GRACEFUL = "trap 'echo got SIGTERM; exit 0' TERM; sleep 600 & echo child $!; wait"
# One that ignores SIGTERM: only SIGKILL ends it.
STUBBORN = "trap '' TERM; sleep 600 & echo child $!; wait; wait"


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start(tmp_path: Path, script: str, name: str = "g", **kwargs) -> ProcessGroup:
    return ProcessGroup.start(
        name, ["bash", "-c", script], log_path=tmp_path / f"{name}.log", env=dict(os.environ), **kwargs
    )


def members(group: ProcessGroup) -> list[int]:
    """Every process of the group, once the leader's child has started (60 s at most)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        pids = [group.pgid] + [p.pid for p in psutil.Process(group.pgid).children(recursive=True)]
        if len(pids) > 1:
            return pids
        time.sleep(0.01)
    raise AssertionError(f"{group.name}: the leader started no child")


def wait_not_running(pids: list[int]) -> None:
    """Wait (60 s at most) until none of ``pids`` runs: a killed orphan is reaped by init."""
    deadline = time.monotonic() + 60
    while [pid for pid in pids if running(pid)]:
        assert time.monotonic() < deadline, [pid for pid in pids if running(pid)]
        time.sleep(0.01)


@pytest.fixture
def groups():
    """Groups a test starts; killed afterwards whatever the test did."""
    started: list[ProcessGroup] = []
    yield started
    for group in started:
        try:
            os.killpg(group.pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        group.proc.wait(timeout=30)


def test_a_group_is_its_own_session_with_output_in_its_log(tmp_path, groups):
    groups.append(group := start(tmp_path, GRACEFUL, header="===== boot 1 ====="))
    pids = members(group)
    for pid in pids:
        assert os.getpgid(pid) == group.pgid and os.getsid(pid) == group.pgid
    assert os.getpgid(pids[0]) != os.getpgid(0)
    assert group.alive() and group.poll() is None
    group.kill()
    assert group.log_path.read_text().startswith("===== boot 1 =====\n")  # then the command's output


def test_append_keeps_earlier_output_and_a_new_log_starts_empty(tmp_path, groups):
    for header, append in (("first", False), ("second", True)):
        groups.append(group := start(tmp_path, "echo out", header=header, append=append))
        group.proc.wait(timeout=30)
    assert (tmp_path / "g.log").read_text() == "first\nout\nsecond\nout\n"
    groups.append(group := start(tmp_path, "echo again"))
    group.proc.wait(timeout=30)
    assert (tmp_path / "g.log").read_text() == "again\n"


def test_kill_ends_every_process_of_the_group(tmp_path, groups):
    groups.append(group := start(tmp_path, STUBBORN))
    pids = members(group)
    group.kill()
    assert not [pid for pid in pids if running(pid)]
    assert group.poll() == -signal.SIGKILL and not group.alive()


def test_alive_while_a_child_outlives_the_leader(tmp_path, groups):
    groups.append(group := start(tmp_path, "sleep 600 & echo $! > child; exit 0", cwd=tmp_path))
    assert group.proc.wait(timeout=30) == 0
    child = int((tmp_path / "child").read_text())
    assert running(child) and group.alive()
    group.kill()
    assert not running(child) and not group.alive()


def test_stop_gives_sigterm_first_and_waits_for_a_graceful_exit(tmp_path, groups):
    groups.append(graceful := start(tmp_path, GRACEFUL, name="graceful"))
    pids = members(graceful)
    supervisor.stop_groups([graceful], grace_s=120)
    assert graceful.poll() == 0  # it exited by itself, after its SIGTERM handler ran
    assert "got SIGTERM" in graceful.log_path.read_text()
    assert not [pid for pid in pids if running(pid)]


def test_stop_kills_what_ignores_sigterm_after_the_grace(tmp_path, groups):
    groups.extend(
        [stubborn := start(tmp_path, STUBBORN, name="stubborn"), graceful := start(tmp_path, GRACEFUL, name="graceful")]
    )
    pids = members(stubborn) + members(graceful)
    supervisor.stop_groups([stubborn, graceful], grace_s=0.2)
    assert stubborn.poll() == -signal.SIGKILL
    assert not [pid for pid in pids if running(pid)]


def test_kill_groups_and_killed_on_exit(tmp_path, groups):
    with pytest.raises(RuntimeError, match="boom"):
        with supervisor.killed_on_exit() as started:
            for name in ("a", "b"):
                started.append(start(tmp_path, STUBBORN, name=name))
            groups.extend(started)
            pids = [pid for group in started for pid in members(group)]
            raise RuntimeError("boom")
    assert all(group.poll() == -signal.SIGKILL for group in groups)
    assert not [pid for pid in pids if running(pid)]


def test_check_groups(tmp_path, groups):
    groups.extend([ok := start(tmp_path, "exit 0", name="ok"), slow := start(tmp_path, "sleep 600", name="slow")])
    ok.proc.wait(timeout=30)
    assert supervisor.check_groups([ok, slow]) is False  # one still runs
    slow.kill()
    groups.append(bad := start(tmp_path, "exit 3", name="bad"))
    bad.proc.wait(timeout=30)
    with pytest.raises(GroupFailed) as failed:
        supervisor.check_groups([ok, bad])
    assert failed.value.group is bad and failed.value.code == 3
    groups.append(other := start(tmp_path, "exit 0", name="other"))
    other.proc.wait(timeout=30)
    assert supervisor.check_groups([ok, other]) is True


def test_a_failure_is_reported_while_others_still_run(tmp_path, groups):
    groups.extend([slow := start(tmp_path, "sleep 600", name="slow"), bad := start(tmp_path, "exit 4", name="bad")])
    with pytest.raises(GroupFailed) as failed:
        supervisor.wait_groups([slow, bad], deadline=float("inf"), poll_s=0.01)
    assert failed.value.group is bad and failed.value.code == 4


def test_wait_groups_until_the_deadline(tmp_path, groups):
    groups.extend([done := start(tmp_path, "exit 0", name="done"), slow := start(tmp_path, "sleep 600", name="slow")])
    done.proc.wait(timeout=30)
    with pytest.raises(DeadlineExceeded) as late:
        supervisor.wait_groups([done, slow], deadline=0.0)  # long past
    assert late.value.running == ["slow"]
    slow.kill()
    groups.append(fine := start(tmp_path, "exit 0", name="fine"))
    supervisor.wait_groups([done, fine], deadline=float("inf"), poll_s=0.01)
    assert fine.poll() == 0


def test_leftovers_are_found_by_their_environment_marker(tmp_path, groups):
    marker = uuid.uuid4().hex
    env = {**os.environ, "MULTISLICE_TEST_MARKER": marker}
    group = ProcessGroup.start("m", ["bash", "-c", "sleep 600 & wait"], log_path=tmp_path / "m.log", env=env)
    groups.append(group)
    pids = members(group)
    assert supervisor.find_by_env("MULTISLICE_TEST_MARKER", marker) == sorted(pids)
    assert supervisor.find_by_env("MULTISLICE_TEST_MARKER", marker + "x") == []
    assert supervisor.kill_pids(pids) == pids
    group.proc.wait(timeout=30)
    wait_not_running(pids)
    assert supervisor.find_by_env("MULTISLICE_TEST_MARKER", marker) == []
    assert supervisor.kill_pids([group.pgid]) == []  # exited and reaped: nothing to signal


def test_a_recorded_pid_counts_only_with_its_start_time(tmp_path):
    me = os.getpid()
    started = supervisor.start_ticks(me)
    assert started is not None
    assert supervisor.same_process(me, started) and supervisor.same_process(me, None)
    assert not supervisor.same_process(me, started + 0.5)  # a reused pid: another process
    assert not supervisor.same_process(0, None) and not supervisor.same_process(-1, None)
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        assert supervisor.start_ticks(sleeper.pid) >= started
        assert supervisor.same_process(sleeper.pid, supervisor.start_ticks(sleeper.pid))
        assert not supervisor.wait_gone(sleeper.pid, 0.0)
        sleeper.kill()
        assert supervisor.wait_gone(sleeper.pid, 30)  # a zombie (not reaped yet) has exited
        assert not supervisor.same_process(sleeper.pid, None)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert supervisor.start_time(sleeper.pid) is None and not supervisor.same_process(sleeper.pid, None)


CHILD = """
import sys, time
from infra.emulated.supervisor import die_with_parent
print("armed" if die_with_parent(int(sys.argv[1])) else "orphan", flush=True)
time.sleep(600)
"""
LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())])
print(child.pid, flush=True)
child.wait()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_child_dies_with_its_launcher():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, CHILD], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        # The launcher's line (the child's pid) and the child's ("armed") share the pipe, in
        # either order: the child may print before its launcher does.
        lines = [launcher.stdout.readline(), launcher.stdout.readline()]
        assert "armed\n" in lines, lines
        lines.remove("armed\n")
        child = int(lines[0])
        launcher.kill()  # no chance to clean up
        launcher.wait(timeout=30)
        wait_not_running([child])  # the kernel's parent-death signal ended it
    finally:
        launcher.kill()
        launcher.wait()
        launcher.stdout.close()
        if child is not None and running(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_whose_launcher_is_already_gone_is_told_so():
    code = (
        "import sys; from infra.emulated.supervisor import die_with_parent; "
        "sys.exit(0 if die_with_parent(int(sys.argv[1])) else 5)"
    )
    stranger = os.getpid() + 10**7
    assert subprocess.run([sys.executable, "-c", code, str(stranger)], timeout=60).returncode == 5
    assert subprocess.run([sys.executable, "-c", code, str(os.getpid())], timeout=60).returncode == 0


def test_a_recorded_start_survives_the_boot_time_moving_a_second(monkeypatch):
    # Linux's btime is the wall clock minus the uptime, recomputed at each read: when NTP slews
    # the clock it moves by a second, and so does every process's wall-clock create_time. The
    # recorded start is the time since boot, which does not move.
    import psutil._pslinux as pslinux

    me = os.getpid()
    recorded, recorded_wall = supervisor.start_ticks(me), supervisor.start_time(me)
    real_boot_time = pslinux.boot_time
    monkeypatch.setattr(pslinux, "boot_time", lambda: real_boot_time() + 1.0)
    assert supervisor.start_time(me) == pytest.approx(recorded_wall + 1.0)  # the wall-clock start moved
    assert supervisor.same_process(me, recorded)
    assert supervisor.same_process(me, recorded_wall)  # a state file of an older version: within 2 s
    assert not supervisor.same_process(me, recorded_wall - 60)

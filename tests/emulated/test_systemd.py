"""The emulated VM's systemd (infra/emulated/units.py, service_manager.py, systemd.py, vm.py):
unit files parsed as systemd reads them, and units run as systemd.service(5)/systemd.kill(5)
say: restart on failure, RestartPreventExitStatus, the start limit, NRestarts, the stop
signal and timeout, ExecStopPost's variables; systemctl's answers; power loss reaches every
process of the VM."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from infra.emulated.metadata import MetadataServer
from infra.emulated.service_manager import JobFailed, Manager, session_pids
from infra.emulated.systemd import systemctl
from infra.emulated.units import UnitError, parse_service, parse_statuses, parse_timespan
from infra.emulated.vm import EmulatedVM
from infra.vm_contract import BOOT_LOCK_FILE, RELEASE_WATCH_UNIT, TRAINER_UNIT

UNIT = "test.service"


def write_unit(directory: Path, service: str, unit: str = "", name: str = UNIT) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(f"[Unit]\nDescription=test\n{unit}\n[Service]\n{service}\n")


def tick_until(manager: Manager, condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, {name: s.state for name, s in manager.services.items()}
        manager.tick()
        time.sleep(0.01)


@pytest.fixture
def manager(tmp_path):
    managed = Manager(tmp_path / "units", {"PATH": os.environ["PATH"], "RECORDS": str(tmp_path)})
    yield managed
    for service in managed.services.values():  # nothing outlives a test
        if service.proc is not None and service.proc.poll() is None:
            os.killpg(service.proc.pid, signal.SIGKILL)
            service.proc.wait()


# unit files ---------------------------------------------------------------------------------


def test_time_spans_and_statuses_as_systemd_writes_them():
    assert parse_timespan("100ms") == pytest.approx(0.1)
    assert parse_timespan("1min 30s") == 90
    assert parse_timespan("2h") == 7200
    assert parse_timespan("5") == 5
    assert parse_timespan("55s500ms") == pytest.approx(55.5)
    assert math.isinf(parse_timespan("infinity"))
    for bad in ("", "5 parsecs", "ms", "-1s"):
        with pytest.raises(UnitError, match="not a time span"):
            parse_timespan(bad)
    assert parse_statuses("78 1 SIGABRT") == {78, 1, signal.SIGABRT}
    with pytest.raises(UnitError, match="'300'"):
        parse_statuses("300")


def test_a_unit_file_is_read_whole_or_refused():
    unit = parse_service(
        "# comment\n[Unit]\nStartLimitIntervalSec=1h\nStartLimitBurst=11\n[Service]\nType=simple\n"
        'ExecStart=/bin/bash -c "exit 3"\nEnvironment=A=1 "B=two words"\nRestart=on-failure\nRestartSec=100ms\n'
        "RestartPreventExitStatus=78\nKillSignal=SIGINT\nTimeoutStopSec=2min\n[Install]\nWantedBy=multi-user.target\n",
        UNIT,
    )
    assert unit.exec_start == ("/bin/bash", "-c", "exit 3")
    assert unit.environment == {"A": "1", "B": "two words"}
    assert (unit.restart, unit.restart_sec, unit.timeout_stop_sec) == ("on-failure", pytest.approx(0.1), 120)
    assert (unit.start_limit_interval_sec, unit.start_limit_burst) == (3600, 11)
    assert unit.restart_prevent_exit_status == {78} and unit.kill_signal == signal.SIGINT
    defaults = parse_service("[Service]\nExecStart=/bin/true\n", UNIT)
    assert (defaults.restart, defaults.kill_mode, defaults.timeout_stop_sec, defaults.start_limit_burst) == (
        "no",
        "control-group",
        90,
        5,
    )
    for text, message in (
        (
            "[Service]\nExecStart=/bin/true\nRestartSteps=5\n",
            r"test.service:3: \[Service\] RestartSteps= is not a directive",
        ),
        ("[Service]\nExecStart=true\n", "absolute path"),
        ("[Service]\nExecStart=/bin/echo $HOME\n", "does not expand"),
        ("[Service]\nType=forking\nExecStart=/bin/true\n", "Type=forking is not emulated"),
        ("[Service]\nRestart=on-failure\n", "no ExecStart"),
        ("[Timer]\nOnBootSec=1\n", r"unknown section \[Timer\]"),
    ):
        with pytest.raises(UnitError, match=message):
            parse_service(text, UNIT)


# running units ------------------------------------------------------------------------------


def script_file(tmp_path: Path, name: str, body: str) -> str:
    """A bash script for ExecStart=/ExecStopPost= (unit files cannot hold shell $-syntax:
    systemd would expand it)."""
    path = tmp_path / name
    path.write_text("#!/bin/bash\n" + body + "\n")
    return f"/bin/bash {path}"


POST = 'echo "$SERVICE_RESULT $EXIT_CODE $EXIT_STATUS" >>"$RECORDS/post"'


def test_a_failing_unit_restarts_until_the_start_limit(manager, tmp_path):
    start = script_file(tmp_path, "fail.sh", 'echo x >>"$RECORDS/starts"; exit 3')
    write_unit(
        manager.unit_dir,
        f"ExecStart={start}\nRestart=on-failure\nRestartSec=10ms",
        "StartLimitIntervalSec=1h\nStartLimitBurst=3",
    )
    manager.start(UNIT)
    tick_until(manager, lambda: manager.service(UNIT).state == "failed")
    service = manager.service(UNIT)
    assert (tmp_path / "starts").read_text() == "x\n" * 3
    assert (service.result, service.n_restarts) == ("start-limit-hit", 3)
    assert systemctl(manager, ["show", "--property=NRestarts", "--value", UNIT]) == (0, "3\n")
    with pytest.raises(JobFailed, match="attempted too often"):
        manager.start(UNIT)  # the limit holds for a manual start too ...
    manager.reset_failed(UNIT)  # ... until reset-failed
    manager.start(UNIT)
    assert manager.service(UNIT).n_restarts == 0  # a start that is not a restart resets the counter
    tick_until(manager, lambda: manager.service(UNIT).state == "activating")


def test_restart_prevent_exit_status_and_exec_stop_post(manager, tmp_path):
    start = script_file(tmp_path, "config-error.sh", "exit 78")
    post = script_file(tmp_path, "post.sh", POST)
    write_unit(
        manager.unit_dir,
        f"ExecStart={start}\nExecStopPost={post}\nRestart=on-failure\nRestartSec=10ms\nRestartPreventExitStatus=78",
    )
    manager.start(UNIT)
    tick_until(manager, lambda: manager.service(UNIT).state == "failed")
    for _ in range(5):
        manager.tick()
    assert (tmp_path / "post").read_text() == "exit-code exited 78\n"
    assert manager.service(UNIT).n_restarts == 0


@pytest.mark.parametrize(
    "command, restarted",
    [("exit 0", False), ("kill -TERM $$", False), ("kill -KILL $$", True), ("exit 75", True)],
)
def test_only_an_unclean_exit_restarts(manager, tmp_path, command, restarted):
    start = script_file(tmp_path, "main.sh", command)
    write_unit(manager.unit_dir, f"ExecStart={start}\nRestart=on-failure\nRestartSec=1h")
    manager.start(UNIT)
    tick_until(manager, lambda: manager.service(UNIT).state != "active")
    assert manager.service(UNIT).state == ("activating" if restarted else "inactive")


@pytest.mark.parametrize("stopped", [False, True])
def test_a_forced_restart_status_that_is_also_a_success(manager, tmp_path, stopped):
    """The trainer unit's status 75 (``SuccessExitStatus=75`` and ``RestartForceExitStatus=75``):
    a clean exit, so no ``Failed with result`` line, yet restarted under ``Restart=on-failure``
    (systemd's ``service_shall_restart`` tests the forced statuses before ``Restart=``); after a
    stop (``forbid_restart``) it is not restarted, and deactivates as a success."""
    said: list[str] = []
    manager.say = said.append
    body = "trap 'exit 75' TERM; while true; do sleep 0.05; done" if stopped else "exit 75"
    start = script_file(tmp_path, "planned.sh", 'echo x >>"$RECORDS/starts"; ' + body)
    post = script_file(tmp_path, "post.sh", POST)
    write_unit(
        manager.unit_dir,
        f"ExecStart={start}\nExecStopPost={post}\nRestart=on-failure\nRestartSec=10ms\n"
        "SuccessExitStatus=75\nRestartForceExitStatus=75",
    )
    manager.start(UNIT)
    if stopped:
        deadline = time.monotonic() + 30
        while not (tmp_path / "starts").exists():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert systemctl(manager, ["stop", UNIT]) == (0, "")
        assert manager.service(UNIT).state == "inactive" and manager.service(UNIT).restart_at is None
    else:
        tick_until(manager, lambda: manager.service(UNIT).n_restarts >= 1)
        assert (tmp_path / "starts").read_text().count("x") >= 1
    assert (tmp_path / "post").read_text().splitlines()[0] == "success exited 75"
    assert not [line for line in said if "Failed with result" in line or "Main process exited" in line]
    assert [line for line in said if "Deactivated successfully" in line] == (
        [f"{UNIT}: Deactivated successfully."] if stopped else []
    )
    assert parse_service(
        "[Service]\nExecStart=/bin/true\nRestartForceExitStatus=75 SIGUSR1\n", UNIT
    ).restart_force_exit_status == {75, signal.SIGUSR1}


def test_stop_signals_the_whole_group_then_kills_after_the_timeout(manager, tmp_path):
    start = script_file(
        tmp_path, "stubborn.sh", 'trap "" TERM; sleep 300 & echo $! >"$RECORDS/child"; while true; do sleep 0.05; done'
    )
    post = script_file(tmp_path, "post.sh", POST)
    write_unit(
        manager.unit_dir,
        f"ExecStart={start}\nExecStopPost={post}\nRestart=always\nRestartSec=10ms\nTimeoutStopSec=300ms",
    )
    manager.start(UNIT)
    deadline = time.monotonic() + 30
    while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text().endswith("\n"):
        assert time.monotonic() < deadline  # (the shell creates the file, then writes the pid)
        time.sleep(0.01)
    main, child = manager.service(UNIT).proc.pid, int((tmp_path / "child").read_text())
    assert systemctl(manager, ["stop", UNIT]) == (0, "")
    assert gone_within(child, 5)  # SIGTERM reached every process of the group (delivery is asynchronous)
    assert gone(main)
    assert (tmp_path / "post").read_text() == "timeout killed KILL\n"  # the main process ignored SIGTERM
    service = manager.service(UNIT)
    assert service.state == "failed" and service.restart_at is None  # a stop is never followed by a restart


@pytest.mark.parametrize("end", ["stopped", "exits", "killed"])
def test_kill_mode_process_leaves_the_units_other_processes_alone(manager, tmp_path, end):
    """systemd.kill(5): with KillMode=process "only the main process itself is killed" — on a stop, when
    it exits, when it is killed; what it started (the warm standby's attempts) runs on and is not waited for."""
    rest = "exit 3" if end == "exits" else "while true; do sleep 0.05; done"
    body = 'sleep 300 & echo $! >"$RECORDS/child"; ' + rest
    start = script_file(tmp_path, "forks.sh", "trap 'exit 0' TERM; " + body)
    write_unit(manager.unit_dir, f"ExecStart={start}\nRestart=no\nKillMode=process\nTimeoutStopSec=20s")
    manager.start(UNIT)
    deadline = time.monotonic() + 30
    while not (tmp_path / "child").exists() or not (tmp_path / "child").read_text().endswith("\n"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    main, child = manager.service(UNIT).proc.pid, int((tmp_path / "child").read_text())
    try:
        began = time.monotonic()
        if end == "stopped":
            assert systemctl(manager, ["stop", UNIT]) == (0, "")
        else:
            if end == "killed":
                os.kill(main, signal.SIGKILL)
            tick_until(manager, lambda: manager.service(UNIT).state in ("inactive", "failed"))
        assert time.monotonic() - began < 15  # not TimeoutStopSec= (20 s): the child is not waited for
        assert gone(main) and not gone(child)
    finally:
        os.kill(child, signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        return not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def gone_within(pid: int, seconds: float) -> bool:
    """``pid`` is gone now or within ``seconds`` (a signalled process exits once it is scheduled,
    which on a loaded machine can take a moment after the signal was sent)."""
    deadline = time.monotonic() + seconds
    while not gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_each_status_line_reaches_the_console_in_one_write(manager, monkeypatch):
    # Every process of a VM writes to its one console; a line written in two parts (print under
    # PYTHONUNBUFFERED: the text, then the newline) can have another's line land in between.
    writes = []

    class Console:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(sys, "stdout", Console())
    manager.say("Started multislice-trainer.service.")
    assert writes == ["systemd[1]: Started multislice-trainer.service.\n"]


def test_systemctl_answers_like_systemctl(manager):
    write_unit(manager.unit_dir, "ExecStart=/bin/sleep 300")
    assert systemctl(manager, ["is-active", UNIT]) == (3, "inactive\n")
    assert systemctl(manager, ["start", UNIT]) == (0, "")
    assert systemctl(manager, ["is-active", "--quiet", UNIT]) == (0, "")
    assert systemctl(manager, ["start", UNIT]) == (0, "")  # already active: nothing happens
    pid = manager.service(UNIT).proc.pid
    assert systemctl(manager, ["show", "-p", "MainPID", UNIT]) == (0, f"MainPID={pid}\n")
    assert systemctl(manager, ["restart", UNIT])[0] == 0 and manager.service(UNIT).proc.pid != pid
    assert systemctl(manager, ["stop", UNIT]) == (0, "")
    assert systemctl(manager, ["start", "nope.service"]) == (5, "Unit nope.service not found.\n")
    assert systemctl(manager, ["enable", UNIT])[0] == 1
    assert systemctl(manager, ["--user", "daemon-reload"])[0] == 1


def test_the_command_reaches_the_manager_only_with_its_key_and_imports_little(manager):
    # The VM's `systemctl` (infra/emulated/systemctl.py) against the manager's loopback server: the
    # same answers as above with the key; without it, or with a request cut short or too long,
    # nothing runs and the command says there was no answer. It imports the standard library's
    # socket and json only (multiprocessing.connection, used before, cost about 65 ms more CPU a call).
    import socket
    import subprocess
    import threading

    from infra.emulated import systemd as emulated_systemd
    from infra.emulated.systemctl import ADDRESS_ENV, AUTHKEY_ENV, LINE_LIMIT, request_line

    write_unit(manager.unit_dir, "ExecStart=/bin/sleep 300")
    listener = socket.create_server(("127.0.0.1", 0))
    threading.Thread(target=emulated_systemd._serve, args=(manager, listener, "ab12"), daemon=True).start()
    address = "{}:{}".format(*listener.getsockname()[:2])

    def command(*argv: str, key: str = "ab12") -> subprocess.CompletedProcess:
        env = {**os.environ, ADDRESS_ENV: address, AUTHKEY_ENV: key}
        run = [sys.executable, "-m", "infra.emulated.systemctl", *argv]
        return subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)

    try:
        inactive = command("is-active", UNIT)
        assert (inactive.returncode, inactive.stderr) == (3, "inactive\n")
        refused = command("start", UNIT, key="ab13")
        assert (refused.returncode, refused.stderr) == (1, "emulated systemctl: no answer from the VM's manager\n")
        assert manager.service(UNIT).proc is None
        for line in (b'{"key": "ab12", "argv": ["start", "' + UNIT.encode() + b'"]}', b"x" * (LINE_LIMIT + 1)):
            with socket.create_connection(listener.getsockname()[:2], timeout=30) as conn:
                conn.sendall(line)
                conn.shutdown(socket.SHUT_WR)
                assert conn.recv(10) == b""  # closed unanswered
        assert manager.service(UNIT).proc is None
        with socket.create_connection(listener.getsockname()[:2], timeout=30) as slow:
            # A caller that sends nothing is dropped once its time is up (a server of 0.2 s here) ...
            impatient = socket.create_server(("127.0.0.1", 0))
            serve = (manager, impatient, "ab12", 0.2)
            threading.Thread(target=emulated_systemd._serve, args=serve, daemon=True).start()
            with impatient, socket.create_connection(impatient.getsockname()[:2], timeout=30) as conn:
                assert conn.recv(10) == b""
            # ... and one that sends within it is answered.
            slow.sendall(request_line("ab12", ["is-active", UNIT]))
            assert slow.makefile("rb").readline() == b'[3, "inactive\\n"]\n'
        started = command("start", UNIT)
        assert started.returncode == 0 and manager.service(UNIT).proc is not None
    finally:
        listener.close()
    code = "import sys, infra.emulated.systemctl; print(sorted({'multiprocessing', 'pickle'} & set(sys.modules)))"
    imported = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert imported.stdout == "[]\n"


def test_daemon_reload_applies_a_changed_unit_at_the_next_start(manager, tmp_path):
    write_unit(manager.unit_dir, f"ExecStart=/bin/bash -c 'echo one >>{tmp_path}/out'")
    manager.start(UNIT)
    tick_until(manager, lambda: manager.service(UNIT).state == "inactive")
    write_unit(manager.unit_dir, f"ExecStart=/bin/bash -c 'echo two >>{tmp_path}/out'")  # not yet reloaded
    manager.start(UNIT)
    tick_until(manager, lambda: manager.service(UNIT).state == "inactive")
    assert systemctl(manager, ["daemon-reload"]) == (0, "")
    manager.start(UNIT)
    tick_until(manager, lambda: manager.service(UNIT).state == "inactive")
    assert (tmp_path / "out").read_text() == "one\none\ntwo\n"


# the VM -------------------------------------------------------------------------------------

UNIT_STARTING_SCRIPT = """#!/bin/bash
set -euo pipefail
mkdir -p "$MULTISLICE_SYSTEMD_DIR"
printf '[Service]\\nExecStart=/bin/sleep 600\\n' >"$MULTISLICE_SYSTEMD_DIR/test.service"
systemctl daemon-reload
systemctl start test.service
echo "unit started"
"""


def test_power_loss_reaches_every_process_of_the_vm(tmp_path):
    """A unit runs in a process group of its own (its cgroup), yet SIGKILL to the VM reaches it."""
    with MetadataServer({"startup-script": UNIT_STARTING_SCRIPT}) as metadata:
        vm = EmulatedVM(0, 0, "node-0", tmp_path / "disk", tmp_path / "console.log", metadata)
        group = vm.boot({"PATH": os.environ["PATH"]})
        try:
            deadline = time.monotonic() + 60
            while "unit started" not in vm.log_path.read_text():
                assert time.monotonic() < deadline and group.poll() is None, vm.log_path.read_text()
                time.sleep(0.02)
            pids = session_pids(group.pgid)
            groups = {os.getpgid(pid) for pid in pids}
            assert len(groups) >= 2  # the systemd's own group and the unit's
            assert group.alive() and group.poll() is None  # a running unit keeps the VM up
        finally:
            group.kill()
        assert session_pids(group.pgid) == [] and not group.alive()
        assert all(gone(pid) for pid in pids)


#: A VM whose release watch boots a new release: the trainer has stopped for it (status 76), and
#: the watch's boot, holding the boot lock as release_watch.sh does, resets the failed trainer, takes
#: a while (a slow machine), then starts it again with the new unit.
WATCH_BOOTING_SCRIPT = f"""#!/bin/bash
set -euo pipefail
mkdir -p "$MULTISLICE_SYSTEMD_DIR"
printf '[Service]\\nExecStart=/bin/bash -c "exit 76"\\n' >"$MULTISLICE_SYSTEMD_DIR/{TRAINER_UNIT}"
cat >"$MULTISLICE_HOME/watch.sh" <<'WATCH'
until systemctl show -p ExecMainStatus --value {TRAINER_UNIT} | grep -qx 76; do sleep 0.1; done
exec 9>"$MULTISLICE_HOME/{BOOT_LOCK_FILE}"
flock 9
systemctl reset-failed {TRAINER_UNIT}
sleep 3
units=$MULTISLICE_SYSTEMD_DIR
printf '[Service]\\nExecStart=/bin/sh -c "echo trainer of the new release; exec sleep 600"\\n' >"$units/{TRAINER_UNIT}"
systemctl daemon-reload
systemctl restart {TRAINER_UNIT}
exec 9>&-
exec sleep 600
WATCH
units=$MULTISLICE_SYSTEMD_DIR
printf '[Service]\\nExecStart=/bin/bash %s\\n' "$MULTISLICE_HOME/watch.sh" >"$units/{RELEASE_WATCH_UNIT}"
systemctl daemon-reload
systemctl start {TRAINER_UNIT} {RELEASE_WATCH_UNIT}
"""


def test_a_vm_whose_release_watch_is_booting_does_not_power_off(tmp_path):
    """Between the boot's reset-failed and its restart no unit runs; the held boot lock keeps the
    VM up (infra.emulated.systemd._booting), and the new trainer starts."""
    with MetadataServer({"startup-script": WATCH_BOOTING_SCRIPT}) as metadata:
        vm = EmulatedVM(0, 0, "node-0", tmp_path / "disk", tmp_path / "console.log", metadata)
        (tmp_path / "disk").mkdir()
        group = vm.boot({"PATH": os.environ["PATH"]})
        try:
            deadline = time.monotonic() + 60
            while "trainer of the new release" not in vm.log_path.read_text():
                assert group.poll() is None, f"the VM powered off mid-boot:\n{vm.log_path.read_text()}"
                assert time.monotonic() < deadline, vm.log_path.read_text()
                time.sleep(0.05)
            assert group.poll() is None  # the new trainer runs: the VM stays up
        finally:
            group.kill()

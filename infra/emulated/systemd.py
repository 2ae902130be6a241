"""An emulated systemd for an emulated TPU VM: what PID 1 does for the startup script and the
trainer service, faithfully enough that the script behaves here as on a real VM.

On a TPU VM, systemd runs the startup script in ``google-startup-scripts.service`` (a oneshot
with ``KillMode=process``, GoogleCloudPlatform/guest-agent ``google-startup-scripts.service``),
and the script hands the trainer to its own unit, ``multislice-trainer.service``, through
``systemctl``. Here :func:`boot` (``python -m infra.emulated.systemd boot``) is the VM's first
process, leader of its session (:mod:`infra.emulated.vm`). It

* puts a ``systemctl`` on the script's ``PATH`` (``python -m infra.emulated.systemctl``,
  talking to this process over a loopback connection with a random key) that implements
  ``daemon-reload``, ``start``, ``stop``, ``restart``, ``reset-failed``, ``is-active``,
  ``show`` and ``status`` for service units;
* runs each unit from the SAME unit file the script wrote, as systemd would
  (:class:`infra.emulated.service_manager.Manager`: restarts, backoff, start limit, stop signal
  and timeout, ``ExecStopPost=``);
* on SIGTERM (the VM's ACPI shutdown) stops every unit as above, sends SIGTERM to the startup
  script's main process only (``KillMode=process``), then SIGTERM and, after
  :data:`FINAL_KILL_WAIT_S`, SIGKILL to whatever is left, like systemd-shutdown;
* when the emulator that booted the VM dies (its lifeline, :mod:`infra.emulated.lifeline`,
  reaches end-of-file), powers the VM off: SIGKILL to every process of its session, then exits;

Emulation only: when the startup script has ended and no unit runs or waits to restart, the
VM has nothing left to do and this process exits — 0, or the script's failing status, or a
failed unit's exit status (1 if it ended by a signal or hit the start limit). The emulator
(``infra.local.emulated_stack``) reads that as the VM's result. A compute-engine VM's release watch,
and the warm standby (``multislice-standby.service``: it waits for the trainer's next attempt), which
run as long as a real VM does, are no work of their own (they are stopped then), the watch except while
the trainer has stopped to wait for it (``trainer.sh``'s status 76: a newer release is recorded)
or while a boot holds the boot lock (the watch booting a new release).
"""

from __future__ import annotations

import fcntl
import hmac
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from infra.emulated import lifeline, systemctl as systemctl_client
from infra.emulated.service_manager import DEFAULT_TIMEOUT_STOP_S, POLL_S, JobFailed, Manager, Service, session_pids
from infra.vm_contract import (
    BOOT_LOCK_FILE,
    HOME_ENV,
    RELEASE_SUPERSEDED_STATUS,
    RELEASE_WATCH_UNIT,
    STANDBY_UNIT,
    SYSTEMD_DIR_ENV,
)

UNIT_DIR_ENV = SYSTEMD_DIR_ENV
ADDRESS_ENV = systemctl_client.ADDRESS_ENV
AUTHKEY_ENV = systemctl_client.AUTHKEY_ENV
STARTUP_UNIT = "google-startup-scripts.service"
#: Seconds between SIGTERM and SIGKILL for processes left after every unit stopped.
FINAL_KILL_WAIT_S = 5.0


def systemctl(manager: Manager, argv: list[str]) -> tuple[int, str]:
    """Run one ``systemctl`` command line; (exit status, output)."""
    quiet = value_only = False
    properties: list[str] = []
    words: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg in ("-q", "--quiet"):
            quiet = True
        elif arg == "--value":
            value_only = True
        elif arg in ("-p", "--property"):
            properties += next(args, "").split(",")
        elif arg.startswith("--property="):
            properties += arg.split("=", 1)[1].split(",")
        elif arg in ("--no-pager", "--no-block", "--no-ask-password"):
            pass
        elif arg.startswith("-"):
            return 1, f"emulated systemctl: option {arg} is not implemented\n"
        else:
            words.append(arg)
    if not words:
        return 1, "emulated systemctl: no command\n"
    command, units = words[0], words[1:]
    try:
        if command == "daemon-reload":
            manager.daemon_reload()
            return 0, ""
        if not units:
            return 1, f"emulated systemctl: {command} needs a unit\n"
        output = []
        code = 0
        for name in units:
            if command in ("start", "stop", "restart", "reset-failed"):
                getattr(manager, command.replace("-", "_"))(name)
            elif command == "is-active":
                state = manager.service(name).state
                code = code or (0 if state == "active" else 3)
                output.append("" if quiet else f"{state}\n")
            elif command in ("show", "status"):
                output.append(_show(manager.service(name), properties, value_only, command == "status"))
            else:
                return 1, f"emulated systemctl: command {command} is not implemented\n"
        return code, "".join(output)
    except JobFailed as err:
        return err.code, f"{err}\n"


def _show(service: Service, properties: list[str], value_only: bool, status: bool) -> str:
    values = {
        "Id": service.unit.name,
        "ActiveState": service.state,
        "Result": service.result,
        "NRestarts": str(service.n_restarts),
        "MainPID": str(service.proc.pid if service.proc is not None and service.state == "active" else 0),
        "ExecMainCode": service.exit_code,
        "ExecMainStatus": service.exit_status,
    }
    if status:
        return f"● {service.unit.name}\n     Active: {service.state} (result: {service.result})\n"
    keys = properties or list(values)
    return "".join(f"{values.get(k, '')}\n" if value_only else f"{k}={values.get(k, '')}\n" for k in keys)


def _request(line: bytes, key: str) -> list[str] | None:
    """The arguments of a ``systemctl`` request line (:func:`infra.emulated.systemctl.request_line`),
    or None: not one whole JSON line, not the key, or arguments that are not strings."""
    if not line.endswith(b"\n"):
        return None
    try:
        request = json.loads(line)
    except ValueError:
        return None
    if not isinstance(request, dict) or not isinstance(request.get("key"), str):
        return None
    if not hmac.compare_digest(request["key"].encode(), key.encode()):
        return None
    argv = request.get("argv")
    return argv if isinstance(argv, list) and all(isinstance(a, str) for a in argv) else None


#: How long a connected ``systemctl`` has to send its request line (the job itself is not bounded:
#: ``systemctl restart`` waits for it, as systemd's does).
REQUEST_TIMEOUT_S = 30.0


def _serve(manager: Manager, listener: socket.socket, key: str, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
    def handle(conn: socket.socket) -> None:
        with conn:
            try:
                conn.settimeout(request_timeout_s)
                argv = _request(conn.makefile("rb").readline(systemctl_client.LINE_LIMIT), key)
                if argv is not None:  # else closed unanswered: the caller says there was no answer
                    answer = (json.dumps(list(systemctl(manager, argv))) + "\n").encode()
                    conn.settimeout(None)
                    conn.sendall(answer)
            except OSError:  # TimeoutError included: a caller that sent nothing is dropped
                pass

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def boot(script: Path, unit_dir: Path, runtime_dir: Path) -> int:
    """Be the VM's systemd: run ``script`` as the startup-script unit, serve ``systemctl``,
    supervise units until the VM has nothing left to do or is shut down (SIGTERM/SIGINT/SIGHUP).
    Returns the VM's result (see the module docstring)."""
    try:
        os.setsid()  # a VM is a session of its own (the emulator already makes it one)
    except OSError:
        pass
    leader = os.getsid(0) == os.getpid()
    stopping: list[signal.Signals] = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stopping.append(signal.Signals(signum)))
    authkey = secrets.token_hex(16)
    listener = socket.create_server(("127.0.0.1", 0))
    bin_dir = runtime_dir / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shim = bin_dir / "systemctl"
    shim.write_text(f"#!/bin/sh\nexec '{sys.executable}' -m infra.emulated.systemctl \"$@\"\n")
    shim.chmod(0o755)
    env = dict(os.environ)
    env.update(
        {
            "PATH": f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}",
            UNIT_DIR_ENV: str(unit_dir),
            ADDRESS_ENV: "{}:{}".format(*listener.getsockname()[:2]),
            AUTHKEY_ENV: authkey,
        }
    )
    lifeline_fd = lifeline.inherited_fd(env)
    env.pop(lifeline.LIFELINE_FD_ENV, None)  # the VM's own processes do not watch it
    manager = Manager(unit_dir, env)
    threading.Thread(target=_serve, args=(manager, listener, authkey), daemon=True).start()
    if lifeline_fd is not None:
        lifeline.watch(lifeline_fd, lambda: _power_off(manager, leader))
    script_proc = subprocess.Popen(["bash", str(script)], env=env, stdin=subprocess.DEVNULL, process_group=0)
    script_status: int | None = None
    try:
        while not stopping:
            manager.tick()
            if script_status is None and script_proc.poll() is not None:
                script_status = script_proc.returncode
                manager.say(
                    f"{STARTUP_UNIT}: "
                    + (
                        "Deactivated successfully."
                        if script_status == 0
                        else f"Main process exited, status={script_status}"
                    )
                )
            if script_status is not None and not _has_work(manager) and not _booting(env.get(HOME_ENV)):
                for idle in (STANDBY_UNIT, RELEASE_WATCH_UNIT):
                    if idle in manager.services:
                        manager.stop(idle)
                return _result(manager, script_status)
            time.sleep(POLL_S)
        manager.say(f"Received {stopping[0].name}: stopping every unit (shutdown)")
        manager.stop_all()
        if script_proc.poll() is None:
            os.kill(script_proc.pid, signal.SIGTERM)  # google-startup-scripts.service: KillMode=process
            try:
                script_proc.wait(DEFAULT_TIMEOUT_STOP_S)
            except subprocess.TimeoutExpired:
                pass
        if leader:  # never signal a session this process does not own
            _final_kill(os.getsid(0))
        return 128 + stopping[0]
    finally:
        listener.close()


def _has_work(manager: Manager) -> bool:
    """Whether a unit runs or waits to restart, the release watch counting only while a unit
    that exited with :data:`RELEASE_SUPERSEDED_STATUS` waits for it (see the module docstring)."""
    busy = ("active", "deactivating", "activating")
    others = [s for name, s in manager.services.items() if name not in (RELEASE_WATCH_UNIT, STANDBY_UNIT)]
    if any(s.state in busy for s in others):
        return True
    watch = manager.services.get(RELEASE_WATCH_UNIT)
    waiting = any(
        s.state == "failed" and (s.exit_code, s.exit_status) == ("exited", str(RELEASE_SUPERSEDED_STATUS))
        for s in others
    )
    return waiting and watch is not None and watch.state in busy


def _booting(home: str | None) -> bool:
    """Whether a boot runs on the VM's disk: it holds the boot lock (:data:`BOOT_LOCK_FILE`) from
    start to end. A release watch's boot stops the trainer and starts it again with the new
    release (``reset-failed``, then ``restart``): between the two no unit runs, and without this
    the VM would look idle and power off in the middle of its boot."""
    if not home:
        return False
    try:
        fd = os.open(Path(home) / BOOT_LOCK_FILE, os.O_RDONLY)
    except OSError:
        return False  # no boot has run
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this took
    return False


def _result(manager: Manager, script_status: int) -> int:
    if script_status != 0:
        return script_status
    for service in manager.services.values():
        if service.state == "failed":
            exited = service.exit_code == "exited" and service.result == "exit-code"
            return int(service.exit_status) if exited else 1
    return 0


def _power_off(manager: Manager, leader: bool) -> None:
    """The emulator that started this VM is gone (its lifeline was cut): nothing may train
    unsupervised. Power the VM off: SIGKILL every other process of the session until none is
    left (no unit can start meanwhile: the manager's lock is held), then exit."""
    manager.lock.acquire()  # never released: the process exits below
    manager.say("the emulator is gone (lifeline cut): powering off (SIGKILL to every process)")
    if leader:
        sid = os.getsid(0)
        deadline = time.monotonic() + FINAL_KILL_WAIT_S
        while (pids := session_pids(sid, exclude=os.getpid())) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(POLL_S)
    else:  # not a session of its own: only the units' groups are this VM's
        for service in list(manager.services.values()):
            if service.proc is not None:
                try:
                    os.killpg(service.proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
    sys.stdout.flush()
    os._exit(128 + signal.SIGKILL)


def _final_kill(sid: int) -> None:
    """SIGTERM, then after FINAL_KILL_WAIT_S SIGKILL, to every other process of the session."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_pids(sid, exclude=os.getpid()):
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + FINAL_KILL_WAIT_S
        while session_pids(sid, exclude=os.getpid()) and time.monotonic() < deadline:
            time.sleep(POLL_S)


def main(argv: list[str]) -> int:
    """``boot --unit-dir DIR --runtime-dir DIR SCRIPT`` or ``systemctl ARGS...``."""
    if argv[:1] == ["systemctl"]:
        return systemctl_client.main(argv[1:])
    if len(argv) == 6 and argv[0] == "boot" and argv[1] == "--unit-dir" and argv[3] == "--runtime-dir":
        return boot(Path(argv[5]), Path(argv[2]), Path(argv[4]))
    print(
        "usage: python -m infra.emulated.systemd boot --unit-dir DIR --runtime-dir DIR SCRIPT | systemctl ARGS...",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

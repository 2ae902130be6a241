"""The service manager of an emulated TPU VM: service units run as systemd runs them.

:class:`Manager` starts, stops and restarts the units in one directory the way systemd.service(5)
and systemd.kill(5) (https://www.freedesktop.org/software/systemd/man/) describe, reading each
unit file with :mod:`infra.emulated.units`:

* ``ExecStart=`` in a process group of its own (the unit's cgroup), with the manager's
  environment plus ``Environment=`` (:func:`unit_environment`), in ``WorkingDirectory=``;
* after the main process exits: the rest of the group gets ``KillSignal=``; ``ExecStopPost=``
  runs with ``SERVICE_RESULT``, ``EXIT_CODE``, ``EXIT_STATUS``; ``Restart=on-failure``
  restarts after ``RestartSec=`` unless the exit was clean (0, ``SuccessExitStatus=``, or
  SIGHUP/SIGINT/SIGTERM/SIGPIPE) or its status is in ``RestartPreventExitStatus=``, and
  whatever ``Restart=`` says when it is in ``RestartForceExitStatus=`` (systemd's
  ``service_shall_restart``, src/core/service.c), counting ``NRestarts`` (reset by a start that is
  not a restart); a clean exit that is not restarted logs ``Deactivated successfully``;
* starts beyond ``StartLimitBurst=`` per ``StartLimitIntervalSec=`` fail with ``start-limit-hit``;
* a stop sends ``KillSignal=`` to the group (``KillMode=control-group``; ``mixed``/``process``:
  the main process), then SIGKILL after ``TimeoutStopSec=``, and never restarts;
* systemd's own status lines (``systemd[1]: ...``) go to the console.

:mod:`infra.emulated.systemd` runs it as the VM's first process and serves ``systemctl``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from infra.emulated.units import ServiceUnit, UnitError, parse_service

#: The emulated VM's site directory (``infra.local.topology.VM_SITE_DIR``), named in the VM's
#: environment: the emulation's stand-in for libtpu, which a TPU VM has installed for every
#: Python whatever a unit's ``PYTHONPATH``.
VM_SITE_ENV = "MULTISLICE_VM_SITE"


def unit_environment(base: dict[str, str], unit: dict[str, str]) -> dict[str, str]:
    """A unit's processes' environment: ``base`` (the manager's) updated with the unit's
    ``Environment=``; where ``base`` names the VM's site directory (:data:`VM_SITE_ENV`), it
    stays on ``PYTHONPATH`` after the unit's own entries, so every Python of the VM loads the
    stand-in for libtpu (infra/emulated/vm_site/sitecustomize.py)."""
    env = {**base, **unit}
    site = base.get(VM_SITE_ENV)
    if site and "PYTHONPATH" in unit:
        parts = [p for p in unit["PYTHONPATH"].split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(parts + ([site] if site not in parts else []))
    return env


#: systemd's default stop timeout (DefaultTimeoutStopSec=, systemd-system.conf(5)), used
#: for the startup script's unit, which sets none.
DEFAULT_TIMEOUT_STOP_S = 90.0
POLL_S = 0.05
#: Signals that make a clean exit (systemd.service(5), the table under Restart=).
CLEAN_SIGNALS = frozenset({signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGPIPE})


class JobFailed(Exception):
    """A systemctl request failed; ``code`` is systemctl's exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Service:
    """The runtime state of one service unit (what ``systemctl show`` reports)."""

    def __init__(self, unit: ServiceUnit) -> None:
        self.unit = unit
        self.state = "inactive"  # inactive | active | deactivating | activating (auto-restart) | failed
        self.result = "success"
        self.n_restarts = 0
        self.proc: subprocess.Popen | None = None
        self.restart_at: float | None = None
        self.exit_code, self.exit_status = "", ""
        self._limit_begin: float | None = None
        self._limit_count = 0

    def allow_start(self, now: float) -> bool:
        """systemd's start rate limit: at most ``StartLimitBurst`` starts per window of
        ``StartLimitIntervalSec`` (the window opens at the first start after the last one
        closed)."""
        unit = self.unit
        if unit.start_limit_interval_sec <= 0 or unit.start_limit_burst <= 0:
            return True
        if self._limit_begin is None or now - self._limit_begin > unit.start_limit_interval_sec:
            self._limit_begin, self._limit_count = now, 0
        if self._limit_count >= unit.start_limit_burst:
            return False
        self._limit_count += 1
        return True

    def reset_limit(self) -> None:
        self._limit_begin, self._limit_count = None, 0


class Manager:
    """The service manager of one emulated VM (see the module docstring)."""

    def __init__(self, unit_dir: Path, env: dict[str, str]) -> None:
        self.unit_dir = Path(unit_dir)
        self.env = env
        self.services: dict[str, Service] = {}
        self.lock = threading.RLock()

    def say(self, text: str) -> None:
        """One status line on the console, in one write: the VM's other processes write to the same
        console, and ``print`` under ``PYTHONUNBUFFERED`` writes the text and its newline apart."""
        sys.stdout.write(f"systemd[1]: {text}\n")
        sys.stdout.flush()

    # units ------------------------------------------------------------------------------------

    def _read(self, name: str) -> ServiceUnit:
        path = self.unit_dir / name
        if not name.endswith(".service") or not path.is_file():
            raise JobFailed(f"Unit {name} not found.", 5)
        try:
            return parse_service(path.read_text(), name)
        except UnitError as err:
            raise JobFailed(f"Unit {name} has a bad setting: {err}", 1) from None

    def service(self, name: str) -> Service:
        with self.lock:
            if name not in self.services:
                self.services[name] = Service(self._read(name))
            return self.services[name]

    def daemon_reload(self) -> None:
        with self.lock:
            for name, service in self.services.items():
                service.unit = self._read(name)

    # jobs -------------------------------------------------------------------------------------

    def start(self, name: str, *, auto: bool = False) -> None:
        service = self.service(name)
        self._settle(service)
        with self.lock:
            if service.state == "active" or (auto and service.state != "activating"):
                return
            if not auto:
                service.n_restarts = 0
            service.restart_at = None
            if not service.allow_start(time.monotonic()):
                service.state, service.result = "failed", "start-limit-hit"
                self.say(f"{name}: Start request repeated too quickly.")
                self.say(f"{name}: Failed with result 'start-limit-hit'.")
                raise JobFailed(f"Job for {name} failed because start of the service was attempted too often.")
            unit = service.unit
            try:
                service.proc = subprocess.Popen(
                    list(unit.exec_start),
                    cwd=unit.working_directory,
                    env=unit_environment(self.env, unit.environment),
                    stdin=subprocess.DEVNULL,
                    process_group=0,  # its own group: the unit's cgroup
                )
            except OSError as err:
                service.state, service.result = "failed", "resources"
                raise JobFailed(f"Job for {name} failed: {err}") from None
            service.state, service.result = "active", "success"
            self.say(f"Started {name}.")

    def stop(self, name: str) -> None:
        service = self.service(name)
        self._settle(service)
        with self.lock:
            service.restart_at = None
            if service.state == "activating":
                service.state = "inactive"
            if service.state != "active":
                return
            service.state = "deactivating"
            self.say(f"Stopping {name}...")
            self._kill(service, service.unit.kill_signal, main_only=service.unit.kill_mode != "control-group")
        self._collect(service, stopping=True)

    def restart(self, name: str) -> None:
        self.stop(name)
        self.start(name)

    def reset_failed(self, name: str) -> None:
        service = self.service(name)
        with self.lock:
            if service.state == "failed":
                service.state, service.result = "inactive", "success"
            service.reset_limit()

    def _settle(self, service: Service) -> None:
        """Wait while another thread is collecting the service's exit."""
        while service.state == "deactivating":
            time.sleep(POLL_S)

    def _kill(self, service: Service, sig: signal.Signals, *, main_only: bool = False) -> None:
        assert service.proc is not None
        try:
            if main_only:
                os.kill(service.proc.pid, sig)
            else:
                os.killpg(service.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _collect(self, service: Service, *, stopping: bool) -> None:
        """After a stop request or the main process's exit: wait ``TimeoutStopSec=`` for the
        unit's processes, SIGKILL what is left, run ``ExecStopPost=``, decide on a restart."""
        unit, proc = service.unit, service.proc
        assert proc is not None
        deadline = time.monotonic() + unit.timeout_stop_sec
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        if not stopping and unit.kill_mode != "process":  # the rest of the cgroup goes too
            self._kill(service, unit.kill_signal)
        # KillMode=process: "only the main process itself is killed" (systemd.kill(5)); the unit's
        # other processes are neither waited for nor killed (the warm standby's attempts).
        whole_group = unit.kill_mode != "process"
        while whole_group and _group_alive(proc.pid) and time.monotonic() < deadline:
            proc.poll()
            time.sleep(POLL_S)
        timed_out = proc.poll() is None or (whole_group and _group_alive(proc.pid))
        if timed_out:
            self.say(f"{unit.name}: State 'stop-sigterm' timed out. Killing.")
            self._kill(service, signal.SIGKILL, main_only=not whole_group)
            proc.wait()
        code = proc.returncode
        if code >= 0:
            service.exit_code, service.exit_status = "exited", str(code)
            status: int | signal.Signals = code
            clean = code == 0 or code in unit.success_exit_status
            result = "success" if clean else "exit-code"
        else:
            status = signal.Signals(-code)
            service.exit_code, service.exit_status = "killed", status.name.removeprefix("SIG")
            clean = status in CLEAN_SIGNALS or status in unit.success_exit_status
            result = "success" if clean else "signal"
        if timed_out:
            clean, result = False, "timeout"
        if not clean:
            self.say(f"{unit.name}: Main process exited, code={service.exit_code}, status={service.exit_status}")
        post_env = {
            **unit_environment(self.env, unit.environment),
            "SERVICE_RESULT": result,
            "EXIT_CODE": service.exit_code,
            "EXIT_STATUS": service.exit_status,
        }
        for command in unit.exec_stop_post:
            try:
                subprocess.run(
                    list(command),
                    cwd=unit.working_directory,
                    env=post_env,
                    stdin=subprocess.DEVNULL,
                    timeout=unit.timeout_stop_sec,
                )
            except (OSError, subprocess.TimeoutExpired) as err:
                self.say(f"{unit.name}: ExecStopPost= failed: {err}")
        # systemd's service_shall_restart: a manual stop, then RestartPreventExitStatus=, then
        # RestartForceExitStatus= (a restart whatever Restart= says), then Restart=.
        restart = (
            not stopping
            and status not in unit.restart_prevent_exit_status
            and (
                status in unit.restart_force_exit_status
                or unit.restart == "always"
                or (unit.restart == "on-failure" and not clean)
            )
        )
        with self.lock:
            service.result = result
            if restart:
                service.state, service.restart_at = "activating", time.monotonic() + unit.restart_sec
            elif clean:
                service.state = "inactive"
                self.say(f"{unit.name}: Deactivated successfully.")
            else:
                service.state = "failed"
                self.say(f"{unit.name}: Failed with result '{result}'.")

    def tick(self) -> None:
        """Collect exited services and run the restarts that are due."""
        for name, service in list(self.services.items()):
            with self.lock:
                exited = service.state == "active" and service.proc is not None and service.proc.poll() is not None
                if exited:
                    service.state = "deactivating"
            if exited:
                self._collect(service, stopping=False)
            if (
                service.state == "activating"
                and service.restart_at is not None
                and time.monotonic() >= service.restart_at
            ):
                with self.lock:
                    service.n_restarts += 1
                self.say(f"{name}: Scheduled restart job, restart counter is at {service.n_restarts}.")
                try:
                    self.start(name, auto=True)
                except JobFailed:
                    pass

    def stop_all(self) -> None:
        """Stop every unit, the last started first (systemd stops units in the reverse order of
        their ``Before=``/``After=`` ordering, systemd.unit(5): the standby, ``Before=`` the trainer,
        after it)."""
        for name in reversed(list(self.services)):
            self.stop(name)


def _live_pids(matches: Callable[[int], bool], exclude: int | None = None) -> list[int]:
    """Non-zombie processes for which ``matches(pid)`` holds (a zombie whose parent has not
    reaped it yet is gone for our purposes)."""
    import psutil

    found = []
    for process in psutil.process_iter(["status"]):
        try:
            if process.pid != exclude and process.info["status"] != psutil.STATUS_ZOMBIE and matches(process.pid):
                found.append(process.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return found


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` has a live process."""
    return bool(_live_pids(lambda pid: os.getpgid(pid) == pgid))


def session_pids(sid: int, exclude: int | None = None) -> list[int]:
    """Live (non-zombie) processes of session ``sid``."""
    return _live_pids(lambda pid: os.getsid(pid) == sid, exclude)

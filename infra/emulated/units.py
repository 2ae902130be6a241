"""systemd unit files as systemd reads them, for the emulated VM's service manager.

:func:`parse_service` reads the ``.service`` file the startup script writes (the same bytes a
real TPU VM's systemd reads) into a :class:`ServiceUnit`: the directives the emulated
manager (:mod:`infra.emulated.systemd`) acts on. Syntax per systemd.syntax(7), time spans per
systemd.time(7), directives per systemd.unit(5), systemd.service(5) and systemd.kill(5)
(https://www.freedesktop.org/software/systemd/man/). Unlike systemd, which warns about an
unknown directive and ignores it, an unknown one here is an error: the emulation must not
silently run something other than what the VM would.
"""

from __future__ import annotations

import re
import shlex
import signal
from dataclasses import dataclass, field

#: Directives this emulation understands, per section (anything else is a UnitError).
KNOWN = {
    "Unit": {
        "Description", "Documentation", "Wants", "Requires", "After", "Before", "StartLimitIntervalSec",
        "StartLimitBurst",
    },
    "Service": {
        "Type", "ExecStart", "ExecStopPost", "WorkingDirectory", "Environment", "Restart", "RestartSec",
        "RestartPreventExitStatus", "RestartForceExitStatus", "SuccessExitStatus", "KillMode", "KillSignal",
        "TimeoutStopSec", "StandardOutput", "StandardError", "SyslogIdentifier",
    },
    "Install": {"WantedBy"},
}  # fmt: skip

#: systemd.time(7) units, in seconds.
_TIME_UNITS = {
    **dict.fromkeys(("usec", "us", "µs"), 1e-6),
    **dict.fromkeys(("msec", "ms"), 1e-3),
    **dict.fromkeys(("seconds", "second", "sec", "s", ""), 1.0),
    **dict.fromkeys(("minutes", "minute", "min", "m"), 60.0),
    **dict.fromkeys(("hours", "hour", "hr", "h"), 3600.0),
    **dict.fromkeys(("days", "day", "d"), 86400.0),
    **dict.fromkeys(("weeks", "week", "w"), 604800.0),
}
_TIME_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zµ]*)", re.I)


class UnitError(ValueError):
    """A unit file this emulation cannot run exactly as systemd would (message names the line)."""


@dataclass(frozen=True)
class ServiceUnit:
    """The directives of one ``.service`` unit (defaults as systemd's).

    Times are seconds (``inf`` for ``infinity``); exit statuses are ints for exit codes and
    :class:`signal.Signals` for termination signals.
    """

    name: str
    exec_start: tuple[str, ...]
    exec_stop_post: tuple[tuple[str, ...], ...] = ()
    working_directory: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    restart: str = "no"
    restart_sec: float = 0.1
    restart_prevent_exit_status: frozenset[int | signal.Signals] = frozenset()
    restart_force_exit_status: frozenset[int | signal.Signals] = frozenset()
    success_exit_status: frozenset[int | signal.Signals] = frozenset()
    kill_mode: str = "control-group"
    kill_signal: signal.Signals = signal.SIGTERM
    timeout_stop_sec: float = 90.0
    start_limit_interval_sec: float = 10.0
    start_limit_burst: int = 5


def parse_timespan(value: str) -> float:
    """Seconds in a systemd time span (``100ms``, ``1min 30s``, ``5``, ``infinity``).

    Raises:
      UnitError: not a time span.
    """
    text = value.strip()
    if text == "infinity":
        return float("inf")
    total, position = 0.0, 0
    for match in _TIME_PART.finditer(text):
        if match.start() != position or match.group(2) not in _TIME_UNITS:
            break
        total += float(match.group(1)) * _TIME_UNITS[match.group(2)]
        position = match.end()
    if not text or position != len(text):
        raise UnitError(f"not a time span: {value!r}")
    return total


def parse_statuses(value: str) -> frozenset[int | signal.Signals]:
    """Exit statuses: numbers 0–255 and signal names (``78 SIGABRT``).

    Raises:
      UnitError: neither a number in 0–255 nor a signal name.
    """
    statuses: set[int | signal.Signals] = set()
    for word in value.split():
        if word.isdigit() and 0 <= int(word) <= 255:
            statuses.add(int(word))
        elif word.startswith("SIG") and word in signal.Signals.__members__:
            statuses.add(signal.Signals[word])
        else:
            raise UnitError(f"not an exit status or signal name: {word!r}")
    return frozenset(statuses)


def _command(value: str) -> tuple[str, ...]:
    """An ``ExecStart=``-style command line: an absolute executable and its arguments
    (quoting as systemd.service(5) "Command lines"; ``$`` and ``%`` expansion, which this
    emulation does not do, are refused)."""
    if any(c in value for c in "$%"):
        raise UnitError(f"command line uses $-variables or %-specifiers this emulation does not expand: {value!r}")
    argv = tuple(shlex.split(value))
    if not argv or not argv[0].startswith("/"):
        raise UnitError(f"command line must start with an absolute path: {value!r}")
    return argv


def _sections(text: str, name: str) -> dict[str, list[tuple[str, str]]]:
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            if current not in KNOWN:
                raise UnitError(f"{name}:{number}: unknown section [{current}]")
            sections.setdefault(current, [])
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if current is None or not sep:
            raise UnitError(f"{name}:{number}: expected Key=Value inside a section: {raw!r}")
        if key not in KNOWN[current]:
            raise UnitError(f"{name}:{number}: [{current}] {key}= is not a directive this emulation implements")
        sections[current].append((key, value.strip()))
    return sections


def parse_service(text: str, name: str) -> ServiceUnit:
    """A ``.service`` unit file's text as a :class:`ServiceUnit`.

    Raises:
      UnitError: a syntax error, an unknown section or directive, a value of the wrong form,
        ``Type=`` other than ``simple``, or no ``ExecStart=`` (the message names the line).
    """
    sections = _sections(text, name)
    fields: dict[str, object] = {"name": name}
    environment: dict[str, str] = {}
    stop_post: list[tuple[str, ...]] = []
    prevent: set[int | signal.Signals] = set()
    force: set[int | signal.Signals] = set()
    success: set[int | signal.Signals] = set()
    for key, value in sections.get("Unit", []):
        if key == "StartLimitIntervalSec":
            fields["start_limit_interval_sec"] = parse_timespan(value)
        elif key == "StartLimitBurst":
            if not value.isdigit():
                raise UnitError(f"{name}: StartLimitBurst={value!r} is not a number")
            fields["start_limit_burst"] = int(value)
    for key, value in sections.get("Service", []):
        if key == "Type" and value != "simple":
            raise UnitError(f"{name}: Type={value} is not emulated (only simple)")
        elif key == "ExecStart":
            fields["exec_start"] = _command(value)
        elif key == "ExecStopPost":
            stop_post.append(_command(value))
        elif key == "WorkingDirectory":
            fields["working_directory"] = value
        elif key == "Environment":
            for assignment in shlex.split(value):
                variable, sep, setting = assignment.partition("=")
                if not sep or not variable:
                    raise UnitError(f"{name}: Environment= entry {assignment!r} is not VAR=value")
                environment[variable] = setting
        elif key == "Restart":
            if value not in ("no", "on-failure", "always"):
                raise UnitError(f"{name}: Restart={value} is not emulated (no, on-failure, always)")
            fields["restart"] = value
        elif key == "RestartSec":
            fields["restart_sec"] = parse_timespan(value)
        elif key == "RestartPreventExitStatus":
            prevent.update(parse_statuses(value))
        elif key == "RestartForceExitStatus":
            force.update(parse_statuses(value))
        elif key == "SuccessExitStatus":
            success.update(parse_statuses(value))
        elif key == "KillMode":
            if value not in ("control-group", "mixed", "process"):
                raise UnitError(f"{name}: KillMode={value} is not emulated")
            fields["kill_mode"] = value
        elif key == "KillSignal":
            signame = value if value.startswith("SIG") else f"SIG{value}"
            if signame not in signal.Signals.__members__:
                raise UnitError(f"{name}: KillSignal={value} is not a signal")
            fields["kill_signal"] = signal.Signals[signame]
        elif key == "TimeoutStopSec":
            fields["timeout_stop_sec"] = parse_timespan(value)
    if "exec_start" not in fields:
        raise UnitError(f"{name}: no ExecStart=")
    return ServiceUnit(
        **fields,  # type: ignore[arg-type]
        exec_stop_post=tuple(stop_post),
        environment=environment,
        restart_prevent_exit_status=frozenset(prevent),
        restart_force_exit_status=frozenset(force),
        success_exit_status=frozenset(success),
    )

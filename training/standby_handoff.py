"""An attempt of the trainer handed to the VM's warm standby, or started cold.

``trainer.sh run`` (``multislice-trainer.service``'s ``ExecStart=``) becomes
``python -m training.standby_handoff --config CONFIG --run-dir RUN_DIR`` when the VM runs a standby
(``multislice-standby.service``, :mod:`training.standby`; ``MULTISLICE_STANDBY_DIR`` names its folder).
This module imports nothing heavy (the standard library and :mod:`training.knobs`): it is the
unit's main process for the whole attempt, and must start in milliseconds.

* **Warm.** The standby's record (:data:`STATE_FILE`) says it is ready with this release: the
  attempt's arguments, environment, working directory and standard streams (their file
  descriptors, ``SCM_RIGHTS``: unix(7)) go to it over its socket; it forks the attempt from its
  warm interpreter and answers with the attempt's pid. From then on this process passes SIGTERM,
  SIGINT and SIGHUP on to the attempt (systemd signals the unit's main process: a preemption's stop,
  ``systemctl stop``), and ends with the attempt's status (or is killed by the signal that killed
  it), which systemd's ``Restart=``, ``ExecStopPost=`` and ``trainer.sh stopped`` read as they read
  the trainer's. The attempt ends itself if this process dies (a unit killed at
  ``TimeoutStopSec=``): it watches this side of the connection.
* **Cold.** No standby, one still preparing past :data:`PREPARE_WAIT_S`, one of another release,
  one that does not answer within :data:`ANSWER_TIMEOUT_S` (it is killed: systemd's
  ``Restart=always`` starts another), or one that refuses: this process becomes
  ``python -m training run`` (``os.execv``: same pid) as trainer.sh did before, having said why.

Either way one line says which (``trainer: warm start: …`` or ``trainer: cold start: …``), and the
attempt's start event records it (``MULTISLICE_START``; docs/goodput.md).

The protocol (one JSON object per line, both ways): the request ``{"argv", "env", "cwd",
"release", "started"}`` with the three descriptors; the answers ``{"pid"}`` then ``{"status"}`` or
``{"signal"}`` when the attempt ends, or ``{"refused"}``.
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

from training import knobs
from training.metrics.goodput import process_start_time
from training.run_objects import file_bytes, json_record

#: The standby's folder (set in both units' environment by boot.sh).
DIR_ENV = "MULTISLICE_STANDBY_DIR"
#: The standby's record in that folder: ``{"pid", "state": "preparing"|"ready", "release", "since"}``.
STATE_FILE = "standby.json"
#: The most bytes the standby's record may have.
STATE_LIMIT = 65536
#: How the attempt started, for its start event: ``warm``, ``warm waited <seconds>`` (it waited for
#: the standby to prepare) or ``cold: <why>``.
START_ENV = "MULTISLICE_START"
#: The handoff's own process start (seconds since the epoch): the warm attempt's start-up counts from
#: there, not from the fork (training.metrics.goodput.process_start_time).
STARTED_ENV = "MULTISLICE_ATTEMPT_STARTED"
#: How long an attempt waits for a standby that is still preparing (importing) before starting cold:
#: a standby prepares what a cold start would, so waiting costs nothing until this bound.
PREPARE_WAIT_S = 120.0
#: How long an attempt waits for the standby's record to name a live process: the boot starts the
#: standby just before the trainer, and removes an earlier boot's record.
APPEAR_WAIT_S = 15.0
#: How long a ready standby has to answer a request; past it, it is taken for hung and killed.
ANSWER_TIMEOUT_S = 10.0
#: Variables that differ between the two units' processes by nature: systemd's per-invocation ones
#: (systemd.exec(5), "Environment Variables Set or Propagated by the Service Manager"), bash's own,
#: the allocator tunable the trainer adds (training.host_allocator) and the handoff's.
PER_PROCESS_ENV = frozenset(
    {
        "INVOCATION_ID",
        "JOURNAL_STREAM",
        "SYSTEMD_EXEC_PID",
        "MANAGERPID",
        "MAINPID",
        "SHLVL",
        "PWD",
        "OLDPWD",
        "_",
        "GLIBC_TUNABLES",
        START_ENV,
        STARTED_ENV,
    }
)


#: In an attempt the standby forked: the handoff's connection, on which :func:`report_exit` sends
#: the attempt's status (the standby, its parent, may be gone by then: it reports only what it reaps).
_report_to: socket.socket | None = None


def report_to(sock: socket.socket) -> None:
    """Make :func:`report_exit` send to ``sock`` (the forked attempt's handoff connection)."""
    global _report_to
    _report_to = sock


def report_exit(code: int) -> None:
    """Tell the handoff this attempt's exit status, when a standby forked it (else nothing): the
    handoff then ends with it even if the standby was killed meanwhile. The attempt is ending:
    its handoff's exit is no reason to kill it any more (:func:`reported`)."""
    global _reported
    if _report_to is not None:
        _reported = True
        with contextlib.suppress(OSError):
            send_line(_report_to, {"status": code})


_reported = False


def reported() -> bool:
    """Whether this attempt has told its handoff its exit status (it is ending)."""
    return _reported


class StandbyRefused(Exception):
    """The standby cannot take this attempt; the message says why (the cold start's reason)."""


def socket_name(directory: str | os.PathLike[str]) -> bytes:
    """The standby's socket: an abstract unix socket (unix(7): no file, no path length limit) named
    after its folder's resolved path, so that every VM of a local emulation (one host, one network
    namespace) has its own. Only a process of the standby's own user is served (``SO_PEERCRED``)."""
    digest = hashlib.sha256(str(Path(directory).resolve()).encode()).hexdigest()[:24]
    return b"\0multislice-standby-" + digest.encode()


def release_of_this_code() -> str:
    """The release this code is (the folder that holds this ``training`` package, resolved): the
    standby serves only attempts of its own release."""
    return str(Path(__file__).resolve().parents[1])


def read_state(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The standby's record, or None when it is absent, unreadable or not an object (a regular file
    of at most :data:`STATE_LIMIT` bytes: training.run_objects)."""
    try:
        data = json_record(file_bytes(Path(directory) / STATE_FILE, STATE_LIMIT), STATE_LIMIT)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_state(directory: str | os.PathLike[str], state: Mapping[str, Any]) -> None:
    """Write the standby's record atomically (a reader sees the old one or the new one)."""
    path = Path(directory) / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{STATE_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps(dict(state)))
    os.replace(tmp, path)


def env_difference(mine: Mapping[str, str], theirs: Mapping[str, str]) -> str | None:
    """The first variable (sorted) set differently in the two environments, ignoring
    :data:`PER_PROCESS_ENV`; None when they agree. JAX and XLA read theirs at import or at backend
    creation, so a standby may take only an attempt whose environment is its own."""
    for key in sorted((set(mine) | set(theirs)) - PER_PROCESS_ENV):
        if mine.get(key) != theirs.get(key):
            return key
    return None


def send_line(sock: socket.socket, message: Mapping[str, Any], fds: list[int] | None = None) -> None:
    """One JSON line on ``sock``, with ``fds`` as ``SCM_RIGHTS`` ancillary data."""
    data = (json.dumps(dict(message)) + "\n").encode()
    if fds:
        sent = sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        data = data[sent:]
    if data:
        sock.sendall(data)


def recv_line(sock: socket.socket, limit: int = 1 << 20) -> tuple[dict[str, Any] | None, list[int]]:
    """The next JSON line on ``sock`` (None at end of stream) and the descriptors that came with it.

    Raises:
      ValueError: the line is not a JSON object, or longer than ``limit`` bytes.
      TimeoutError: the socket's timeout passed.
    """
    buffer, fds = b"", []
    fd_size = array.array("i").itemsize
    while not buffer.endswith(b"\n"):
        data, ancillary, _flags, _addr = sock.recvmsg(65536, socket.CMSG_SPACE(3 * fd_size))
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % fd_size])
                fds.extend(received)
        if not data:
            for fd in fds:
                os.close(fd)
            return None, []
        buffer += data
        if len(buffer) > limit:
            raise ValueError(f"a line of more than {limit} bytes")
    message = json_record(buffer, limit)
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    return message, fds


def read_line(stream: BinaryIO, limit: int = 1 << 20) -> dict[str, Any] | None:
    """The next JSON line of ``stream`` (a socket's ``makefile("rb")``: what a line leaves unread stays
    buffered for the next), or None at end of stream.

    Raises:
      ValueError: the line is not a JSON object, longer than ``limit`` bytes, or cut short.
      TimeoutError: the socket's timeout passed.
    """
    line = stream.readline(limit + 1)
    if not line:
        return None
    if len(line) > limit or not line.endswith(b"\n"):
        raise ValueError(f"a line cut short or longer than {limit} bytes")
    message = json_record(line, limit)
    if not isinstance(message, dict):
        raise ValueError("not a JSON object")
    return message


def _say(line: str) -> None:
    print(f"trainer: {line}", flush=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ready_standby(directory: Path, release: str, wait_s: float) -> dict[str, Any]:
    """The standby's record once it is ready with ``release``, with ``waited_s``: how long this
    attempt waited for it to prepare (a standby this boot started imports while the attempt waits).

    Raises:
      StandbyRefused: none runs, it prepares past ``wait_s``, or it holds another release (then it is
        stopped, so that systemd starts one of the current release).
    """
    began = time.monotonic()
    deadline = began + wait_s
    while True:
        state = read_state(directory)
        pid = state.get("pid") if state is not None else None
        if not isinstance(pid, int) or not _alive(pid):
            if time.monotonic() - began < min(APPEAR_WAIT_S, wait_s):
                time.sleep(0.1)
                continue
            if not isinstance(pid, int):
                raise StandbyRefused("no standby runs on this VM")
            raise StandbyRefused(f"the standby (pid {pid}) is gone; systemd starts another")
        assert state is not None
        if state.get("release") != release:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
            raise StandbyRefused(
                f"the standby holds release {str(state.get('release'))[:12]}, not {release[:12]}: stopped, so that "
                "systemd starts one of this release"
            )
        if state.get("state") == "ready":
            return {**state, "waited_s": round(time.monotonic() - began, 1)}
        if time.monotonic() >= deadline:
            raise StandbyRefused(f"the standby (pid {pid}) was still preparing after {wait_s:g} s")
        time.sleep(0.1)


def _hand_over(
    directory: Path, state: dict[str, Any], argv: list[str], answer_timeout_s: float
) -> tuple[socket.socket, BinaryIO, int]:
    """Send the attempt to the ready standby; its connection, the connection's reader (the attempt's
    status may follow the pid in the same read) and the attempt's pid.

    Raises:
      StandbyRefused: it refused, or did not answer within ``answer_timeout_s`` (then it is killed).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(answer_timeout_s)
    request = {
        "argv": argv,
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "release": state["release"],
        "started": process_start_time() or time.time(),
        "waited_s": state.get("waited_s", 0.0),
    }
    reader = sock.makefile("rb")
    try:
        sock.connect(socket_name(directory))
        send_line(sock, request, [0, 1, 2])
        answer = read_line(reader)
    except TimeoutError:
        sock.close()
        with contextlib.suppress(OSError):
            os.kill(state["pid"], signal.SIGKILL)
        raise StandbyRefused(
            f"the standby (pid {state['pid']}) did not answer in {answer_timeout_s:g} s: "
            "killed it; systemd starts another"
        ) from None
    except (OSError, ValueError) as err:
        sock.close()
        raise StandbyRefused(f"the standby could not be reached ({err})") from None
    if answer is None:
        sock.close()
        raise StandbyRefused("the standby closed the connection without an answer")
    if isinstance(answer.get("refused"), str):
        sock.close()
        raise StandbyRefused(f"the standby refused: {answer['refused']}")
    if not isinstance(answer.get("pid"), int):
        sock.close()
        raise StandbyRefused(f"the standby answered {json.dumps(answer)[:200]}")
    return sock, reader, answer["pid"]


def _follow(sock: socket.socket, reader: BinaryIO, pid: int) -> NoReturn:
    """Pass signals on to attempt ``pid`` and end as it ends (its status: the first line after the pid;
    the attempt and the standby may both send it)."""
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda received, _frame: _pass_on(pid, received))
    sock.settimeout(None)
    answer: dict[str, Any] | None = None
    with contextlib.suppress(OSError, ValueError):
        answer = read_line(reader)
    if answer is not None and isinstance(answer.get("status"), int):
        os._exit(answer["status"])
    if answer is not None and isinstance(answer.get("signal"), int):
        signum = answer["signal"]
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(signum, signal.SIG_DFL)
        with contextlib.suppress(OSError, ValueError):
            os.kill(os.getpid(), signum)
        time.sleep(1)
        os._exit(128 + signum)
    # The standby went away while the attempt ran (it was killed; the attempt was not): wait for the
    # attempt, whose status nobody can read now.
    while _alive(pid):
        time.sleep(0.5)
    _say(f"the attempt (pid {pid}) ended after its standby did; its status is unknown: reported as 1")
    os._exit(1)


def _pass_on(pid: int, signum: int) -> None:
    with contextlib.suppress(OSError):
        os.kill(pid, signum)


def cold(argv: list[str], reason: str) -> NoReturn:
    """Become ``python -m training ARGV`` (same pid), saying why the start is cold."""
    _say(f"cold start: {reason}")
    os.environ[START_ENV] = f"cold: {reason}"
    os.execv(sys.executable, [sys.executable, "-m", "training", *argv])


def main(args: list[str]) -> NoReturn:
    """``--config CONFIG --run-dir RUN_DIR``: the attempt, warm or cold."""
    if len(args) != 4 or args[0] != "--config" or args[2] != "--run-dir":
        print("usage: python -m training.standby_handoff --config CONFIG --run-dir RUN_DIR", file=sys.stderr)
        os._exit(2)
    argv = ["run", *args]
    directory = os.environ.get(DIR_ENV, "")
    if not directory:
        cold(argv, f"{DIR_ENV} is not set (no standby on this VM)")
    try:
        wait_s = knobs.seconds("MULTISLICE_STANDBY_WAIT_S", PREPARE_WAIT_S)
        answer_timeout_s = knobs.seconds("MULTISLICE_STANDBY_ANSWER_S", ANSWER_TIMEOUT_S)
    except knobs.KnobError as err:
        cold(argv, str(err))
    release = release_of_this_code()
    try:
        state = _ready_standby(Path(directory), release, wait_s)
        sock, reader, pid = _hand_over(Path(directory), state, argv, answer_timeout_s)
    except StandbyRefused as err:
        cold(argv, str(err))
    waited = float(state.get("waited_s") or 0.0)
    how = f"after waiting {waited:.1f} s for it to prepare" if waited >= 0.5 else "at once"
    _say(f"warm start {how}: the standby (pid {state['pid']}) runs this attempt as pid {pid}")
    _follow(sock, reader, pid)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Nothing outlives its supervisor: a lifeline pipe from ``multislice local up`` to every
process it starts.

The supervising process (``local up``, ``local status``) holds the write end of one pipe for
its whole life (:func:`read_end` creates it on first use; the write end is never inherited
by a child: Python's descriptors are close-on-exec, PEP 446) and never writes to it. Every
emulated VM's systemd and the emulated Cloud Storage receive the read end
(:data:`LIFELINE_FD_ENV`). When the supervisor dies, however it dies (SIGKILL included),
the kernel closes the write end and a read of the lifeline returns end-of-file at once:

* the VM's systemd (:mod:`infra.emulated.systemd`) then powers the VM off: SIGKILL to every
  process of its session (the trainer, the log shipper, ``ExecStopPost=`` helpers), then it
  exits;
* fake-gcs-server, a Go binary, runs under :func:`main` (``python -m infra.emulated.lifeline --
  BINARY ARGS``), which SIGKILLs it and exits;
* an emulated Pod's container (``python -m infra.emulated.lifeline --forward -- /bin/bash SCRIPT``)
  ends the same way, every process of its session with it.

Unlike ``PR_SET_PDEATHSIG`` (prctl(2): it fires on the death of the parent *thread*, is
cleared by the exec of a set-user-ID binary and is Linux-only), the pipe cannot miss a
death that happened before the child started watching: the read returns end-of-file then
too. Bound: the watchers notice within a few milliseconds; :data:`ORPHAN_STOP_S` is the
stated bound for every process of the run to be gone (tests/emulated/test_lifeline.py measures it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from infra.emulated.node_mounts import MountUnavailable, enter_noexec

#: Environment variable carrying the read end's descriptor number to a supervised process.
LIFELINE_FD_ENV = "MULTISLICE_LIFELINE_FD"
#: Seconds within which every process of a run is gone once its supervisor died (stated
#: bound; measured well under a second on an idle machine).
ORPHAN_STOP_S = 5.0

_pipe: tuple[int, int] | None = None


def read_end() -> int:
    """The read end of this process's lifeline (created on first use; the write end stays
    open, unwritten, until this process exits)."""
    global _pipe
    if _pipe is None:
        _pipe = os.pipe()
    return _pipe[0]


def child_settings() -> tuple[dict[str, str], tuple[int, ...]]:
    """What a supervised child needs: its extra environment and the descriptors to pass
    (``subprocess.Popen(pass_fds=...)``)."""
    fd = read_end()
    return {LIFELINE_FD_ENV: str(fd)}, (fd,)


def inherited_fd(env: dict[str, str] | None = None) -> int | None:
    """The lifeline descriptor this process received (:data:`LIFELINE_FD_ENV`), or None."""
    value = (os.environ if env is None else env).get(LIFELINE_FD_ENV, "")
    if not value.isdigit():
        return None
    fd = int(value)
    try:
        os.fstat(fd)
    except OSError:
        return None
    return fd


def watch(fd: int, on_cut: Callable[[], None]) -> threading.Thread:
    """Call ``on_cut()`` in a daemon thread once the lifeline ``fd`` reaches end-of-file (the
    supervisor is gone)."""

    def wait() -> None:
        while True:
            try:
                data = os.read(fd, 1)
            except InterruptedError:
                continue
            except OSError:
                break
            if not data:
                break
        on_cut()

    thread = threading.Thread(target=wait, name="lifeline", daemon=True)
    thread.start()
    return thread


def main(argv: list[str]) -> int:
    """``python -m infra.emulated.lifeline [--forward] [--noexec DIR]... -- COMMAND ARGS...``: run the command; SIGKILL
    it and exit when the lifeline is cut. Otherwise exit as the command did (killed by the same
    signal, or with its status). Stop signals reach the command through its process group
    (this wrapper only outlives them to report the command's status); with ``--forward`` (an
    emulated Pod's container) the command gets them only through this wrapper, which passes each
    on, as the kubelet signals a container's first process alone, and once the command ended, or
    the lifeline was cut, every other process of the session is killed, as a container's are. Each
    ``--noexec DIR`` is non-executable for the command and all it starts (an emulated node's folder as
    Container-Optimized OS mounts it: :mod:`infra.emulated.node_mounts`); where this machine cannot
    do that, one line says so and the command runs with the folder as it is."""
    forward = argv[:1] == ["--forward"]
    if forward:
        argv = argv[1:]
    noexec: list[Path] = []
    while argv[:1] == ["--noexec"] and len(argv) > 1:
        noexec.append(Path(argv[1]))
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m infra.emulated.lifeline [--forward] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    fd = inherited_fd()
    env = {k: v for k, v in os.environ.items() if k != LIFELINE_FD_ENV}
    started: list[subprocess.Popen] = []
    pending: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        if not forward:
            return
        if not started:
            pending.append(signum)  # before the fork returned: passed on once it has
            return
        try:
            started[0].send_signal(signum)
        except OSError:
            pass

    if noexec:  # before any thread starts: unshare(2) needs a process of one thread
        try:
            enter_noexec(noexec)
        except MountUnavailable as err:
            print(f"emulated node: {', '.join(map(str, noexec))} stays executable: {err.strerror}", file=sys.stderr)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)  # a handler, not SIG_IGN: reset by exec
    child = subprocess.Popen(argv, env=env)
    started.append(child)
    for signum in pending:
        child.send_signal(signum)
    if fd is not None:

        def cut() -> None:
            try:
                child.kill()
            except OSError:
                pass
            if forward:
                _kill_session()
            os._exit(128 + signal.SIGKILL)

        watch(fd, cut)
    while True:
        try:
            code = child.wait()
            break
        except InterruptedError:
            continue
    if forward:
        _kill_session()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _kill_session() -> None:
    """SIGKILL every other process of this session: a container ends with its first process (the
    kernel kills what is left in a PID namespace whose init ends: pid_namespaces(7))."""
    from infra.emulated.service_manager import session_pids

    for pid in session_pids(os.getsid(0), exclude=os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

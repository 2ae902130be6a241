"""The VM's warm standby trainer: ``python -m training.standby`` (``multislice-standby.service``).

Every start of the trainer spends its first seconds the same way, whoever it turns out to be: the
interpreter and the imports of JAX, Orbax, optax, Grain and the trainer's own modules (the largest
badput of a run with restarts, ``initialization``: docs/goodput.md). The standby does that once per
release, then waits on an abstract unix socket (:func:`training.standby_handoff.socket_name`). Each
attempt (:mod:`training.standby_handoff`, the trainer unit's main process) sends it its arguments,
environment, working directory and standard streams; the standby forks, and the child becomes the
attempt: it joins the job (``jax.distributed.initialize``), restores and trains exactly as a cold
``python -m training run`` does, its output on the attempt's streams. The standby stays, warm, for
the next attempt: one import per release instead of one per restart.

What the standby must not do is touch the accelerator. JAX creates its backends, and with them the
accelerator's client, on first use (``jax._src.xla_bridge.backends()``); on a TPU VM that opens the
chips, which libtpu holds for one process at a time (an exclusive lock on ``/tmp/libtpu_lockfile``:
"The TPU is already in use by process with pid N", jax-ml/jax issue 13260), and
``jax.distributed.initialize`` must come before it ("must be called before performing any JAX
computations": https://docs.jax.dev/en/latest/multi_process.html). JAX also warns that a fork after
its backends exist "will likely lead to a deadlock" (``backends()`` registers that warning with
``os.register_at_fork``; jax 0.10.2). So the standby imports and nothing more, and before every fork
checks that no backend exists and that it runs one Python thread (the OS threads of OpenBLAS, which
numpy starts at import, survive a fork: OpenBLAS stops and restarts them around it with
``pthread_atfork``). It imports gcsfs but opens no file system or dataset: fsspec and gcsfs run an
I/O thread from the first file system made, which a fork would not carry.

Served: only a process of the standby's own user (``SO_PEERCRED``), only ``run --config C --run-dir
R``, only an attempt of its own release (else it refuses and exits: systemd's ``Restart=always``
starts one from the current unit file) with its own environment (JAX reads its variables at import).
Its record (``standby.json`` in ``MULTISLICE_STANDBY_DIR``) says ``preparing`` then ``ready``.
When an attempt ends, the standby reaps it and sends its status to the handoff, which ends with it.
``KillMode=process``: stopping or restarting the standby never signals an attempt it forked.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

from training.standby_handoff import (
    DIR_ENV,
    START_ENV,
    STARTED_ENV,
    env_difference,
    recv_line,
    release_of_this_code,
    report_exit,
    report_to,
    reported,
    send_line,
    socket_name,
    write_state,
)

#: How long a connected process has to send its request.
REQUEST_TIMEOUT_S = 5.0
#: What the standby imports: everything ``python -m training run`` imports before it needs its
#: identity (its own lazy imports included), and the modules an attempt imports later on its way:
#: gcsfs, fsspec's ``gs://`` filesystem, for the run directory (``training.run_dir``) and tensorboardX
#: for process 0's summaries (``training.metrics.run_log``), 0.6 CPU-s a warm attempt no longer
#: spends (docs/goodput.md, "A warm start"). Importing them starts no thread: fsspec starts its
#: I/O loop at the first filesystem made, which only the attempt makes.
WARM_MODULES = (
    "jax",
    "jax.numpy",
    "optax",
    "training.checkpoint.orbax_import",  # orbax without its optional Cloud Logging client, as a cold start
    "training.__main__",
    "training.cluster",
    "training.config",
    "training.train",
    "gcsfs",
    "tensorboardX",
)


def _say(line: str) -> None:
    print(f"standby: {line}", flush=True)


def backends_exist() -> bool:
    """Whether JAX has created its backends in this process (if JAX is imported at all)."""
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def prepare(modules: tuple[str, ...] = WARM_MODULES) -> float:
    """Import ``modules``; the seconds it took.

    Raises:
      RuntimeError: an import created JAX's backends.
    """
    started = time.monotonic()
    for name in modules:
        __import__(name)
    if backends_exist():
        raise RuntimeError("importing the trainer created JAX's backends: a standby may not hold the accelerator")
    return time.monotonic() - started


def serve(directory: str, modules: tuple[str, ...] = WARM_MODULES) -> NoReturn:
    """Prepare, then fork an attempt for each handoff until stopped; never returns."""
    release = release_of_this_code()
    own_env = dict(os.environ)
    since = time.time()
    write_state(directory, {"pid": os.getpid(), "state": "preparing", "release": release, "since": since})
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(socket_name(directory))
    except OSError as err:
        _say(f"cannot listen ({err}): another standby serves {directory}")
        os._exit(1)
    listener.listen(8)
    _say(f"preparing release {os.path.basename(release)[:12]} (imports, no accelerator)")
    took = prepare(modules)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _say(f"ready in {took:.1f} s: {len(sys.modules)} modules, {rss_mib:.0f} MiB resident")
    write_state(directory, {"pid": os.getpid(), "state": "ready", "release": release, "since": time.time()})
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    attempts: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, wake_r], [], [], 1.0)
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                wake_r.recv(4096)
        _reap(attempts)
        if listener in readable:
            conn, _addr = listener.accept()
            _serve_one(conn, listener, release, own_env, attempts)


def _reap(attempts: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = attempts.pop(pid, None)
        if conn is None:
            continue
        message = (
            {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else {"status": os.waitstatus_to_exitcode(status)}
        )
        with contextlib.suppress(OSError):
            send_line(conn, message)
        conn.close()
        _say(f"attempt pid {pid} ended ({next(iter(message))} {next(iter(message.values()))})")


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _refusal(request: dict[str, Any], release: str, own_env: dict[str, str]) -> tuple[str | None, bool]:
    """Why the standby cannot take ``request`` (None: it can), and whether it should then exit."""
    argv = request.get("argv")
    if (
        not isinstance(argv, list)
        or len(argv) != 5
        or argv[0] != "run"
        or argv[1] != "--config"
        or argv[3] != "--run-dir"
        or not all(isinstance(a, str) for a in argv)
    ):
        return "only 'run --config CONFIG --run-dir RUN_DIR' is served", False
    if not isinstance(request.get("env"), dict) or not isinstance(request.get("cwd"), str):
        return "the request has no environment or working directory", False
    if request.get("release") != release:
        return f"this standby is of release {os.path.basename(release)[:12]}", True
    differs = env_difference(own_env, request["env"])
    if differs is not None:
        return f"the attempt's environment sets {differs} differently from the standby's", False
    if backends_exist():
        return "JAX's backends exist in the standby", True
    if threading.active_count() != 1:
        return f"the standby runs {threading.active_count()} Python threads; a fork would not carry them", True
    return None, False


def _serve_one(
    conn: socket.socket,
    listener: socket.socket,
    release: str,
    own_env: dict[str, str],
    attempts: dict[int, socket.socket],
) -> None:
    conn.settimeout(REQUEST_TIMEOUT_S)
    fds: list[int] = []
    try:
        if _peer_uid(conn) != os.getuid():
            conn.close()
            return
        request, fds = recv_line(conn)
        if request is None or len(fds) != 3:
            raise ValueError(f"a request with {len(fds)} descriptors (3 expected)")
        refusal, leave = _refusal(request, release, own_env)
        if refusal is not None:
            send_line(conn, {"refused": refusal})
            _say(f"refused an attempt: {refusal}{'; exiting for a fresh standby' if leave else ''}")
            if leave:
                os._exit(0)
            raise ValueError(refusal)
        sys.stdout.flush()
        sys.stderr.flush()
        # The attempt may end (and send its status) at once: it starts only once its pid is sent, so
        # the handoff reads the pid first; if this process dies before sending it, the attempt ends
        # unstarted (the gate closes without its byte) and the handoff starts cold.
        gate, gate_open = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(gate_open)
            if os.read(gate, 1) != b"1":
                os._exit(1)
            os.close(gate)
            _become_attempt(conn, fds, request, listener)
        os.close(gate)
        attempts[pid] = conn
        try:
            send_line(conn, {"pid": pid})
            os.write(gate_open, b"1")
        finally:
            os.close(gate_open)
        _say(f"attempt pid {pid} started (warm)")
    except (OSError, ValueError) as err:
        if not isinstance(err, ValueError) or "descriptors" in str(err):
            _say(f"dropped a request: {err}")
        conn.close()
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def _become_attempt(conn: socket.socket, fds: list[int], request: dict[str, Any], listener: socket.socket) -> NoReturn:
    """The forked child: the attempt, on the handoff's streams, in its environment; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        listener.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        tunables = os.environ.get("GLIBC_TUNABLES")
        os.environ.clear()
        os.environ.update(request["env"])
        if tunables is not None:
            os.environ["GLIBC_TUNABLES"] = tunables
        waited = request.get("waited_s")
        waited_s = float(waited) if isinstance(waited, (int, float)) else 0.0
        os.environ[START_ENV] = f"warm waited {waited_s:.1f}" if waited_s >= 0.5 else "warm"
        if isinstance(request.get("started"), (int, float)):
            os.environ[STARTED_ENV] = repr(float(request["started"]))
        os.chdir(request["cwd"])
        conn.settimeout(None)
        report_to(conn)
        threading.Thread(target=_end_with_handoff, args=(conn,), name="standby-handoff", daemon=True).start()
        from training.__main__ import app

        sys.argv = ["python -m training", *request["argv"]]
        try:
            app(args=request["argv"], prog_name="python -m training")
            code = 0
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else (0 if exited.code is None else 1)
    except BaseException:  # noqa: B036 - the child must end here whatever happened, with the traceback shown
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        report_exit(code)
        os._exit(code)


def _end_with_handoff(conn: socket.socket) -> None:
    """Kill this attempt when its handoff process is gone (e.g. killed at the unit's stop timeout)."""
    with contextlib.suppress(OSError):
        while conn.recv(4096):
            pass
    if not reported():  # else the attempt is in its own exit, its status sent: the handoff ended with it
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> NoReturn:
    directory = os.environ.get(DIR_ENV, "")
    if not directory:
        print(f"standby: {DIR_ENV} is not set", file=sys.stderr)
        sys.exit(2)
    serve(directory)


if __name__ == "__main__":
    from training import host_allocator

    host_allocator.reexec_with_tunable()  # as the trainer runs (training/host_allocator.py); forks inherit it
    main()

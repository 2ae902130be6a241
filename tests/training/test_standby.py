"""The warm standby (training/standby.py) and the handoff (training/standby_handoff.py), as processes.

The standby here imports nothing (``modules=()``) and its attempts run a stand-in for the trainer's
command line (:data:`FAKE_APP`: it acts on what its config file says), so each case takes a second;
the emulations (tests/local/) run the real trainer through them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training import standby_handoff

ROOT = Path(__file__).resolve().parents[2]

#: The attempt: records what it got, then does what its config file says.
FAKE_APP = """
import json, os, signal, sys, time
def app(args, prog_name):
    config = args[args.index("--config") + 1]
    what = open(config).read().split() if os.path.exists(config) else ["exit", "2"]
    record = os.environ["TEST_RECORD"]
    with open(record, "w") as out:
        json.dump({"pid": os.getpid(), "argv": args, "start": os.environ.get("MULTISLICE_START"),
                   "started": os.environ.get("MULTISLICE_ATTEMPT_STARTED"), "cwd": os.getcwd()}, out)
    print("attempt: output on the handoff's stdout", flush=True)
    if what[0] == "exit":
        raise SystemExit(int(what[1]))
    if what[0] == "exit_process":  # the trainer's own exit (training.train.exit_process)
        from training.train import exit_process
        exit_process(int(what[1]))
    if what[0] == "term":  # a preemption notice: save and exit 75
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))
    while True:
        time.sleep(0.05)
"""


def server_script(release: str | None = None) -> str:
    lines = [
        f"import sys; sys.path.insert(0, {str(ROOT)!r})",
        "import training.__main__ as main",
        FAKE_APP,
        "main.app = app",
        "from training import standby",
    ]
    if release is not None:
        lines.append(f"standby.release_of_this_code = lambda: {release!r}")
    lines.append("standby.serve(sys.argv[1], modules=())")
    return "\n".join(lines)


@pytest.fixture
def env(tmp_path):
    """The environment both units' processes share (the standby takes only its own)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("MULTISLICE_")}
    base.update(
        {
            "MULTISLICE_STANDBY_DIR": str(tmp_path / "standby"),
            "MULTISLICE_STANDBY_WAIT_S": "20",
            "MULTISLICE_STANDBY_ANSWER_S": "20",
            "TEST_RECORD": str(tmp_path / "record.json"),
            "PYTHONPATH": str(ROOT),
        }
    )
    return base


class Standby:
    def __init__(self, tmp_path: Path, env: dict[str, str], release: str | None = None) -> None:
        self.dir = tmp_path / "standby"
        self.log = open(tmp_path / "standby.log", "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", server_script(release), str(self.dir)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while (standby_handoff.read_state(self.dir) or {}).get("state") != "ready":
            assert self.proc.poll() is None, (tmp_path / "standby.log").read_text()
            assert time.monotonic() < deadline, "the standby never got ready"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
        self.log.close()


@pytest.fixture
def standby(tmp_path, env):
    server = Standby(tmp_path, env)
    yield server
    server.stop()


def config(tmp_path: Path, what: str) -> Path:
    path = tmp_path / "config.json"
    path.write_text(what)
    return path


def handoff(tmp_path: Path, env: dict[str, str], config_path: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "training.standby_handoff"]
        + ["--config", str(config_path), "--run-dir", str(tmp_path / "run")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def record(tmp_path: Path, timeout: float = 60) -> dict:
    path = tmp_path / "record.json"
    deadline = time.monotonic() + timeout
    while True:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            assert time.monotonic() < deadline, "the attempt never started"
            time.sleep(0.05)


def gone(pid: int, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except FileNotFoundError:  # reaped between the signal and the read
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("how", ["exit", "exit_process"])
def test_a_warm_attempt_runs_forked_on_the_handoffs_streams_and_its_status_is_the_handoffs(tmp_path, env, standby, how):
    proc = handoff(tmp_path, env, config(tmp_path, f"{how} 75"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75, out
    seen = record(tmp_path)
    assert seen["start"] == "warm"
    assert seen["argv"] == ["run", "--config", str(tmp_path / "config.json"), "--run-dir", str(tmp_path / "run")]
    assert seen["cwd"] == str(tmp_path)
    assert seen["pid"] != proc.pid and seen["pid"] != standby.proc.pid
    assert float(seen["started"]) <= time.time()
    assert f"trainer: warm start at once: the standby (pid {standby.proc.pid})" in out
    assert "attempt: output on the handoff's stdout" in out
    assert standby.proc.poll() is None  # it waits for the next attempt
    second = handoff(tmp_path, env, config(tmp_path, "exit 0"))
    out, _ = second.communicate(timeout=60)
    assert second.returncode == 0 and "warm start" in out


def test_sigterm_to_the_handoff_reaches_the_attempt(tmp_path, env, standby):
    proc = handoff(tmp_path, env, config(tmp_path, "term"))
    record(tmp_path)
    time.sleep(0.2)  # the attempt installs its handler right after writing the record
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75, out


def test_an_attempt_killed_by_a_signal_kills_its_handoff_with_it(tmp_path, env, standby):
    proc = handoff(tmp_path, env, config(tmp_path, "sleep"))
    os.kill(record(tmp_path)["pid"], signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_a_killed_standby_leaves_the_attempt_running_and_its_status_reaches_the_handoff(tmp_path, env, standby):
    proc = handoff(tmp_path, env, config(tmp_path, "term"))
    attempt = record(tmp_path)["pid"]
    time.sleep(0.2)
    standby.proc.kill()
    standby.proc.wait()
    assert not gone(attempt, timeout=1)  # the attempt trains on
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 75, out  # the attempt told its handoff itself
    # The next attempt starts cold, saying why, while systemd starts another standby.
    env = {**env, "MULTISLICE_STANDBY_WAIT_S": "0.5"}
    cold = handoff(tmp_path, env, tmp_path / "missing.json")
    out, _ = cold.communicate(timeout=60)
    assert f"trainer: cold start: the standby (pid {standby.proc.pid}) is gone" in out
    assert cold.returncode == 2  # the real trainer's command line refused the missing config


def test_a_killed_handoff_ends_its_attempt(tmp_path, env, standby):
    proc = handoff(tmp_path, env, config(tmp_path, "sleep"))
    attempt = record(tmp_path)["pid"]
    proc.kill()  # systemd's SIGKILL at TimeoutStopSec=
    proc.wait()
    assert gone(attempt)


def test_a_hung_standby_is_killed_and_the_attempt_starts_cold(tmp_path, env, standby):
    os.kill(standby.proc.pid, signal.SIGSTOP)
    env = {**env, "MULTISLICE_STANDBY_ANSWER_S": "1"}
    proc = handoff(tmp_path, env, tmp_path / "missing.json")
    out, _ = proc.communicate(timeout=60)
    assert f"cold start: the standby (pid {standby.proc.pid}) did not answer in 1 s: killed it" in out
    assert standby.proc.wait(timeout=30) == -signal.SIGKILL


def test_a_standby_of_another_release_is_stopped_and_the_attempt_starts_cold(tmp_path, env):
    stale = Standby(tmp_path, env, release="/var/lib/multislice/releases/0ld")
    try:
        proc = handoff(tmp_path, env, tmp_path / "missing.json")
        out, _ = proc.communicate(timeout=60)
        assert "cold start: the standby holds release /var/lib/mul, not " in out
        assert "stopped, so that systemd starts one of this release" in out
        assert stale.proc.wait(timeout=30) == -signal.SIGTERM
    finally:
        stale.stop()


def test_an_attempt_whose_environment_differs_is_refused_by_name_and_starts_cold(tmp_path, env, standby):
    other = {**env, "XLA_FLAGS": "--xla_force_host_platform_device_count=8"}
    proc = handoff(tmp_path, other, tmp_path / "missing.json")
    out, _ = proc.communicate(timeout=60)
    assert "cold start: the standby refused: the attempt's environment sets XLA_FLAGS differently" in out
    assert standby.proc.poll() is None  # a difference of one attempt is no reason to replace it


def test_without_a_standby_the_attempt_starts_cold_in_bounded_time(tmp_path, env):
    env = {**env, "MULTISLICE_STANDBY_WAIT_S": "0.5"}
    proc = handoff(tmp_path, env, tmp_path / "missing.json")
    out, _ = proc.communicate(timeout=60)
    assert "trainer: cold start: no standby runs on this VM" in out
    assert proc.returncode == 2


#: A request with the three descriptors but no attempt (the standby refuses it, to a process it serves).
BARE_REQUEST = """
import socket, sys
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(bytes.fromhex(sys.argv[1]))
try:
    socket.send_fds(sock, [b'{"argv": []}\\n'], [0, 1, 2])
    print(sock.recv(4096).decode() or "<closed>")
except (BrokenPipeError, ConnectionResetError):
    print("<closed>")
"""


@pytest.mark.skipif(os.getuid() != 0 or not Path("/usr/bin/python3").exists(), reason="needs root and a system Python")
def test_a_process_of_another_user_is_not_served(tmp_path, env, standby):
    name = standby_handoff.socket_name(standby.dir).hex()
    run = ["/usr/bin/python3", "-c", BARE_REQUEST, name]
    mine = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd="/", env={})
    assert "only 'run --config CONFIG --run-dir RUN_DIR' is served" in mine.stdout, mine.stderr
    theirs = subprocess.run(run, capture_output=True, text=True, timeout=60, cwd="/", env={}, user=65534, group=65534)
    assert theirs.stdout.strip() == "<closed>", theirs.stderr  # closed unanswered
    assert standby.proc.poll() is None


def test_the_standby_imports_the_trainer_without_creating_a_backend_or_a_thread():
    # gcsfs and tensorboardX are imported too (an attempt's later imports), and nothing imported
    # starts a Python thread, which a fork would not carry (the standby refuses to fork then). Orbax
    # comes without its optional Cloud Logging client, as in a cold start (training/checkpoint/orbax_import.py).
    code = (
        "import sys, threading\n"
        "from training import standby\n"
        "took = standby.prepare()\n"
        "print(standby.backends_exist(), threading.active_count())\n"
        "print('gcsfs' in sys.modules, 'tensorboardX' in sys.modules)\n"
        "print('orbax.checkpoint' in sys.modules, 'google.cloud.logging' in sys.modules)\n"
        "import jax; jax.devices()\n"
        "print(standby.backends_exist())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    ).stdout.split()
    assert out == ["False", "1", "True", "True", "True", "False", "True"]


def test_the_environments_are_compared_but_for_what_differs_by_nature():
    mine = {"PATH": "/bin", "INVOCATION_ID": "a", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    assert standby_handoff.env_difference(mine, {"PATH": "/bin", "INVOCATION_ID": "b"}) is None
    assert standby_handoff.env_difference(mine, {"PATH": "/usr/bin"}) == "PATH"
    assert standby_handoff.env_difference(mine, {"PATH": "/bin", "JAX_PLATFORMS": "cpu"}) == "JAX_PLATFORMS"


def test_lines_that_arrive_in_one_read_are_each_read_in_turn():
    """The pid, the attempt's own status and the standby's can reach the handoff in one read (a short
    attempt): each is its own line, none is lost or joined to the next."""
    import socket

    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b'{"pid": 7}\n{"status": 0}\n{"status": 0}\n')
        theirs.shutdown(socket.SHUT_WR)
        reader = ours.makefile("rb")
        assert standby_handoff.read_line(reader) == {"pid": 7}
        assert standby_handoff.read_line(reader) == {"status": 0}
        assert standby_handoff.read_line(reader) == {"status": 0}
        assert standby_handoff.read_line(reader) is None


def test_a_line_too_long_or_cut_short_is_refused():
    import io

    with pytest.raises(ValueError, match="cut short or longer"):
        standby_handoff.read_line(io.BytesIO(b'{"pid": 7}'))
    with pytest.raises(ValueError, match="cut short or longer"):
        standby_handoff.read_line(io.BytesIO(b"x" * 100 + b"\n"), limit=50)
    with pytest.raises(ValueError, match="not a JSON object"):
        standby_handoff.read_line(io.BytesIO(b"[1]\n"))


def test_the_attempts_pid_reaches_the_handoff_before_its_status_however_soon_it_ends(monkeypatch):
    """An attempt may end (and send its status) before the standby has sent its pid; the handoff
    takes a first line that is not the pid for a standby's failure and starts the attempt again, cold.
    Here the standby's pid is held back until the attempt has had a second to send its status: the
    pid still comes first. The attempt is a stand-in that sends its status at once."""
    import select
    import socket

    from training import standby

    ours, theirs = socket.socketpair()

    def attempt(conn, fds, request, listener):  # the forked child
        standby_handoff.send_line(conn, {"status": 75})
        os._exit(75)

    def held_send(conn, message, fds=None):
        if "pid" in message:
            select.select([ours], [], [], 1.0)  # readable early only if the attempt wrote first
        standby_handoff.send_line(conn, message, fds)

    monkeypatch.setattr(standby, "_become_attempt", attempt)
    monkeypatch.setattr(standby, "send_line", held_send)
    monkeypatch.setattr(standby, "_refusal", lambda request, release, own_env: (None, False))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    attempts: dict[int, socket.socket] = {}
    request = {"argv": [], "env": {}, "cwd": "/", "release": "r"}
    with ours, listener:
        standby_handoff.send_line(ours, request, [0, 1, 2])
        standby._serve_one(theirs, listener, "r", {}, attempts)
        (pid,) = attempts
        _, status = os.waitpid(pid, 0)
        theirs.close()
        reader = ours.makefile("rb")
        assert standby_handoff.read_line(reader) == {"pid": pid}
        assert standby_handoff.read_line(reader) == {"status": 75}
    assert os.waitstatus_to_exitcode(status) == 75

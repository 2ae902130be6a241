"""infra.remote.fanout, command and selection: every worker's process at once, each line
prefixed as it comes, each worker's output in its own file, exit statuses kept; a target that
starts after another's marker line, its end or a timeout; the shell line, its --background
wrapping and its run-once guard; the workers a stack has."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from infra.config import load_stack
from infra.remote.command import (
    RERUN_REFUSED_EXIT,
    RERUN_REFUSED_MESSAGE,
    EmptyCommand,
    background_log,
    command_line,
    in_background,
    run_id,
    run_once,
)
from infra.remote.fanout import Target, describe_code, new_log_dir, run_all
from infra.remote.selection import RemoteError, select_workers


def py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_every_process_starts_before_any_ends_and_lines_interleave_unbroken(tmp_path):
    # Two workers alternate lines (each waits for the other's file), so the run only ends if
    # both run at once; a third is slow.
    ping, pong = tmp_path / "ping", tmp_path / "pong"
    wait = (
        "import pathlib, sys, time\n"
        "def wait(p):\n"
        "    deadline = time.monotonic() + 20\n"  # run one at a time, the first fails instead of hanging
        "    while not pathlib.Path(p).exists():\n"
        "        if time.monotonic() > deadline: sys.exit(9)\n"
        "        time.sleep(0.01)\n"
    )
    a = wait + f"print('a1', flush=True); open({str(ping)!r}, 'w').close(); wait({str(pong)!r}); print('a2')"
    b = wait + f"wait({str(ping)!r}); print('b1', flush=True); open({str(pong)!r}, 'w').close(); print('b2')"
    slow = "import time; time.sleep(0.5); print('late ' + 'x' * 5000)"
    lines: list[str] = []
    run = run_all([Target(0, 0, py(a)), Target(0, 1, py(b)), Target(1, 0, py(slow))], tmp_path / "logs", lines.append)
    assert [o.code for o in run.outcomes] == [0, 0, 0] and run.failed == []
    # Both exited 0, so they ran at once (each waits for the other's file, and exits 9 after 20 s
    # alone). The order of lines across workers is the reader threads' and is not asserted; each
    # worker's own lines keep their order.
    for first, second in (("a1", "a2"), ("b1", "b2")):
        worker = 0 if first[0] == "a" else 1
        assert lines.index(f"[slice 0 worker {worker}] {first}") < lines.index(f"[slice 0 worker {worker}] {second}")
    assert f"[slice 1 worker 0] late {'x' * 5000}" in lines  # a long line is never cut
    assert (tmp_path / "logs" / "slice-0-worker-0.log").read_text() == "a1\na2\n"
    assert (tmp_path / "logs" / "slice-1-worker-0.log").read_text() == f"late {'x' * 5000}\n"
    assert run.outcomes[2].first_output_s is not None and run.outcomes[2].first_output_s >= 0.5


#: Seconds a test's worker waits for an event another process causes: reached only by a real
#: hang (the one thing such a wait may not do is pass by luck of the clock).
EVENT_WAIT_S = 120


def waits_for(*paths: Path, then: str) -> str:
    """Python that waits (at most :data:`EVENT_WAIT_S`) until every file of ``paths`` exists,
    then prints ``then``; prints ``timed out`` instead when one never came."""
    names = [str(p) for p in paths]
    return (
        "import os, time\n"
        f"deadline = time.monotonic() + {EVENT_WAIT_S}\n"
        f"while not all(os.path.exists(p) for p in {names!r}) and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        f"print({then!r} if all(os.path.exists(p) for p in {names!r}) else 'timed out', flush=True)\n"
    )


def touch(path: Path, then: str) -> str:
    """Python that creates ``path`` and prints ``then``."""
    return f"open({str(path)!r}, 'w').close(); print({then!r}, flush=True)"


def test_the_slow_worker_does_not_hold_back_the_others(tmp_path):
    # Worker 0 ends only once the three others have run: one after the other, it would wait for ever.
    files = [tmp_path / f"ran-{s}" for s in range(1, 4)]
    targets = [Target(0, 0, py(waits_for(*files, then="0")))]
    targets += [Target(s, 0, py(touch(files[s - 1], str(s)))) for s in range(1, 4)]
    lines: list[str] = []
    run = run_all(targets, tmp_path, lines.append)
    # Worker 0 printed "0", not "timed out": the three others ran while it waited. (Not the order
    # of the lines or of their arrival times: each worker's output is read by its own thread, so
    # the line of the last one to run can arrive after worker 0's, as a loaded CI machine showed.)
    assert sorted(lines) == [f"[slice {s} worker 0] {s}" for s in range(4)]
    assert all(o.first_output_s is not None for o in run.outcomes) and run.failed == []


def test_failed_workers_keep_their_statuses_and_output(tmp_path):
    run = run_all(
        [
            Target(0, 0, py("print('fine')")),
            Target(0, 1, py("import sys; print('broken', file=sys.stderr); sys.exit(3)")),
            Target(1, 0, ["bash", "-c", "kill -KILL $$"]),
        ],
        tmp_path,
        lambda line: None,
    )
    assert [(o.target.name, o.code) for o in run.failed] == [("slice 0 worker 1", 3), ("slice 1 worker 0", -9)]
    assert (tmp_path / "slice-0-worker-1.log").read_text() == "broken\n"  # stderr is kept too
    assert describe_code(3) == "exit 3" and describe_code(-9) == "killed by SIGKILL"


def test_the_environment_and_directory_are_each_targets_own(tmp_path):
    (tmp_path / "vm").mkdir()
    lines: list[str] = []
    run_all(
        [
            Target(
                0,
                0,
                ["bash", "-c", "echo $ONLY_HERE $PWD"],
                env={"ONLY_HERE": "yes", "PATH": "/usr/bin:/bin"},
                cwd=tmp_path / "vm",
            )
        ],
        tmp_path / "logs",
        lines.append,
    )
    assert lines == [f"[slice 0 worker 0] yes {tmp_path / 'vm'}"]


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt only where SIGINT has Python's default handler: a
    non-interactive shell starts a background job (`pytest &`) with SIGINT ignored, and the test
    process inherits that. Set the disposition the test needs; restore it afterwards."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("delivery", ["process", "thread"])
def test_an_interrupt_stops_every_process(tmp_path, ctrl_c_raises, delivery):
    # "thread": the kernel may hand a process-directed signal to any thread that does not block
    # it, and CPython runs the handler in the main thread only: SIGINT sent to a thread other
    # than the main one must still stop the run, not wait for the workers' end.
    marker = tmp_path / "pids"
    code = (
        "import os, time\n"
        f"open({str(marker)!r}, 'a').write(str(os.getpid()) + '\\n')\n"
        "print('up', flush=True)\n"
        "time.sleep(240)\n"
    )
    seen: list[str] = []

    def interrupt():  # Ctrl-C once both printed: SIGINT to this process (not to the workers)
        while len(seen) < 2:
            time.sleep(0.01)
        if delivery == "process":
            os.kill(os.getpid(), signal.SIGINT)
        else:
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    start = time.monotonic()
    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_all([Target(0, w, py(code)) for w in range(2)], tmp_path / "logs", seen.append)
    pids = [int(p) for p in marker.read_text().split()]
    assert len(pids) == 2 and time.monotonic() - start < 120  # stopped, not waited for (240 s)
    for pid in pids:
        assert subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0


def test_a_follower_starts_when_its_leader_prints_its_marker_or_ends(tmp_path):
    # Leader 0 prints its marker, then runs on until its follower has started: the follower
    # starts on the marker, while its leader still runs. Leader 2 prints no marker; it ends once
    # follower 1 started, writing that it ended: its own follower starts after that end, not on
    # leader 0's marker.
    follower_started, leader_ended = tmp_path / "follower-0-1", tmp_path / "leader-1-0-ended"
    leader_0 = "print('ready now', flush=True)\n" + waits_for(follower_started, then="leader 0 ends")
    leader_2 = waits_for(follower_started, then="no marker") + f"open({str(leader_ended)!r}, 'w').close()\n"
    follower_2 = f"import os; print('its leader had ended' if os.path.exists({str(leader_ended)!r}) else 'too early')"
    targets = [
        Target(0, 0, py(leader_0), ready_marker="ready"),
        Target(0, 1, py(touch(follower_started, "started")), after=0),
        Target(1, 0, py(leader_2), ready_marker="ready"),
        Target(1, 1, py(follower_2), after=2),
    ]
    lines: list[str] = []
    run = run_all(targets, tmp_path, lines.append)
    assert run.failed == []
    assert "[slice 0 worker 0] leader 0 ends" in lines  # its follower started while it ran
    assert "[slice 1 worker 0] no marker" in lines and "[slice 1 worker 1] its leader had ended" in lines
    assert lines.index("[slice 0 worker 0] ready now") < lines.index("[slice 0 worker 1] started")


def test_a_follower_starts_after_the_timeout_when_its_leader_is_silent(tmp_path):
    # The silent leader runs until its follower started: the follower must not wait for its end.
    notices: list[str] = []
    started = tmp_path / "follower-started"
    targets = [
        Target(0, 0, py(waits_for(started, then="leader ends")), ready_marker="ready"),
        Target(0, 1, py(touch(started, "started")), after=0),
    ]
    lines: list[str] = []
    run = run_all(targets, tmp_path, lines.append, notices.append, gate_timeout_s=0.5)
    # "leader ends", not "timed out": the follower ran while its leader still did. (Not their order:
    # each worker's output is read by its own thread.)
    assert run.failed == [] and sorted(lines) == ["[slice 0 worker 0] leader ends", "[slice 0 worker 1] started"]
    assert run.outcomes[1].first_output_s is not None and run.outcomes[1].first_output_s >= 0.5
    assert notices == [
        "slice 0 worker 0 did not report ready within 0.5 s; starting the 1 worker(s) that wait for it anyway"
    ]


def test_a_follower_must_follow_an_earlier_leader(tmp_path):
    with pytest.raises(ValueError, match="slice 0 worker 0: after=1"):
        run_all([Target(0, 0, py(""), after=1), Target(0, 1, py(""))], tmp_path, lambda line: None)
    with pytest.raises(ValueError, match="slice 0 worker 2: after=1"):
        run_all(
            [Target(0, 0, py("")), Target(0, 1, py(""), after=0), Target(0, 2, py(""), after=1)],
            tmp_path,
            lambda line: None,
        )


def test_the_guard_runs_a_command_once_per_marker(tmp_path):
    line = run_once("echo ran >> ran.txt; echo 'it ran'", f"{run_id()}-slice-0-worker-1")
    first = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=10)
    assert (first.returncode, first.stdout, first.stderr) == (0, "it ran\n", "")
    again = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=10)
    assert again.returncode == RERUN_REFUSED_EXIT and again.stdout == ""
    assert again.stderr.startswith(RERUN_REFUSED_MESSAGE) and "--background" in again.stderr
    assert (tmp_path / "ran.txt").read_text() == "ran\n"
    # Another exec (another marker) runs; a marker older than 30 days is removed, a newer one kept.
    old = tmp_path / "multislice-exec" / ".started" / "old"
    old.touch()
    os.utime(old, (time.time() - 31 * 86400,) * 2)
    other = subprocess.run(["bash", "-c", run_once("echo ran >> ran.txt", run_id())], cwd=tmp_path, timeout=10)
    assert other.returncode == 0 and (tmp_path / "ran.txt").read_text() == "ran\nran\n"
    assert not old.exists() and len(list(old.parent.iterdir())) == 2
    # The exit status of the command is the line's; a multi-line command is kept as written.
    status = subprocess.run(["bash", "-c", run_once("if true\nthen exit 3\nfi", run_id())], cwd=tmp_path, timeout=10)
    assert status.returncode == 3
    with pytest.raises(ValueError, match="letters, digits"):
        run_once("true", "a/b")


def test_new_log_dirs_never_collide(tmp_path):
    first, second = new_log_dir(tmp_path / "a"), new_log_dir(tmp_path / "a")
    assert first != second and first.is_dir() and second.is_dir() and second.name.startswith(first.name)


def test_the_command_line_is_the_words_joined_as_ssh_joins_them():
    assert command_line(["echo", "$HOSTNAME", "a b"]) == "echo $HOSTNAME a b"
    assert command_line(["python3 train.py --steps 10 | tee log"]) == "python3 train.py --steps 10 | tee log"
    with pytest.raises(EmptyCommand, match="after --"):
        command_line([" "])


def test_background_returns_at_once_and_keeps_the_output_on_the_worker(tmp_path):
    log = background_log("20261201T000000Z")
    assert log == "multislice-exec/20261201T000000Z.log"
    # The command ends only once the test, after the line returned, creates "go".
    line = in_background("echo started; while [ ! -e go ]; do sleep 0.02; done; echo 'done it'", log)
    out = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=EVENT_WAIT_S)
    assert out.returncode == 0
    (tmp_path / "go").touch()
    assert out.stdout.startswith("started pid ") and out.stdout.strip().endswith(f"{tmp_path}/{log}")
    deadline = time.monotonic() + EVENT_WAIT_S
    while "done it" not in (tmp_path / log).read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (tmp_path / log).read_text() == "started\ndone it\n"


def test_workers_are_selected_from_the_stack_and_unknown_ones_refused():
    config = load_stack("dev")  # 2 × v4-8: one worker per slice
    assert [(w.slice_id, w.worker, w.node) for w in select_workers(config)] == [
        (0, 0, "multislice-dev-0"),
        (1, 0, "multislice-dev-1"),
    ]
    assert [w.name for w in select_workers(config, slice_id=1)] == ["slice 1 worker 0"]
    with pytest.raises(RemoteError, match=r"--slice 2: stack dev has 2 slice\(s\), 0-1") as err:
        select_workers(config, slice_id=2)
    assert err.value.exit_code == 2
    with pytest.raises(RemoteError, match=r"--worker 1: each slice of stack dev \(v4-8\) has 1 worker\(s\), 0$"):
        select_workers(config, worker=1)

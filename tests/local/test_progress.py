"""What `multislice local up` shows while a run goes on (infra.local.progress), and its output
without a terminal: plain lines, never wrapped or padded, whatever COLUMNS says."""

from __future__ import annotations

import io
import os
import subprocess
import sys

from rich.console import Console

from infra.local.progress import BootLines, ProgressSample, RunReporter, live_reporter, plain_reporter

VM = "slice 0 worker 0"


def test_boot_lines_are_the_first_vm_s_phases_as_they_are_written(tmp_path):
    log = tmp_path / "slice-0-worker-0.log"
    log.write_text("===== boot 1 of slice 0 worker 0 =====\n[slice 0 worker 0] boot: an earlier boot\n")
    lines = BootLines(VM, log)  # starts at the end: an earlier boot's lines are not new
    assert lines.poll() == []
    with open(log, "a") as out:
        out.write(
            "===== boot 2 of slice 0 worker 0 =====\n"
            "[slice 0 worker 0] boot: stack emu (v4-8 x 2), release b73ca7d52daf\n"
            "systemd[1]: Started multislice-trainer.service.\n"
            "[slice 1 worker 0] venv: another VM's line\n"
            "[slice 0 worker 0] venv: using MULTISLICE_PYTHON=/x (nothing built)\n"
            "[slice 0 worker 0] [Gloo] Rank 0 is connected to 1 peer ranks.\n"
            "[slice 0 worker 0] 18:21:18 INFO [p0] training.cluster: "
            "jax.distributed.initialize coordinator=127.0.0.1:1\n"
            # gloo's threads write in pieces to the trainer's stream: a piece before a record
            "[slice 0 worker 0] [Gloo] Rank 2 is connected to 18:21:19 INFO [p0] training: starting at step 2\n"
            "[slice 0 worker 0]  peer ranks. Expected number of connected peer ranks is : 3\n"
            "[slice 0 worker 0] trainer: start"
        )  # not a complete line yet
    assert lines.poll() == [
        "boot: stack emu (v4-8 x 2), release b73ca7d52daf",
        "venv: using MULTISLICE_PYTHON=/x (nothing built)",
        "training.cluster: jax.distributed.initialize coordinator=127.0.0.1:1",
        "training: starting at step 2",
    ]
    with open(log, "a") as out:
        out.write("ing the unit\n")
    assert lines.poll() == ["trainer: starting the unit"]
    assert BootLines(VM, tmp_path / "missing.log").poll() == []


def test_the_first_vm_s_lines_say_whose_they_are_and_a_peer_s_end_reads_as_part_of_the_repair(tmp_path):
    from infra.local.progress import RunReporter

    log = tmp_path / "slice-0-worker-0.log"
    log.write_text("")
    shown: list[str] = []
    tail = RunReporter(shown.append)
    tail.boot_lines = BootLines(VM, log, every_vm="multislice local logs --stack emu")

    def written(*lines: str) -> list[str]:
        with open(log, "a") as out:
            out.writelines(f"[{VM}] {line}\n" for line in lines)
        shown.clear()
        tail.boot()
        return list(shown)

    assert written("boot: stack emu (v4-8 x 2)", "12:00:00 INFO [p0] training: starting at step 0") == [
        f"{VM}'s lines only, for brevity; every VM's: multislice local logs --stack emu",
        f"{VM}: boot: stack emu (v4-8 x 2)",
        f"{VM}: training: starting at step 0",
    ]
    assert written("trainer: exited with status 1 (exit-code)") == []  # training: no boot lines shown
    tail.drain(repair=True)  # slice 1 was struck: this VM's trainer ends as its peer is gone
    after = written("trainer: exited with status 1 (exit-code)", "trainer: exited with status 75: it saved")
    assert after == [
        f"{VM}: trainer: exited with status 1 (exit-code): expected in the repair (its job lost a peer); "
        "the repair restarts it",
        f"{VM}: trainer: exited with status 75: it saved",
    ]
    assert written("12:00:09 INFO [p0] training: starting at step 6", "trainer: exited with status 1 (exit-code)") == [
        f"{VM}: training: starting at step 6"
    ]
    tail.drain()  # a reset: an exit outside the contract is not explained away
    assert written("trainer: exited with status 1 (exit-code)") == [f"{VM}: trainer: exited with status 1 (exit-code)"]


def test_a_progress_line_has_step_loss_tokens_per_second_and_restarts():
    assert ProgressSample(40, 120, 2.36021, 1234.5, 1).line() == "step 40/120  loss 2.3602  1,234 tokens/s  restarts 1"
    assert ProgressSample(0, 120, None, None, 0).line() == "step 0/120  restarts 0"


def test_plain_progress_every_tenth_and_otherwise_rate_limited():
    lines: list[str] = []
    show = plain_reporter(lines.append, min_interval_s=1e9)  # never by time: the first step seen, then each tenth
    for step in range(2, 101, 2):
        show(ProgressSample(step, 100, 1.0, None, 0))
    assert [line.split()[1] for line in lines] == ["2/100"] + [f"{s}/100" for s in range(10, 101, 10)]
    every: list[str] = []
    show = plain_reporter(every.append, min_interval_s=0)  # each new step seen
    for step in (1, 2, 3):
        show(ProgressSample(step, 100, 1.0, None, 0))
    assert len(every) == 3


def test_the_live_bar_shows_step_total_loss_tokens_per_second_eta_and_restarts():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with live_reporter(console, 24) as show:
        show(ProgressSample(12, 24, 4.5084, 707.0, 1))
    text = out.getvalue()
    assert "12/24" in text and "loss 4.5084" in text and "707 tokens/s" in text and "restarts 1" in text
    assert "ETA" in text


SAY_AND_SUMMARY = """
from infra.cli.run_summary import print_summary
from infra.cli.options import say
say("a progress sentence that is much longer than the forty columns this test's COLUMNS allows, on one line")
print_summary({
    "complete": True,
    "restart_causes": ["preemption at step 10: resumed at step 10"] * 3,
    "badput": "boot 12.3 s; compilation 4.5 s; " * 8,
    "run_dir": "gs://a-bucket-name/runs/" + "r" * 80,
})
"""


def test_without_a_terminal_lines_are_neither_wrapped_nor_padded():
    env = {**os.environ, "COLUMNS": "40"}
    out = subprocess.run([sys.executable, "-c", SAY_AND_SUMMARY], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(
        line.endswith(
            "] a progress sentence that is much longer than the forty columns this test's COLUMNS allows, on one line"
        )
        for line in lines
    ), out.stdout
    assert "run_dir: gs://a-bucket-name/runs/" + "r" * 80 in lines, out.stdout  # whole, on its line
    assert all(line == line.rstrip() for line in lines), out.stdout
    # The table fits 100 columns in a pipe: a list a line per item, a long value wrapped in its cell.
    table = [line for line in lines if line.startswith(("│", "┌", "└"))]
    assert table and max(len(line) for line in table) <= 100, out.stdout
    assert sum("preemption at step 10: resumed at step 10" in line for line in table) == 3, out.stdout


def test_plain_progress_shows_each_restart_and_ends_at_the_last_step_seen():
    # The terminal's bar shows every sample; piped lines must not end short of it, nor hide a
    # restart until the next tenth.
    lines: list[str] = []
    with plain_reporter(lines.append, min_interval_s=1e9) as show:
        for step, restarts in [(10, 0), (13, 0), (12, 1), (14, 1), (17, 1)]:
            show(ProgressSample(step, 100, 1.0, None, restarts))
    assert [(line.split()[1], line.split()[-1]) for line in lines] == [
        ("10/100", "0"),
        ("12/100", "1"),  # the restart, at once
        ("17/100", "1"),  # the last step seen, when the run stopped
    ]
    with plain_reporter(lines.append) as show:
        pass  # nothing seen: nothing printed
    assert len(lines) == 3


def test_a_change_of_slice_count_is_shown_decided_then_at_the_step_it_took_effect(tmp_path):
    from infra.local.progress import MembershipChanges
    from training import membership
    from training.run_dir import RunDir

    run_dir = RunDir(str(tmp_path / "run"))
    start, _ = membership.propose(run_dir, None, (0,), step=None, reason="start", now=1.0)
    lines: list[str] = []
    changes = MembershipChanges(run_dir, lines.append, every_s=0.0)
    changes.event({"event": "start", "step": 0, "membership_epoch": 0})
    membership.propose(run_dir, start, (0, 1), step=18, reason="slice 1 back", now=2.0)
    changes.poll()
    assert lines == ["elastic: slices 1 → 2 decided (slice 1 back)"]  # the job trains on to its checkpoint
    changes.poll()
    assert len(lines) == 1  # said once
    changes.event({"event": "preempted", "step": 24, "membership_epoch": 1})
    changes.poll()
    assert lines[1:] == ["elastic: slices 1 → 2 at step 24 (slice 1 back)"]  # where it stopped, not 18
    changes.event({"event": "start", "step": 24, "membership_epoch": 1})
    changes.poll()
    assert len(lines) == 2


def test_a_stop_the_emulator_asked_for_is_named_as_it_until_the_next_start():
    shown: list[str] = []
    reporter = RunReporter(shown.append)
    reporter.event({"event": "checkpoint", "step": 10, "preemption": True})
    reporter.stopping_for = "the reset"  # what Repairs.reset sets before its SIGTERM
    reporter.event({"event": "checkpoint", "step": 14, "preemption": True})
    reporter.event({"event": "preempted", "step": 14})
    reporter.event({"event": "start", "step": 14, "restored": True})
    reporter.event({"event": "preempted", "step": 20})  # a preemption after it is one
    assert shown == [
        "preemption checkpoint saved at step 10",
        "checkpoint saved at step 14 on the stop notice of the reset",
        "training stopped after the checkpoint of step 14 for the reset",
        "training resumed from the checkpoint of step 14",
        "training stopped after the preemption checkpoint of step 20",
    ]

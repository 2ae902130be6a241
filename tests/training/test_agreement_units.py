"""The single-process parts of agreement: the Orbax save-decision
policy, a restore's fallback record and how the CLI prints it, and the preemption notice's
watchdog state."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orbax.checkpoint as ocp
import pytest

from infra.config import load_stack_file
from infra.emulated.state import LocalPaths
from infra.local.emulated_stack import EmulatedStack
from tests.helpers.checkpoint_errors import REPR, StandInManager
from training import preemption
from training.checkpoint import manager as checkpointing
from training.config import TrainConfig
from training.run_dir import RunDir

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"


def test_the_manager_saves_every_interval_and_at_the_last_step(tmp_path):
    config = TrainConfig.model_validate({"steps": 14, "checkpoint": {"interval_steps": 4, "async_save": False}})
    manager = checkpointing.make_manager(RunDir(str(tmp_path)), config)
    try:
        assert [s for s in range(1, 15) if manager.should_save(s)] == [4, 8, 12, 14]
    finally:
        manager.close()


def test_the_policy_saves_at_a_preemption_sync_point_whatever_the_step():
    policy = checkpointing.save_policy(interval_steps=4, total_steps=14)
    from orbax.checkpoint import checkpoint_manager

    info = checkpoint_manager.CheckpointInfo  # what CheckpointManager.should_save passes

    def decide(step: int, preempted: bool) -> bool:
        context = ocp.checkpoint_managers.DecisionContext(
            is_saving_in_progress=False,
            reached_preemption=preempted,
            multiprocessing_options=ocp.options.MultiprocessingOptions(),
        )
        return policy.should_save(info(step=step, time=None, metrics=None), [], context=context)

    assert [s for s in range(1, 15) if decide(s, preempted=False)] == [4, 8, 12, 14]
    assert all(decide(s, preempted=True) for s in range(1, 15))


def test_a_fallback_is_recorded_with_both_steps_the_path_and_the_reason(tmp_path):
    manager = StandInManager(tmp_path / "checkpoints", fail={12})
    fallbacks: list[checkpointing.Fallback] = []
    assert checkpointing.restore(manager, None, is_writer=False, attempts=1, on_fallback=fallbacks.append) == (
        8,
        {"step": 8},
    )
    assert fallbacks == [
        checkpointing.Fallback(
            tried=12, path=str(tmp_path / "checkpoints" / "12"), reason="KeyError: 'Store.read'", used=8
        )
    ]
    assert checkpointing.restore(
        StandInManager(tmp_path, fail=set()), None, is_writer=False, on_fallback=fallbacks.append
    ) == (
        12,
        {"step": 12},
    )
    assert len(fallbacks) == 1  # no fallback, no record


def test_the_cli_prints_why_restore_fell_back(tmp_path):
    lines: list[str] = []
    resource = EmulatedStack(load_stack_file(STACK), LocalPaths(tmp_path / "emu"), "", report=lines.append)
    path = "gs://b/runs/dev/checkpoints/12"
    # The event as training.train writes it (tests/training/test_agreement.py checks the trainer's).
    resource.reporter.event(
        {
            "event": "restore_fallback",
            "step": 8,
            "tried": 12,
            "path": path,
            "reason": "process 1: ValueError: DATA_LOSS: Error reading manifest",
            "time": 0.0,
        }
    )
    assert lines == [
        f"restore fell back from the checkpoint of step 12 ({path}): process 1: ValueError: DATA_LOSS: "
        "Error reading manifest; resuming from step 8"
    ]
    assert not REPR.search(lines[0])


class Manager:
    def __init__(self, sync_point: int | None):
        self.sync_point = sync_point

    def reached_preemption(self, step: int) -> bool:
        return step == self.sync_point


def test_the_loop_honours_the_agreed_step_or_a_local_sigterm():
    notice = preemption.Notice(grace_s=5)
    assert not notice.trained
    assert [notice.reached(Manager(sync_point=3), s) for s in (1, 2, 3)] == [False, False, True]
    assert notice.trained and notice.honouring
    single = preemption.Notice(grace_s=5)
    single.local = True  # what the SIGTERM handler sets
    assert single.reached(Manager(sync_point=None), 1)


def test_uninstall_wakes_the_watchdog_instead_of_waiting_for_its_poll(monkeypatch):
    # Every exit runs through uninstall after the run's last record: a watchdog left to finish
    # its select (POLL_S) delayed every restart. With a 30 s poll, uninstall must not wait it out.
    monkeypatch.setattr(preemption, "POLL_S", 30.0)
    notice = preemption.Notice(grace_s=5)
    notice.install()
    watchdog = notice._thread
    assert watchdog is not None and watchdog.is_alive()
    time.sleep(0.2)  # the watchdog is in its select on the pipe
    started = time.monotonic()
    notice.uninstall()
    assert not watchdog.is_alive() and time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGTERM) is not notice._handle  # the previous handler is back


BLOCKED = """
import logging, sys, time
from training import preemption
logging.basicConfig(level=logging.INFO)
notice = preemption.Notice(grace_s=float(sys.argv[1]))
notice.install()
notice.trained = sys.argv[2] == "trained"
print("blocked", flush=True)
time.sleep(600)  # blocked: never asks reached()
"""


@pytest.mark.parametrize(
    ("progress", "code", "message"),
    [
        (
            "untrained",
            preemption.EXIT_PREEMPTED,
            "before the first training step of this start: nothing to save; exiting 75",
        ),
        (
            "trained",
            preemption.EXIT_FAILED,
            "stop notice not honoured within 3 s (the process is blocked); exiting 1",
        ),
    ],
)
def test_the_watchdog_ends_a_blocked_process_after_a_notice(progress, code, message):
    proc = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, "3", progress],
        cwd=Path(__file__).parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout.readline().strip() == "blocked"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)  # the hang detector; the watchdog needs seconds
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code, out
    assert "stop notice (SIGTERM to this process)" in out and message in out


def test_orbax_s_sync_point_warning_is_printed_once_per_step_however_many_checks_reach_it(caplog):
    """Orbax logs ``Reached preemption sync point`` from each of its checks of the agreed step
    (should_save, save, the finalize thread); with the notice installed, the log shows it once a step."""
    absl = logging.getLogger("absl")
    notice = preemption.Notice(grace_s=60.0)
    notice.install()
    try:
        with caplog.at_level(logging.WARNING, logger="absl"):
            for thread in ("MainThread", "MainThread", "save_finalize"):
                absl.warning(preemption.ORBAX_SYNC_POINT, 0, thread, 93)
            absl.warning(preemption.ORBAX_SYNC_POINT, 0, "MainThread", 94)  # another step: its own line
            absl.warning("another absl warning")
            absl.warning("another absl warning")  # nothing else is filtered
    finally:
        notice.uninstall()
    assert [r.getMessage() for r in caplog.records] == [
        "[process=0][thread=MainThread] Reached preemption sync point, step=93",
        "[process=0][thread=MainThread] Reached preemption sync point, step=94",
        "another absl warning",
        "another absl warning",
    ]
    assert not absl.filters  # uninstalled with the notice

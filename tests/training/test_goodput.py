"""training.metrics.goodput: goodput and badput by cause from hand-made event and metrics records,
the expected numbers worked out here from each scenario's timeline (seconds since the epoch)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from training.metrics import goodput


def step(number: int, at: float, seconds: float, first: bool = False) -> dict:
    record = {"step": number, "loss": 1.0, "step_time_s": seconds, "time": at}
    return record | ({"includes_compile": True} if first else {})


def test_a_killed_attempt_and_its_recomputed_steps():
    # Attempt 1: process starts at 1000, trains from scratch (start event at 1010, so 10 s
    # of initialization, the 2 s of state init included), steps 1-4 (step 1 compiles: 5 s,
    # then 1 s each), a 0.5 s save after step 2, killed after step 4 (last record 1018.5).
    # Attempt 2: process starts at 1030 (11.5 s of repair and boot), restores step 2 in 2 s
    # (start event at 1036: 4 s of initialization besides), steps 3 (1.5 s: compiles) and 4,
    # a 0.75 s eval, and 1 s waiting for the last save before the complete event at 1040.25
    # (its save_s).
    events = [
        {
            "event": "start",
            "step": 0,
            "restored": False,
            "time": 1010.0,
            "process_start": 1000.0,
            "restore_s": 2.0,
            "devices": 8,
        },
        {"event": "checkpoint", "step": 2, "time": 1016.5, "save_s": 0.5},
        {
            "event": "start",
            "step": 2,
            "restored": True,
            "time": 1036.0,
            "process_start": 1030.0,
            "restore_s": 2.0,
            "devices": 8,
        },
        {"event": "complete", "step": 4, "time": 1040.25, "save_s": 1.0},
    ]
    metrics = [
        step(1, 1015.0, 5.0, first=True),
        step(2, 1016.0, 1.0),
        step(3, 1017.5, 1.0),
        step(4, 1018.5, 1.0),
        step(3, 1037.5, 1.5, first=True),
        step(4, 1038.5, 1.0),
        {"step": 4, "eval_loss": 2.0, "eval_s": 0.75, "time": 1039.25},
    ]
    steady = 1.0  # the median of the steps that did not compile
    report = goodput.account(events, metrics)
    wall = 1040.25 - 1000.0
    productive = 4 * steady  # steps 1 and 2 of attempt 1, 3 and 4 of attempt 2, compile excluded
    assert report["badput"] == pytest.approx(
        {
            "initialization": (1010.0 - 1000.0) + (1036.0 - 1030.0 - 2.0),
            "compilation": (5.0 - steady) + (1.5 - steady),
            "checkpoint_save": 0.5 + 1.0,
            "checkpoint_restore": 2.0,
            "evaluation": 0.75,
            "recomputed_steps": 2 * 1.0,  # steps 3 and 4 of attempt 1
            "boot": 1030.0 - 1018.5,
            "other": 0.0,
        }
    )
    assert sum(report["badput"].values()) + productive == pytest.approx(wall)
    assert report["goodput"] == round(productive / wall, 4)
    assert (report["wall_seconds"], report["productive_seconds"]) == (pytest.approx(wall), pytest.approx(productive))
    assert (report["steps_lost"], report["attempts"], report["complete"]) == (2, 2, True)
    assert "tokens_per_s" not in report  # no rates asked for
    # Each attempt on its own: the killed one ended with no exit event; the boot before the
    # second is its own; the attempts' causes and productive times add up to the run's.
    first, second = report["per_attempt"]
    assert (first["ended"], first["start_step"], first["restored"]) == ("lost", 0, False)
    assert (second["ended"], second["start_step"], second["restored"]) == ("complete", 2, True)
    assert first["badput"]["boot"] == 0 and second["badput"]["boot"] == pytest.approx(1030.0 - 1018.5)
    assert first["badput"]["recomputed_steps"] == 2.0 and second["badput"]["checkpoint_restore"] == 2.0
    assert (first["productive_seconds"], second["productive_seconds"]) == (2.0, 2.0)
    for cause, seconds in report["badput"].items():
        assert first["badput"][cause] + second["badput"][cause] == pytest.approx(seconds), cause


def test_the_start_events_phases_are_reported_per_attempt():
    events = [
        {"event": "start", "step": 0, "time": 10.0, "process_start": 4.0, "import_s": 2.5, "join_s": 1.25},
        {"event": "complete", "step": 1, "time": 13.0, "save_s": 0.5},
    ]
    report = goodput.account(events, [step(1, 12.5, 2.5, first=True)])
    (attempt,) = report["per_attempt"]
    assert (attempt["import_s"], attempt["join_s"]) == (2.5, 1.25)
    assert attempt["badput"]["initialization"] == 6.0 and attempt["badput"]["checkpoint_save"] == 0.5


def test_a_preemption_in_one_process_and_the_rates():
    # One process runs both attempts (a test calling train.run twice): the second attempt's
    # process start is the first's, so it begins at the first's last record (1006), not at 1000.
    # The preempted event carries no save_s (a trainer that did not measure its exit): the
    # 0.75 s between the preemption checkpoint and that event are explained by no record, so
    # they are other, not checkpoint_save.
    events = [
        {
            "event": "start",
            "step": 0,
            "restored": False,
            "time": 1002.0,
            "process_start": 1000.0,
            "restore_s": 0.5,
            "devices": 2,
        },
        {"event": "checkpoint", "step": 2, "preemption": True, "time": 1005.25, "save_s": 0.25},
        {"event": "preempted", "step": 2, "time": 1006.0},
        {
            "event": "start",
            "step": 2,
            "restored": True,
            "time": 1009.0,
            "process_start": 1000.0,
            "restore_s": 1.0,
            "devices": 2,
        },
        {"event": "complete", "step": 4, "time": 1011.5},
    ]
    metrics = [
        step(1, 1004.0, 2.0, first=True),
        step(2, 1005.0, 1.0),
        step(3, 1010.5, 1.5, first=True),
        step(4, 1011.5, 1.0),
    ]
    report = goodput.account(events, metrics, tokens_per_step=100, flops_per_step=1e6, peak_flops_per_chip=1e6)
    wall, productive = 1011.5 - 1000.0, 4 * 1.0
    assert report["badput"] == pytest.approx(
        {
            "initialization": (1002.0 - 1000.0) + (1009.0 - 1006.0 - 1.0),
            "compilation": 1.0 + 0.5,
            "checkpoint_save": 0.25,
            "checkpoint_restore": 1.0,
            "evaluation": 0.0,
            "recomputed_steps": 0.0,
            "boot": 0.0,
            "other": 1006.0 - 1002.0 - (2.0 + 1.0 + 0.25),
        }
    )
    assert report["goodput"] == round(productive / wall, 4) and report["steps_lost"] == 0
    assert report["tokens_per_s"] == pytest.approx(4 * 100 / productive)
    per_chip = 4 * 1e6 / productive / 2  # FLOP/s over 2 devices
    assert report["tflops_per_chip"] == pytest.approx(per_chip / 1e12)
    assert report["mfu"] == pytest.approx(per_chip / 1e6)


def test_an_unfinished_run_counts_to_its_last_record_and_no_start_means_no_report():
    events = [{"event": "start", "step": 0, "restored": False, "time": 10.0, "process_start": 4.0}]
    metrics = [step(1, 13.0, 3.0, first=True), step(2, 14.0, 1.0), step(3, 15.0, 1.0)]
    report = goodput.account(events, metrics)
    assert report["complete"] is False and report["wall_seconds"] == pytest.approx(15.0 - 4.0)
    assert report["productive_seconds"] == pytest.approx(3 * 1.0)
    assert report["badput"]["checkpoint_save"] == 0.0  # no exit event: nothing waited for a save
    assert goodput.account([], metrics) is None
    assert goodput.account([{"event": "checkpoint", "time": 1.0}], metrics) is None


def test_an_attempt_whose_next_start_has_the_same_time_is_accounted_without_error():
    # Two starts written within the clock's resolution (an attempt that ended at once): the
    # first attempt holds no record but its own start; the run is still accounted, and its
    # causes and productive time still add up to the wall time.
    events = [
        {"event": "start", "step": 0, "restored": False, "time": 10.0, "process_start": 4.0},
        {"event": "start", "step": 0, "restored": False, "time": 10.0, "process_start": 9.0},
        {"event": "complete", "step": 2, "time": 15.0},
    ]
    metrics = [step(1, 13.0, 3.0, first=True), step(2, 14.0, 1.0)]
    report = goodput.account(events, metrics)
    assert report is not None and report["attempts"] == 2
    assert report["wall_seconds"] == pytest.approx(15.0 - 4.0)
    assert report["productive_seconds"] + sum(report["badput"].values()) == pytest.approx(15.0 - 4.0)


def test_records_without_timings_give_no_productive_time_but_no_error():
    # Records of a trainer before goodput accounting: start and complete times only.
    events = [{"event": "start", "step": 0, "time": 100.0}, {"event": "complete", "step": 2, "time": 110.0}]
    report = goodput.account(events, [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.0}])
    assert report["goodput"] == 0.0 and sum(report["badput"].values()) == pytest.approx(110.0 - 100.0)
    assert report["badput"]["other"] == pytest.approx(10.0)  # explained by no record: never a named cause
    assert report["badput"]["checkpoint_save"] == 0.0


def test_the_process_start_time_is_when_the_process_started():
    # A child process reports its own start: after it was spawned here, before it answered
    # (clock ticks of 10 ms: proc(5)); psutil's create_time agrees to its 1 s (integer btime).
    before = time.time()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import time; time.sleep(0.5); from training.metrics import goodput; print(goodput.process_start_time())",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
    )
    after = time.time()
    started = float(child.stdout)
    assert before - 0.02 <= started <= after - 0.5 + 0.02
    assert goodput.process_start_time() == pytest.approx(psutil.Process(os.getpid()).create_time(), abs=1.0)


def test_the_stack_renders_the_catalogs_peak_into_the_trainer_config_unless_set():
    from infra.config import load_stack, validate_stack
    from tests.fakes.pulumi_program import stack_map

    # v4: 275 TFLOP/s bf16 per chip (https://cloud.google.com/tpu/docs/v4).
    assert load_stack("dev").training.peak_flops_per_chip == 275e12
    config = stack_map("dev")
    config["multislice:training"]["peak_flops_per_chip"] = 1e12
    assert validate_stack("dev", config, "test").training.peak_flops_per_chip == 1e12


def test_steps_on_fewer_slices_are_productive_at_reduced_capacity_not_badput():
    # Elastic slices: two slices, then slice 1 lost (an attempt on 1 of 2), then both again.
    events = [
        {
            "event": "start",
            "step": 0,
            "restored": False,
            "time": 10.0,
            "process_start": 9.0,
            "slices": 2,
            "full_slices": 2,
        },
        {
            "event": "start",
            "step": 2,
            "restored": True,
            "time": 20.0,
            "process_start": 19.0,
            "slices": 1,
            "full_slices": 2,
        },
        {"event": "preempted", "step": 4, "time": 25.0, "membership_epoch": 2},
        {
            "event": "start",
            "step": 4,
            "restored": True,
            "time": 30.0,
            "process_start": 29.0,
            "slices": 2,
            "full_slices": 2,
        },
        {"event": "complete", "step": 5, "time": 32.0},
    ]
    metrics = [step(1, 11.0, 1.0), step(2, 12.0, 1.0), step(3, 22.0, 2.0), step(4, 24.0, 2.0), step(5, 31.0, 1.0)]
    report = goodput.account(events, metrics)
    assert report is not None
    assert report["productive_seconds"] == pytest.approx(1.0 + 1.0 + 2.0 + 2.0 + 1.0)
    assert report["reduced_capacity_seconds"] == pytest.approx(2.0 + 2.0)  # the attempt on 1 of 2 slices
    assert [a.get("slices") for a in report["per_attempt"]] == [2, 1, 2]
    assert report["productive_seconds"] + sum(report["badput"].values()) == pytest.approx(32.0 - 9.0)

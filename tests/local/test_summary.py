"""infra.local.summary: the run summary from what the trainer wrote in a run directory
(synthetic ``metrics`` / ``events`` logs and ``COMPLETE`` written here, as the trainer writes
them: training.metrics.run_log.RecordLog and training.checkpoint.completion.write_completion), locally and
through the emulated Cloud Storage."""

from __future__ import annotations

import json

import pytest

from infra.cli.run_summary import print_summary
from infra.local.summary import name_own_resume, summarize, unplanned_restarts
from training.checkpoint.completion import write_completion
from training.metrics.run_log import RecordLog
from training.run_dir import RunDir


@pytest.fixture
def tmp_run(tmp_path) -> RunDir:
    return RunDir(str(tmp_path))


def write_run(run_dir: RunDir, metrics: list[dict], events: list[dict], window: int = 4) -> None:
    """The records as the trainer writes them: ``window`` records per object."""
    for name, records in (("metrics", metrics), ("events", events)):
        log = RecordLog(run_dir, name)
        for index, record in enumerate(records, 1):
            log.append(record)
            if index % window == 0:
                log.sync()
        log.close()


def loss(step: int) -> float:
    return 10.0 / step


def steps(first: int, last: int) -> list[dict]:
    return [{"step": s, "loss": loss(s), "learning_rate": 1e-3} for s in range(first, last + 1)]


def test_a_run_killed_once_and_resumed(tmp_run):
    # Attempt 1 trains steps 1..9 and checkpoints at 6; it is killed; attempt 2 restores
    # step 6 and trains 7..12: steps 7, 8, 9 are computed twice.
    killed_at, restored, total = 9, 6, 12
    metrics = steps(1, killed_at) + [{"step": 6, "eval_loss": 1.5}] + steps(restored + 1, total)
    metrics.append({"step": 12, "eval_loss": 1.25})
    events = [
        {"event": "start", "step": 0, "restored": False, "time": 1000.0},
        {"event": "checkpoint", "step": 6, "preemption": False, "time": 1010.0},
        {"event": "start", "step": restored, "restored": True, "time": 1030.5},
        {"event": "complete", "step": total, "loss": loss(total), "time": 1042.25},
    ]
    write_run(tmp_run, metrics, events)
    write_completion(tmp_run, {"step": total, "loss": loss(total)})
    result = summarize(tmp_run, total)
    assert result == {
        "run_dir": str(tmp_run),
        "complete": True,
        "steps_completed": total,
        "total_steps": total,
        "final_loss": loss(total),
        "final_eval_loss": 1.25,
        "eval_every_steps": 0,
        "restarts": 1,
        "restart_causes": ["failure: resumed at step 6"],  # killed, no preemption notice
        "steps_lost": killed_at - restored,
        "training_seconds": 42.25,
        # These records carry no step times: nothing is productive. Attempt 1 spans
        # 1000-1010 (its last record); 1010-1030.5 is the restart; attempt 2 exits at 1042.25.
        # No record explains either attempt's time (no step, save or exit durations): other.
        "goodput": 0.0,
        "badput": {
            "initialization": 0.0,
            "compilation": 0.0,
            "checkpoint_save": 0.0,
            "checkpoint_restore": 0.0,
            "evaluation": 0.0,
            "recomputed_steps": 0.0,
            "boot": 1030.5 - 1010.0,
            "other": (1010.0 - 1000.0) + (1042.25 - 1030.5),
        },
        "slice_changes": [],  # never elastic
    }


def test_steps_lost_counts_every_recomputed_record(tmp_run):
    # Three attempts: 1..5 (killed, checkpoint 4), 5..8 (killed, checkpoint 6), 7..10.
    metrics = steps(1, 5) + steps(5, 8) + steps(7, 10)
    events = [{"event": "start", "step": s, "time": float(s)} for s in (0, 4, 6)]
    write_run(tmp_run, metrics, events)
    result = summarize(tmp_run, 10)
    assert result["steps_lost"] == len([5]) + len([7, 8])
    assert result["restarts"] == 2
    assert result["steps_completed"] == 10 and result["complete"] is False  # no marker yet


def test_a_preempted_run_loses_no_step(tmp_run):
    # A preemption saves the step every process reached: the next attempt starts after it.
    write_run(tmp_run, steps(1, 7) + steps(8, 12), [{"event": "start", "time": 5.0}, {"event": "start", "time": 9.0}])
    result = summarize(tmp_run, 12)
    assert (result["restarts"], result["steps_lost"], result["training_seconds"]) == (1, 0, 4.0)


def test_the_final_loss_is_the_last_record_of_the_last_step(tmp_run):
    # The last step recomputed after a restart: the newest record is the one that counts.
    write_run(tmp_run, steps(1, 3) + [{"step": 3, "loss": 0.125}], [])
    assert summarize(tmp_run, 3)["final_loss"] == 0.125


def test_the_completion_marker_gives_the_step_when_metrics_lag(tmp_run):
    write_run(tmp_run, steps(1, 4), [])
    write_completion(tmp_run, {"step": 8, "loss": 0.5})
    result = summarize(tmp_run, 8)
    assert result["steps_completed"] == 8 and result["complete"] is True
    assert result["final_loss"] is None  # no metrics record of step 8


@pytest.mark.parametrize("marker_step", [5, 7])
def test_a_marker_short_of_the_total_is_not_complete(tmp_run, marker_step):
    # Raising `steps` after a run finished makes it continue from its last checkpoint.
    write_run(tmp_run, steps(1, marker_step), [])
    write_completion(tmp_run, {"step": marker_step, "loss": loss(marker_step)})
    assert summarize(tmp_run, 8)["complete"] is False
    assert summarize(tmp_run, marker_step)["complete"] is True


def test_a_run_read_through_the_emulated_cloud_storage(bucket):
    # The same records as test_a_run_killed_once_and_resumed, in gs://: the same summary.
    run_dir = RunDir(f"gs://{bucket}/runs/demo")
    metrics = steps(1, 9) + steps(7, 12)
    events = [{"event": "start", "step": 0, "time": 1000.0}, {"event": "start", "step": 6, "time": 1030.5}]
    write_run(run_dir, metrics, events)
    write_completion(run_dir, {"step": 12, "loss": loss(12)})
    result = summarize(run_dir, 12)
    assert result["run_dir"] == f"gs://{bucket}/runs/demo"
    assert (result["complete"], result["steps_completed"], result["final_loss"]) == (True, 12, loss(12))
    assert (result["restarts"], result["steps_lost"], result["training_seconds"]) == (1, 3, 30.5)


def test_an_empty_run_directory(tmp_run):
    assert summarize(tmp_run, 5) == {
        "run_dir": str(tmp_run),
        "complete": False,
        "steps_completed": 0,
        "total_steps": 5,
        "final_loss": None,
        "final_eval_loss": None,
        "eval_every_steps": 0,
        "restarts": 0,
        "restart_causes": [],
        "steps_lost": 0,
        "training_seconds": None,
        "goodput": None,
        "badput": {},
        "slice_changes": [],
    }


def test_goodput_and_badput_of_timed_records_in_the_summary_its_json_and_its_table(tmp_run, capsys):
    # The trainer's timings: process start 990, start event 1000, steps of 1 s (step 1: 4 s,
    # compiling), a 0.5 s save after step 2, complete at 1005.5 right after step 3.
    events = [
        {"event": "start", "step": 0, "restored": False, "time": 1000.0, "process_start": 990.0, "restore_s": 1.0},
        {"event": "checkpoint", "step": 2, "time": 1005.5, "save_s": 0.5},
        {"event": "complete", "step": 3, "time": 1006.5},
    ]
    metrics = [
        {"step": 1, "loss": 3.0, "step_time_s": 4.0, "includes_compile": True, "time": 1004.0},
        {"step": 2, "loss": 2.0, "step_time_s": 1.0, "time": 1005.0},
        {"step": 3, "loss": 1.0, "step_time_s": 1.0, "time": 1006.5},
    ]
    write_run(tmp_run, metrics, events)
    write_completion(tmp_run, {"step": 3, "loss": 1.0})
    result = summarize(tmp_run, 3)
    wall, productive = 1006.5 - 990.0, 3 * 1.0
    assert result["goodput"] == round(productive / wall, 4)
    assert result["badput"] == {
        "initialization": 10.0,
        "compilation": 3.0,
        "checkpoint_save": 0.5,
        "checkpoint_restore": 0.0,
        "evaluation": 0.0,
        "recomputed_steps": 0.0,
        "boot": 0.0,
        "other": 0.0,
    }
    assert json.loads(json.dumps(result))["badput"] == result["badput"]  # --summary-json
    print_summary(result)
    table = " ".join(capsys.readouterr().out.replace("│", " ").split())  # the cells' words, wrapped or not
    assert f"goodput {productive / wall:.4f} badput" in table
    assert "initialization 10.0 s; compilation 3.0 s; checkpoint_save 0.5 s" in table


def test_malformed_records_are_left_out_of_the_summary(tmp_run):
    write_run(
        tmp_run,
        steps(1, 4) + [{"step": "5", "loss": 1.0}, {"step": None, "loss": 0.5}, {"step": 6, "loss": None}],
        [{"event": "start", "step": 0, "time": 1.0}, {"event": "start", "step": "x", "time": 2.0}],
    )
    summary = summarize(tmp_run, 4)
    assert (summary["steps_completed"], summary["final_loss"], summary["restarts"]) == (4, loss(4), 0)


def test_the_table_says_at_which_step_each_fault_fired(capsys):
    print_summary({"complete": True, "faults": ["kill slice 1 at step 8"], "fault_steps": [11]})
    assert "kill slice 1 at step 8 (fired after step 11)" in capsys.readouterr().out


def test_every_restart_is_named_and_those_nothing_asked_for_are_unplanned(tmp_run):
    # Four restarts: a kill before the `local up` at time 1500 (an earlier up's fault), this up's
    # resume of the run the earlier one left, a preemption, and one more failure. This up fired
    # one fault (the preemption); its own resume is the user's, and the failure after the
    # preemption is unplanned, whatever caused it.
    events = [
        {"event": "start", "step": 0, "restored": False, "time": 1000.0},
        {"event": "start", "step": 6, "restored": True, "time": 1100.0},
        {"event": "start", "step": 6, "restored": True, "time": 1510.0},
        {"event": "preempted", "step": 10, "time": 1590.0},
        {"event": "start", "step": 10, "restored": True, "time": 1600.0},
        {"event": "start", "step": 0, "restored": False, "time": 1700.0},
    ]
    write_run(tmp_run, steps(1, 12), events)
    summary = summarize(tmp_run, total_steps=24)
    assert summary["restarts"] == 4
    assert summary["restart_causes"] == [
        "failure: resumed at step 6",
        "failure: resumed at step 6",
        "preemption at step 10: resumed at step 10",
        "failure: started again from the seed",
    ]
    assert unplanned_restarts(tmp_run, since=1500.0, planned=1) == ["failure: started again from the seed"]
    assert unplanned_restarts(tmp_run, since=1500.0, planned=2) == []
    name_own_resume(summary, tmp_run, since=1500.0)
    assert summary["restart_causes"][1] == "your earlier local up stopped: resumed at step 6"
    assert summary["restart_causes"][0] == "failure: resumed at step 6"
    # An up that started the run (nothing before its start) has no resume of its own.
    assert unplanned_restarts(tmp_run, since=999.0, planned=1) == [
        "failure: resumed at step 6",
        "preemption at step 10: resumed at step 10",
        "failure: started again from the seed",
    ]
    fresh = {"restart_causes": ["failure: resumed at step 6"]}
    name_own_resume(fresh, tmp_run, since=999.0)
    assert fresh["restart_causes"] == ["failure: resumed at step 6"]


def test_a_resize_a_fault_caused_counts_against_it_and_the_runs_own_resize_against_none(tmp_run):
    # An elastic up with one fault (a preemption of slice 1): the job saves on the notice and trains on
    # one slice (a resize the fault caused), grows back at its own checkpoint (a resize it decided,
    # membership_epoch), then a trainer fails. Only the failure is unplanned.
    events = [
        {"event": "start", "step": 0, "restored": False, "time": 1000.0, "slices": 2},
        {"event": "preempted", "step": 10, "time": 1100.0},
        {"event": "start", "step": 10, "restored": True, "time": 1200.0, "slices": 1},
        {"event": "preempted", "step": 20, "time": 1300.0, "membership_epoch": 2},
        {"event": "start", "step": 20, "restored": True, "time": 1400.0, "slices": 2},
        {"event": "start", "step": 20, "restored": True, "time": 1500.0, "slices": 2},
    ]
    write_run(tmp_run, steps(1, 24), events)
    assert summarize(tmp_run, total_steps=24)["restart_causes"] == [
        "elastic resize at step 10: resumed at step 10",
        "elastic resize at step 20: resumed at step 20",
        "failure: resumed at step 20",
    ]
    assert unplanned_restarts(tmp_run, since=999.0, planned=1) == ["failure: resumed at step 20"]
    assert unplanned_restarts(tmp_run, since=999.0, planned=0) == [
        "elastic resize at step 10: resumed at step 10",
        "failure: resumed at step 20",
    ]


@pytest.mark.parametrize(
    ("result", "shown"),
    [
        ({"steps_completed": 20, "eval_every_steps": 40}, "— (no evaluation: eval every 40 steps, the run had 20)"),
        (
            {"steps_completed": 20, "eval_every_steps": 0},
            "— (no evaluation: multislice:training.eval_every_steps is 0)",
        ),
        ({"steps_completed": 20}, "— (no evaluation: multislice:training.eval_every_steps is 0)"),
    ],
)
def test_a_row_without_a_value_says_why_and_never_none(capsys, result, shown):
    print_summary({"complete": True, "final_loss": None, "final_eval_loss": None, **result})
    out = capsys.readouterr().out
    assert "None" not in out
    assert shown in out and "— (no step completed yet)" in out


def test_the_summary_names_each_change_of_slice_count(tmp_run, capsys):
    from training import membership

    start, _ = membership.propose(tmp_run, None, (0, 1), step=None, reason="start", now=1.0)
    shrunk, _ = membership.propose(tmp_run, start, (0,), step=50, reason="slice 1 lost, not back within 2m", now=2.0)
    membership.propose(tmp_run, shrunk, (0, 1), step=90, reason="slice 1 back, 3h after the last change", now=3.0)
    result = summarize(tmp_run, 100)
    assert result["slice_changes"] == [
        "slices 2 → 1 at step 50 (slice 1 lost, not back within 2m)",
        "slices 1 → 2 at step 90 (slice 1 back, 3h after the last change)",
    ]
    print_summary(result)
    table = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "slice_changes slices 2 → 1 at step 50 (slice 1 lost, not back within 2m) slices 1 → 2" in table
    tmp_run.write("membership/00000003.json", b"{torn")  # left out (logged), as the trainer's gate does
    assert summarize(tmp_run, 100)["slice_changes"] == result["slice_changes"]

"""infra.status.progress: a run's progress read from its newest records, through the emulated
Cloud Storage (the session's fake-gcs-server), on runs laid out as the trainer writes them."""

from __future__ import annotations

import json

import pytest

from infra.status.progress import read_progress
from infra.status.store import RunStore
from tests.fakes.synthetic_run import Fault, SyntheticRun, upload
from training.metrics.restarts import restarts_of


class CountingStore(RunStore):
    """A RunStore that remembers the names of the objects it read."""

    def __init__(self, root: str):
        super().__init__(root)
        self.names_read: list[str] = []

    def read(self, names):
        self.names_read += names
        return super().read(names)


def stored(bucket: str, run: SyntheticRun, name: str = "r") -> CountingStore:
    run_dir = f"gs://{bucket}/runs/{name}"
    upload(run_dir, run.objects())
    return CountingStore(run_dir)


def test_a_run_in_progress_with_a_failure_and_a_preemption(bucket):
    run = SyntheticRun(
        total_steps=200,
        steps_done=150,
        log_every=10,
        checkpoint_every=50,
        faults=[Fault("failure", 75), Fault("preemption", 120)],
        goodput={"goodput": 0.8, "badput": {"boot": 120.0, "compilation": 9.0}},
    )
    store = stored(bucket, run)
    progress = read_progress(store, 200)

    last = run.metrics[-1]
    assert progress.exists and not progress.complete
    assert (progress.step, progress.loss) == (150, last["loss"]) == (150, 5.0 / 2.5)
    # this attempt's steady steps: 0.5 s each, 1024 tokens per step
    assert progress.step_time_s == pytest.approx(0.5)
    assert progress.tokens_per_s == pytest.approx(1024 / 0.5)
    assert progress.eta_seconds == pytest.approx((200 - 150) * 0.5)
    assert progress.fraction == pytest.approx(150 / 200)
    checkpoints = [e for e in run.events if e["event"] == "checkpoint"]
    assert (progress.last_checkpoint_step, progress.last_checkpoint_at) == (150, checkpoints[-1]["time"])
    starts = [e for e in run.events if e["event"] == "start"]
    assert progress.started_at == starts[0]["time"]
    assert [(r.cause, r.resumed_step, r.restored, r.preempted_step) for r in progress.restarts] == [
        ("failure", 50, True, None),
        ("preemption", 120, True, 120),
    ]
    assert [r.resumed_at for r in progress.restarts] == [s["time"] for s in starts[1:]]
    assert progress.preemptions == 1
    assert progress.goodput == 0.8 and progress.badput == {"boot": 120.0, "compilation": 9.0}
    assert progress.training_seconds == pytest.approx(checkpoints[-1]["time"] - starts[0]["time"], abs=1e-3)


def test_a_restart_without_a_step_yet_shows_where_it_resumed_and_no_speed(bucket):
    # Slice 1 lost at step 130 of a 2-slice run: the job of slice 0 alone started from the checkpoint of
    # step 100 and has not finished a step. The struck attempt's step 130 and its two-slice speed are
    # not where the run stands nor how fast it goes now.
    run = SyntheticRun(total_steps=200, steps_done=130, log_every=10, checkpoint_every=50)
    objects = run.objects()
    alone = {"event": "start", "step": 100, "restored": True, "slices": 1, "full_slices": 2}
    objects["events/99999999.jsonl"] = json.dumps(alone | {"time": run.metrics[-1]["time"] + 60}).encode() + b"\n"
    upload(f"gs://{bucket}/runs/shrunk", objects)
    progress = read_progress(RunStore(f"gs://{bucket}/runs/shrunk"), 200)
    assert (progress.step, progress.slices, progress.full_slices) == (100, 1, 2)
    assert progress.loss is None or progress.loss == next(r["loss"] for r in run.metrics if r["step"] == 100)
    assert (progress.step_time_s, progress.tokens_per_s, progress.eta_seconds) == (None, None, None)
    # Its first steps, at one slice's speed (1.0 s): the speed and ETA are this attempt's alone.
    begun = run.metrics[-1]["time"] + 60
    steps = [
        {"step": s, "loss": 1.0, "step_time_s": 1.0, "tokens_per_s": 512.0, "time": begun + s - 100}
        for s in range(101, 104)
    ]
    objects["metrics/99999999.jsonl"] = "".join(json.dumps(r) + "\n" for r in steps).encode()
    upload(f"gs://{bucket}/runs/shrunk2", objects)
    progress = read_progress(RunStore(f"gs://{bucket}/runs/shrunk2"), 200)
    assert (progress.step, progress.step_time_s, progress.tokens_per_s) == (103, 1.0, 512.0)
    assert progress.eta_seconds == pytest.approx(97 * 1.0)


def test_only_the_newest_metrics_objects_are_read(bucket):
    run = SyntheticRun(total_steps=400, steps_done=200, log_every=10, checkpoint_every=100)
    store = stored(bucket, run)
    metrics_objects = sorted(name for name in run.objects() if name.startswith("metrics/"))
    assert len(metrics_objects) == 200 // 10  # one object per logging window
    read_progress(store, 2000)
    read = [name for name in store.names_read if name.startswith("metrics/")]
    assert read == metrics_objects[-2:]


def test_older_metrics_objects_are_read_while_the_newest_hold_no_step(bucket):
    run_dir = f"gs://{bucket}/runs/evals"
    step = {"step": 4, "loss": 2.5, "step_time_s": 1.0, "tokens_per_s": 100.0}
    objects = {"metrics/00000000.jsonl": (json.dumps(step) + "\n").encode()}
    for n in range(1, 4):  # windows that hold only an eval record
        objects[f"metrics/{n:08d}.jsonl"] = (json.dumps({"step": 4, "eval_loss": 3.0 + n}) + "\n").encode()
    objects["events/00000000.jsonl"] = (json.dumps({"event": "start", "step": 0, "time": 10.0}) + "\n").encode()
    upload(run_dir, objects)
    progress = read_progress(RunStore(run_dir), 10)
    assert (progress.step, progress.loss, progress.eval_loss, progress.tokens_per_s) == (4, 2.5, 6.0, 100.0)


def test_a_complete_run(bucket):
    run = SyntheticRun(total_steps=60, steps_done=60, log_every=10, checkpoint_every=20)
    progress = read_progress(stored(bucket, run), 60)
    done = [e for e in run.events if e["event"] == "complete"]
    assert progress.complete and progress.completed_step == 60 and progress.step == 60
    assert (progress.eta_seconds, progress.fraction, progress.completed_at) == (0.0, 1.0, done[0]["time"])
    # raising training.steps makes the same run unfinished
    assert not read_progress(RunStore(f"gs://{bucket}/runs/r"), 100).complete


@pytest.mark.parametrize("marker", [b"not json", b'{"step": 0}', b'{"step": true}', b'{"loss": 1.0}'])
def test_a_malformed_completion_marker_is_not_complete(bucket, marker):
    run = SyntheticRun(total_steps=20, steps_done=20, log_every=10, checkpoint_every=10)
    objects = run.objects() | {"COMPLETE": marker}
    upload(f"gs://{bucket}/runs/bad", objects)
    progress = read_progress(RunStore(f"gs://{bucket}/runs/bad"), 20)
    assert not progress.complete and progress.completed_step is None


@pytest.mark.parametrize("report", [b"{", b'{"goodput": 1.5}', b'{"goodput": "high"}', b"[0.5]"])
def test_an_unreadable_goodput_report_is_left_out(bucket, report):
    run = SyntheticRun(total_steps=20, steps_done=10, log_every=10, checkpoint_every=10)
    upload(f"gs://{bucket}/runs/g", run.objects() | {"goodput.json": report})
    progress = read_progress(RunStore(f"gs://{bucket}/runs/g"), 20)
    assert progress.goodput is None and progress.step == 10


def test_a_run_directory_that_does_not_exist(bucket):
    progress = read_progress(RunStore(f"gs://{bucket}/runs/none"), 20)
    assert not progress.exists and progress.step is None and progress.restarts == []


def test_restart_causes_come_from_the_events_between_starts():
    events = [
        {"event": "start", "step": 0, "time": 1.0},
        {"event": "checkpoint", "step": 10, "preemption": False, "time": 2.0},
        {"event": "start", "step": 10, "restored": True, "time": 3.0},  # no notice: a failure
        {"event": "checkpoint", "step": 14, "preemption": True, "time": 4.0},  # saved, then killed before "preempted"
        {"event": "start", "step": 14, "restored": True, "time": 5.0},
        {"event": "start", "step": 14, "restored": True, "time": 6.0},  # the notice belonged to the previous one
    ]
    assert [(r.cause, r.resumed_step, r.preempted_step, r.preempted_at) for r in restarts_of(events)] == [
        ("failure", 10, None, None),
        ("preemption", 14, 14, 4.0),
        ("failure", 14, None, None),
    ]


def test_a_stop_to_change_the_slice_count_is_a_resize_not_a_preemption():
    events = [
        {"event": "start", "step": 0, "time": 1.0, "slices": 1, "full_slices": 2},
        {"event": "checkpoint", "step": 20, "preemption": False, "time": 2.0},
        {"event": "preempted", "step": 20, "time": 2.5, "membership_epoch": 2},  # elastic: growing back
        {"event": "start", "step": 20, "restored": True, "time": 3.0, "slices": 2, "full_slices": 2},
    ]
    assert [(r.cause, r.preempted_step, r.own_resize) for r in restarts_of(events)] == [("resize", 20, True)]


def test_a_stop_notice_after_which_the_run_trains_on_another_slice_count_is_a_resize():
    """The queued resource restarts every slice as it recreates a lost one: the trainers save on that
    stop notice (no membership epoch of their own) and the next start trains on both slices again;
    a preempted slice that is not back makes the next start train on fewer. A failure stays one."""
    events = [
        {"event": "start", "step": 0, "time": 1.0, "slices": 2, "full_slices": 2},
        {"event": "preempted", "step": 53, "time": 2.0},  # slice 1 preempted: the job saves and stops
        {"event": "start", "step": 53, "restored": True, "time": 3.0, "slices": 1, "full_slices": 2},
        {"event": "preempted", "step": 81, "time": 4.0},  # the platform's restart as slice 1 returns
        {"event": "start", "step": 81, "restored": True, "time": 5.0, "slices": 2, "full_slices": 2},
        {"event": "preempted", "step": 90, "time": 6.0},  # a preemption on the same count
        {"event": "start", "step": 90, "restored": True, "time": 7.0, "slices": 2, "full_slices": 2},
        {"event": "start", "step": 90, "restored": True, "time": 8.0, "slices": 1, "full_slices": 2},  # killed
        {"event": "preempted", "step": 95, "time": 9.0},
        {"event": "start", "step": 95, "restored": True, "time": 10.0},  # a start that records no count
    ]
    assert [(r.cause, r.preempted_step, r.own_resize) for r in restarts_of(events)] == [
        ("resize", 53, False),  # a stop notice from outside: the run did not decide it
        ("resize", 81, False),
        ("preemption", 90, False),
        ("failure", None, False),
        ("preemption", 95, False),
    ]


def test_the_json_keys_are_stable(bucket):
    run = SyntheticRun(
        total_steps=40, steps_done=30, log_every=10, checkpoint_every=10, faults=[Fault("preemption", 25)]
    )
    data = read_progress(stored(bucket, run, "keys"), 40).to_json()
    assert set(data) == {
        "run_dir",
        "exists",
        "step",
        "total_steps",
        "fraction",
        "loss",
        "eval_loss",
        "tokens_per_s",
        "step_time_s",
        "eta_seconds",
        "last_checkpoint_step",
        "last_checkpoint_at",
        "started_at",
        "updated_at",
        "training_seconds",
        "restarts",
        "preemptions",
        "restart_history",
        "complete",
        "completed_step",
        "completed_at",
        "goodput",
        "badput",
        "goodput_at",
        "slices",
        "full_slices",
    }
    assert data["restarts"] == 1 and data["preemptions"] == 1
    assert set(data["restart_history"][0]) == {
        "cause",
        "resumed_step",
        "resumed_at",
        "restored",
        "preempted_step",
        "preempted_at",
        "own_resize",
    }
    json.dumps(data)


def test_the_plot_title_wraps_goodput_between_causes_and_keeps_every_one():
    from infra.status.plot import TITLE_LINE_CHARS, figure_title
    from infra.status.progress import RunProgress

    badput = {
        "initialization": 31.0,
        "compilation": 22.6,
        "checkpoint_save": 10.9,
        "evaluation": 6.0,
        "boot": 5.8,
        "recomputed_steps": 5.3,
        "checkpoint_restore": 1.1,
    }
    run = RunProgress(
        run_dir="gs://b/runs/dev",
        total_steps=120,
        exists=True,
        complete=True,
        completed_step=120,
        goodput=0.4391,
        badput=badput,
    )
    lines = figure_title("stack dev", run).split("\n")
    assert lines[0] == "stack dev (COMPLETE, 0 restarts, 0 after a preemption)"
    assert lines[1].startswith("goodput 0.44; badput initialization 31.0 s; ")
    assert len(lines) > 2 and all(len(line) <= TITLE_LINE_CHARS for line in lines[1:])
    text = "; ".join(lines[1:])
    assert all(f"{cause} {seconds:.1f} s" in text for cause, seconds in badput.items())

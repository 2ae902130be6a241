"""Where a start of an elastic run joins (training/membership_gate.py): every process of every slice
that is up agrees on one epoch and leaves with its identity renumbered for it; a slice whose
heartbeats stopped is dropped after shrinkAfter; two slices that each believe the other lost never
both train; a returned slice is taken in at a checkpoint once growAfter has passed."""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import pytest

from training import heartbeats, membership, membership_gate
from training.checkpoint import completion
from training.cluster import ClusterIdentity
from training.config import TrainConfig
from training.run_dir import RunDir

CONFIG = TrainConfig.model_validate({"parallelism": {"dcn": {"data": 2}}, "min_slices": 1})


@pytest.fixture(autouse=True)
def fast_heartbeats(monkeypatch):
    monkeypatch.setenv(heartbeats.INTERVAL_ENV, "0.2")  # stale after 0.6 s


class Stopped(Exception):
    """Raised in a waiting join once the test has seen enough."""


@pytest.fixture
def stop(monkeypatch):
    """An event that ends every join still waiting (its next sleep raises :class:`Stopped`)."""
    event = threading.Event()

    def sleep(seconds: float) -> None:
        if event.wait(seconds):
            raise Stopped

    monkeypatch.setattr(membership_gate.time, "sleep", sleep)
    yield event
    event.set()


def identity(slice_id: int, worker: int, *, workers: int = 1, slices: int = 2) -> ClusterIdentity:
    return ClusterIdentity(
        worker=worker,
        workers_per_slice=workers,
        slice_id=slice_id,
        num_slices=slices,
        coordinator_address="10.0.0.0:8482",
        host=f"10.0.{slice_id}.{worker}",
    )


def start(run_dir: RunDir, who: ClusterIdentity, **timings: float) -> tuple[ClusterIdentity, membership.Membership]:
    beat = heartbeats.Heartbeat(run_dir, who.slice_id, who.worker, who.workers_per_slice, who.host)
    beat.start()
    try:
        return membership_gate.join(
            CONFIG,
            run_dir,
            who,
            beat,
            shrink_after_s=timings.get("shrink", 60.0),
            grow_after_s=timings.get("grow", 3600.0),
            poll_s=0.05,
        )
    finally:
        beat.stop()


def old_heartbeat(run_dir: RunDir, slice_id: int, worker: int = 0, *, age_s: float = 100.0) -> None:
    beat = heartbeats.Beat(slice_id, worker, 1, f"10.0.{slice_id}.{worker}", time.time() - age_s)
    run_dir.write(heartbeats.name(slice_id, worker), beat.to_json())


def test_every_slice_up_joins_epoch_zero_as_allocated(tmp_path, stop):
    run_dir = RunDir(str(tmp_path / "run"))
    everyone = [identity(s, w, workers=2) for s in range(2) for w in range(2)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda who: start(run_dir, who), everyone))
    for who, (job, record) in zip(everyone, results, strict=True):
        assert record.epoch == 0 and record.slices == (0, 1)
        assert (job.slice_id, job.num_slices, job.worker) == (who.slice_id, 2, who.worker)
        assert job.coordinator_address == "10.0.0.0:8482"  # slice 0 worker 0's host, the port kept
    assert [m.epoch for m in membership.history(run_dir)] == [0]


def test_a_slice_whose_heartbeats_stopped_is_dropped_after_shrink_after(tmp_path, stop):
    run_dir = RunDir(str(tmp_path / "run"))
    membership.propose(run_dir, None, (0, 1), step=None, reason="the run's start", now=time.time())
    old_heartbeat(run_dir, 1, age_s=0.0)  # seen a moment ago, then gone
    run_dir.write("checkpoints/40/marker", b"")  # the newest checkpoint the record names
    began = time.monotonic()
    job, record = start(run_dir, identity(0, 0), shrink=1.5)
    assert time.monotonic() - began >= 1.4  # it waited shrinkAfter from slice 1's last heartbeat
    assert record.epoch == 1 and record.slices == (0,) and record.step == 40
    assert record.reason == "slice 1 lost, not back within 1.5s"
    assert (job.slice_id, job.num_slices, job.coordinator_address) == (0, 1, "10.0.0.0:8482")
    assert membership.describe_changes(membership.history(run_dir)) == [
        "slices 2 → 1 at step 40 (slice 1 lost, not back within 1.5s)"
    ]


def test_without_slice_0_slice_1_leads_the_job(tmp_path, stop, monkeypatch):
    run_dir = RunDir(str(tmp_path / "run"))
    old_heartbeat(run_dir, 0)
    monkeypatch.setenv("MEGASCALE_COORDINATOR_ADDRESS", "10.0.0.0:8080")
    job, record = start(run_dir, identity(1, 0), shrink=0.5)
    assert record.slices == (1,)
    assert (job.slice_id, job.num_slices, job.coordinator_address) == (0, 1, "10.0.1.0:8482")
    membership_gate.set_megascale_environment(job, "10.0.0.0:8080")
    assert (os.environ["MEGASCALE_NUM_SLICES"], os.environ["MEGASCALE_SLICE_ID"]) == ("1", "0")
    assert os.environ["MEGASCALE_COORDINATOR_ADDRESS"] == "10.0.1.0:8080"


def test_two_slices_that_each_believe_the_other_lost_never_both_train(tmp_path, stop, monkeypatch):
    """Each slice sees only its own heartbeats (a partition): both propose themselves alone after
    epoch 0; the record lets exactly one of them train, and the other stands by."""
    run_dir = RunDir(str(tmp_path / "run"))
    membership.propose(run_dir, None, (0, 1), step=None, reason="the run's start", now=time.time() - 100)
    monkeypatch.setattr(membership_gate, "FIRST_START_WAIT_S", 0.0)  # neither slice has seen the other
    seen_by = threading.local()
    read_all = heartbeats.read_all
    monkeypatch.setattr(
        membership_gate.heartbeats,
        "read_all",
        lambda rd, *args, **kwargs: [b for b in read_all(rd, *args, **kwargs) if b.slice_id == seen_by.slice_id],
    )

    def partitioned(who: ClusterIdentity):
        seen_by.slice_id = who.slice_id
        try:
            return start(run_dir, who, shrink=0.3)
        except Stopped:
            return None

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(partitioned, identity(s, 0)) for s in range(2)]
        done, _ = wait(futures, timeout=60, return_when=FIRST_COMPLETED)
        assert len(done) == 1, "neither slice trained within 60 s"
        time.sleep(2.0)  # the other slice keeps waiting: standby, never a second job
        assert sum(f.done() for f in futures) == 1
        stop.set()
        results = [f.result(timeout=10) for f in futures]
    (trained,) = [r for r in results if r is not None]
    job, record = trained
    assert record.epoch == 1 and len(record.slices) == 1 and job.num_slices == 1
    assert [m.epoch for m in membership.history(run_dir)] == [0, 1]  # one decision, read by both


def test_a_returned_slice_is_taken_in_once_grow_after_has_passed(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    start_record, _ = membership.propose(run_dir, None, (0, 1), step=None, reason="start", now=time.time() - 60)
    shrunk, _ = membership.propose(run_dir, start_record, (0,), step=40, reason="slice 1 lost", now=time.time() - 30)
    for s in (0, 1):
        old_heartbeat(run_dir, s, age_s=0.0)
    assert membership_gate.grow_to(CONFIG, run_dir, shrunk, step=80, shrink_after_s=10, grow_after_s=3600) is None
    grown = membership_gate.grow_to(CONFIG, run_dir, shrunk, step=80, shrink_after_s=10, grow_after_s=20)
    assert grown is not None and grown.epoch == 2 and grown.slices == (0, 1) and grown.step == 80
    assert grown.reason == "slice 1 back, 20s after the last change"
    # Asked again from the old epoch (another process of the job): the newer epoch, not a second one.
    assert membership_gate.grow_to(CONFIG, run_dir, shrunk, step=80, shrink_after_s=10, grow_after_s=20) == grown
    changes = membership.describe_changes(membership.history(run_dir))
    assert changes[-1] == f"slices 1 → 2 at step 80 ({grown.reason})"


def test_a_slice_not_back_is_not_taken_in(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    shrunk, _ = membership.propose(run_dir, None, (0,), step=40, reason="slice 1 lost", now=time.time() - 30)
    old_heartbeat(run_dir, 0, age_s=0.0)
    old_heartbeat(run_dir, 1, age_s=100.0)  # stale: still gone
    assert membership_gate.grow_to(CONFIG, run_dir, shrunk, step=80, shrink_after_s=10, grow_after_s=1) is None


@pytest.mark.parametrize(
    ("dcn", "expected"), [({"data": 2}, [2, 1]), ({"data": 4}, [4, 2, 1]), ({"data": 1, "fsdp": 2}, [2])]
)
def test_counts_are_those_the_trainer_can_train_on(dcn, expected):
    config = TrainConfig.model_validate({"parallelism": {"dcn": dcn}, "min_slices": 1})
    assert membership_gate.counts(config) == expected


def test_a_damaged_heartbeat_says_nothing_about_its_slice(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.write(heartbeats.name(0, 0), b"{not json")
    run_dir.write(heartbeats.name(1, 0), heartbeats.Beat(0, 0, 1, "h", time.time()).to_json())  # names another
    old_heartbeat(run_dir, 2, age_s=0.0)
    assert [b.slice_id for b in heartbeats.read_all(run_dir)] == [2]


def test_a_standby_slice_leaves_the_gate_once_the_run_is_complete(tmp_path, stop):
    """Slice 1 came back while slice 0 alone finished the run: it stands by, then leaves when the
    completion marker appears (its trainer exits 0), instead of waiting for an epoch forever."""
    run_dir = RunDir(str(tmp_path / "run"))
    membership.propose(run_dir, None, (0,), step=40, reason="slice 1 lost", now=time.time())
    old_heartbeat(run_dir, 0, age_s=0.0)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(start, run_dir, identity(1, 0), grow=3600.0)
        try:
            deadline = time.monotonic() + 60
            while run_dir.read(heartbeats.name(1, 0)) is None and time.monotonic() < deadline:
                time.sleep(0.05)  # slice 1 is in the gate (its heartbeat is written)
            assert not waiting.done()
            completion.write_completion(run_dir, {"step": CONFIG.steps, "loss": 2.5})
            with pytest.raises(membership_gate.RunComplete) as complete:
                waiting.result(timeout=60)
        finally:
            stop.set()  # a join still waiting (the test failed) ends at its next sleep
    assert complete.value.record == {"step": CONFIG.steps, "loss": 2.5}
    assert [m.epoch for m in membership.history(run_dir)] == [0]  # no change on the way out


def test_no_change_is_proposed_once_the_final_checkpoint_is_saved(tmp_path, stop):
    """A returning slice that finds the final checkpoint saved (the marker not yet written) neither
    declares the finished slice lost nor takes itself in: it waits for the marker."""
    run_dir = RunDir(str(tmp_path / "run"))
    membership.propose(run_dir, None, (0,), step=40, reason="slice 1 lost", now=time.time() - 100)
    old_heartbeat(run_dir, 0, age_s=0.0)  # slice 0 saved the final checkpoint a moment ago, then stopped beating
    run_dir.write(f"checkpoints/{CONFIG.steps}/marker", b"")
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(start, run_dir, identity(1, 0), shrink=0.1, grow=0.1)
        try:
            time.sleep(1.0)  # many looks (poll 0.05 s), each of which would have proposed a change
            assert [m.epoch for m in membership.history(run_dir)] == [0] and not waiting.done()
            completion.write_completion(run_dir, {"step": CONFIG.steps, "loss": 2.5})
            with pytest.raises(membership_gate.RunComplete):
                waiting.result(timeout=60)
        finally:
            stop.set()
    assert [m.epoch for m in membership.history(run_dir)] == [0]


def test_no_grow_is_asked_at_the_final_checkpoint(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    shrunk, _ = membership.propose(run_dir, None, (0,), step=40, reason="slice 1 lost", now=time.time() - 30)
    for s in (0, 1):
        old_heartbeat(run_dir, s, age_s=0.0)
    final = CONFIG.steps
    assert membership_gate.grow_to(CONFIG, run_dir, shrunk, step=final, shrink_after_s=10, grow_after_s=1) is None
    assert membership_gate.grow_to(CONFIG, run_dir, shrunk, step=final - 1, shrink_after_s=10, grow_after_s=1)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"slice_id": 7}, "slice 7 is not an integer in [0, 2)"),
        ({"time": 10.0**12}, "ahead of this clock"),
        ({"time": float("inf")}, "time inf is not a time"),
        ({"time": float("nan")}, "time nan is not a time"),
        ({"host": "10.0.0.1 --evil"}, "is not a host name or address"),
        ({"host": "http://x:1/"}, "is not a host name or address"),
        ({"host": ["10.0.0.1"]}, "is not a host name or address"),
        ({"worker": 3}, "worker 3 is not an integer in [0, 1)"),
        ({"workers": 2}, "2 workers per slice, not the run's 1"),
        ({"ready": -1}, "ready -1"),
        ({"slice_id": 1.0}, "slice 1.0"),
    ],
)
def test_a_tampered_heartbeat_says_nothing_about_its_slice(tmp_path, caplog, change, why):
    run_dir = RunDir(str(tmp_path / "run"))
    old_heartbeat(run_dir, 0, age_s=0.0)
    record = {"slice_id": 1, "worker": 0, "workers": 1, "host": "10.0.1.0", "time": time.time(), "ready": None}
    slice_id = change.get("slice_id", 1) if isinstance(change.get("slice_id", 1), int) else 1
    run_dir.write(heartbeats.name(slice_id, 0), json.dumps(record | change).encode())
    beats = heartbeats.read_all(run_dir, num_slices=2, workers_per_slice=1)
    assert [b.slice_id for b in beats] == [0]
    assert why in caplog.text


def test_a_stray_heartbeat_never_makes_a_grow_propose_a_slice_the_run_lacks(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    shrunk, _ = membership.propose(run_dir, None, (0,), step=40, reason="slice 1 lost", now=time.time() - 30)
    old_heartbeat(run_dir, 0, age_s=0.0)
    old_heartbeat(run_dir, 7, age_s=0.0)  # no slice 7 in a run of 2
    assert membership_gate.grow_to(CONFIG, run_dir, shrunk, step=80, shrink_after_s=10, grow_after_s=1) is None


def test_a_huge_or_deep_heartbeat_is_left_out(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.write(heartbeats.name(0, 0), b"[" * 200_000)
    run_dir.write(heartbeats.name(1, 0), b'{"host": "' + b"x" * 50_000 + b'"}')
    assert heartbeats.read_all(run_dir, num_slices=2) == []


def test_a_slice_late_at_the_first_start_is_waited_for(tmp_path, stop, monkeypatch):
    """Slice 1 has not booted yet (no heartbeat ever): slice 0 waits FIRST_START_WAIT_S, not only
    shrinkAfter, before it starts the run alone."""
    monkeypatch.setattr(membership_gate, "FIRST_START_WAIT_S", 2.0)
    run_dir = RunDir(str(tmp_path / "run"))
    began = time.monotonic()
    job, record = start(run_dir, identity(0, 0), shrink=0.2)
    assert time.monotonic() - began >= 1.9  # the first-start wait, well past shrinkAfter
    assert record.epoch == 1 and record.slices == (0,) and record.step is None
    assert job.num_slices == 1


def test_a_slice_seen_then_lost_at_the_first_start_is_not_waited_for_longer(tmp_path, stop, monkeypatch):
    monkeypatch.setattr(membership_gate, "FIRST_START_WAIT_S", 3600.0)
    run_dir = RunDir(str(tmp_path / "run"))
    membership.propose(run_dir, None, (0, 1), step=None, reason="the run's start", now=time.time())
    old_heartbeat(run_dir, 1, age_s=0.0)  # it booted, then went away: lost, as before
    job, record = start(run_dir, identity(0, 0), shrink=0.5)
    assert record.slices == (0,) and job.num_slices == 1


def test_a_slice_late_at_the_first_start_is_taken_in_at_the_first_checkpoint(tmp_path):
    """The run started without it (epoch 1, before any checkpoint): growAfter (an hour here) is not
    waited for; the next checkpoint takes it in."""
    run_dir = RunDir(str(tmp_path / "run"))
    first, _ = membership.propose(run_dir, None, (0, 1), step=None, reason="start", now=time.time() - 20)
    alone, _ = membership.propose(run_dir, first, (0,), step=None, reason="slice 1 late", now=time.time() - 10)
    for s in (0, 1):
        old_heartbeat(run_dir, s, age_s=0.0)
    grown = membership_gate.grow_to(CONFIG, run_dir, alone, step=20, shrink_after_s=10, grow_after_s=3600)
    assert grown is not None and grown.slices == (0, 1) and grown.step == 20
    # Lost after a checkpoint: growAfter holds as before.
    later, _ = membership.propose(run_dir, grown, (0,), step=40, reason="slice 1 lost", now=time.time())
    assert membership_gate.grow_to(CONFIG, run_dir, later, step=60, shrink_after_s=10, grow_after_s=3600) is None


def test_a_grow_proposed_at_the_last_call_is_joined_in_the_same_start(tmp_path, stop, monkeypatch):
    """Slice 0 alone is ready for epoch 1 when slice 1's proposal (epoch 2: both) lands: within the
    last call, slice 0 reads it and starts as a job of both, not alone (one restart saved). The window
    stays open until the test closes it, so no timing of the machine decides the outcome."""
    monkeypatch.setattr(membership_gate, "LAST_CALL_S", 3600.0)
    run_dir = RunDir(str(tmp_path / "run"))
    first, _ = membership.propose(run_dir, None, (0, 1), step=None, reason="start", now=time.time() - 60)
    alone, _ = membership.propose(run_dir, first, (0,), step=40, reason="slice 1 lost", now=time.time() - 30)
    newcomer = heartbeats.Heartbeat(run_dir, 1, 0, 1, "10.0.1.0")
    with ThreadPoolExecutor(1) as pool:
        joining = pool.submit(start, run_dir, identity(0, 0))
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # slice 0 is ready for epoch 1
                beat = run_dir.read(heartbeats.name(0, 0))
                if beat is not None and json.loads(beat).get("ready") == alone.epoch:
                    break
                time.sleep(0.05)
            assert not joining.done()
            grown, _ = membership.propose(run_dir, alone, (0, 1), step=40, reason="slice 1 back", now=time.time())
            newcomer.ready = grown.epoch
            newcomer.start()
            monkeypatch.setattr(membership_gate, "LAST_CALL_S", 0.0)
            job, record = joining.result(timeout=120)
        finally:
            newcomer.stop()
            stop.set()
    assert record == grown and job.num_slices == 2

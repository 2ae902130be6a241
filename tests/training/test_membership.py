"""The run's membership record (training/membership.py): each change is the next epoch, created
only if absent, so of writers racing from one epoch exactly one decides; on a local run directory
and on the emulated Cloud Storage (its 412 on ``ifGenerationMatch=0``: tests/emulated/test_gcs_preconditions.py)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from training import membership
from training.membership import Membership, MembershipError
from training.run_dir import RunDir


@pytest.fixture(params=["local", "gs"])
def run_dir(request, tmp_path) -> RunDir:
    if request.param == "local":
        return RunDir(str(tmp_path / "run"))
    bucket = request.getfixturevalue("bucket")
    return RunDir(f"gs://{bucket}/runs/membership")


def test_create_writes_once_and_keeps_the_first_writers_bytes(run_dir):
    assert run_dir.create("marker", b"first") is True
    assert run_dir.create("marker", b"second") is False
    assert run_dir.read("marker") == b"first"


def test_the_first_epoch_then_a_change(run_dir):
    assert membership.current(run_dir) is None
    start, won = membership.propose(run_dir, None, (1, 0), step=None, reason="start", now=10.0)
    assert won and start == Membership(0, (0, 1), None, "start", 10.0)
    assert membership.current(run_dir) == start
    shrunk, won = membership.propose(run_dir, start, (0,), step=50, reason="slice 1 preempted", now=20.0)
    assert won and shrunk.epoch == 1 and membership.current(run_dir) == shrunk


def test_of_slices_that_each_believe_the_others_lost_exactly_one_decides(run_dir):
    start, _ = membership.propose(run_dir, None, (0, 1, 2, 3), step=None, reason="start", now=1.0)

    def alone(slice_id: int) -> tuple[Membership, bool]:
        return membership.propose(run_dir, start, (slice_id,), step=40, reason=f"slice {slice_id} alone", now=2.0)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(alone, range(4)))
    assert [won for _, won in results].count(True) == 1, results
    (decided,) = {m for m, _ in results}  # every writer now holds the same membership
    assert decided.epoch == 1 and len(decided.slices) == 1
    assert membership.current(run_dir) == decided
    assert [name for name in run_dir.list("membership/*") if not name.endswith(".json")] == []


@pytest.mark.parametrize(
    "damage",
    [b"{not json", b'{"epoch": 0}', b'{"epoch": 3, "slices": [0], "step": null, "reason": "", "time": 1}', b"\xff"],
)
def test_a_record_this_trainer_did_not_write_is_named_and_written_past(tmp_path, damage, caplog):
    """Logged, never a decision taken from it: no record is current, and the next writer's epoch is
    the one after it (every writer skips it alike)."""
    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.write("membership/00000000.json", damage)
    with pytest.raises(MembershipError, match=r"^membership record membership/00000000\.json "):
        membership.read(run_dir, 0)
    assert membership.current(run_dir) is None
    assert "membership record membership/00000000.json is not one this trainer wrote" in caplog.text
    made, mine = membership.propose(run_dir, None, (0, 1), step=None, reason="the run's start", now=1.0)
    assert mine and made.epoch == 1 and membership.current(run_dir) == made
    assert membership.history(run_dir) == [made]


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"slices": [0, 7]}, "slice 7 is not an integer in [0, 2)"),
        ({"slices": [0, 0]}, "repeat an id"),
        ({"slices": [0, True]}, "slice True"),
        ({"slices": []}, "slices is not a list"),
        ({"step": -5}, "step -5"),
        ({"step": 1.5}, "step 1.5"),
        ({"time": float("inf")}, "time inf"),
        ({"time": float("nan")}, "time nan"),
        ({"time": 10.0**12}, "ahead of this clock"),
        ({"reason": "x" * 5000}, "reason is not text"),
        ({"reason": ["nested"]}, "reason is not text"),
        ({"epoch": 2}, "names epoch 2"),
    ],
)
def test_a_tampered_record_is_left_out(tmp_path, caplog, record, why):
    run_dir = RunDir(str(tmp_path / "run"))
    good, _ = membership.propose(run_dir, None, (0, 1), step=None, reason="start", now=100.0)
    tampered = {"epoch": 1, "slices": [0], "step": 40, "reason": "slice 1 lost", "time": 200.0} | record
    run_dir.write("membership/00000001.json", json.dumps(tampered, allow_nan=True).encode())
    assert membership.current(run_dir, num_slices=2) == good
    assert why in caplog.text


def test_a_huge_record_is_refused_before_it_is_parsed(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    run_dir.write("membership/00000000.json", b'{"reason": "' + b"x" * 50_000_000 + b'"}')
    with pytest.raises(MembershipError, match="over 65,536"):
        membership.read(run_dir, 0)


def test_an_epoch_past_eight_digits_is_read(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    record = membership.Membership(100_000_000, (0,), 40, "far", 1.0)
    run_dir.write("membership/100000000.json", record.to_json())
    assert membership.current(run_dir) == record


def test_the_history_says_each_change_of_count_with_its_step_and_reason(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    start, _ = membership.propose(run_dir, None, (0, 1), step=None, reason="start", now=1.0)
    shrunk, _ = membership.propose(run_dir, start, (0,), step=50, reason="slice 1 lost, not back within 2m", now=2.0)
    membership.propose(run_dir, shrunk, (0, 1), step=90, reason="slice 1 back, 3h after the last change", now=3.0)
    records = membership.history(run_dir)
    assert [r.epoch for r in records] == [0, 1, 2]
    assert membership.describe_changes(records) == [
        "slices 2 → 1 at step 50 (slice 1 lost, not back within 2m)",
        "slices 1 → 2 at step 90 (slice 1 back, 3h after the last change)",
    ]
    assert membership.describe_changes(records[:1]) == []


def test_a_listing_leaves_no_cached_listing_behind(bucket):
    """RunDir.list asks the server, and must not leave gcsfs' cache of the listing behind: Orbax
    lists checkpoints through the same filesystem, and a restore that answered from a listing the
    elastic gate made before another slice saved a newer step would resume from an older one."""
    import gcsfs
    from etils import epath

    run_dir = RunDir(f"gs://{bucket}/runs/cache")
    run_dir.write("checkpoints/40/marker", b"")
    assert run_dir.list("checkpoints/*") == ["checkpoints/40"]
    other = gcsfs.GCSFileSystem(skip_instance_cache=True)  # another process's client
    other.pipe_file(f"{bucket}/runs/cache/checkpoints/80/marker", b"")
    assert sorted(p.name for p in epath.Path(f"gs://{bucket}/runs/cache/checkpoints").iterdir()) == ["40", "80"]


def test_a_change_is_shown_at_the_step_it_took_effect_or_as_not_carried_out(tmp_path):
    run_dir = RunDir(str(tmp_path / "run"))
    start, _ = membership.propose(run_dir, None, (0, 1), step=None, reason="start", now=1.0)
    shrunk, _ = membership.propose(run_dir, start, (0,), step=50, reason="slice 1 lost", now=2.0)
    grown, _ = membership.propose(run_dir, shrunk, (0, 1), step=90, reason="slice 1 back", now=3.0)
    records = membership.history(run_dir)
    # The job of epoch 1 resumed from 50; epoch 2 was decided after the checkpoint of step 90 by a standby
    # slice while the job trained on, which stopped for it at its next checkpoint, 96.
    events = [
        {"event": "start", "step": 0, "membership_epoch": 0},
        {"event": "preempted", "step": 50},  # a notice: no epoch named
        {"event": "start", "step": 50, "membership_epoch": 1},
        {"event": "preempted", "step": 96, "membership_epoch": 2},
        {"event": "start", "step": 96, "membership_epoch": 2},
    ]
    landed = membership.landing_steps(events)
    assert landed == {0: 0, 1: 50, 2: 96}
    assert membership.describe_changes(records, landed) == [
        "slices 2 → 1 at step 50 (slice 1 lost)",
        "slices 1 → 2 at step 96 (slice 1 back)",
    ]
    # The run completed in epoch 1 before any job took epoch 2 over: the grow never happened.
    assert membership.describe_changes(records, membership.landing_steps(events[:3])) == [
        "slices 2 → 1 at step 50 (slice 1 lost)",
        "slices 1 → 2 decided after step 90, not carried out (slice 1 back)",
    ]
    # Events that name no epoch (a run that is not elastic): the records' own steps.
    assert membership.landing_steps([{"event": "start", "step": 0}]) is None
    assert membership.describe_changes(records, None)[1] == "slices 1 → 2 at step 90 (slice 1 back)"
    assert grown.epoch == 2

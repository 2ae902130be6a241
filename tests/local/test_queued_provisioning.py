"""All slices or none in ``multislice local up`` (a gke stack with ``multislice:gke.queuedProvisioning``), beside
the same stack without it, when a fault strikes slice 1 and its capacity is withheld (``--withhold``):

* JobSet recreates every Job. Without queued provisioning slice 0's new Pods start at once on its nodes and
  hold them without training until slice 1's Pods start on new nodes and join them: the summary counts those
  slice-seconds (``idle_capacity_slice_seconds``, infra/local/idle_capacity.py);
* with it no Pod starts, and no slice holds capacity, before every slice has capacity; then every Pod starts.

The Pods run a stand-in for the startup script (tests/helpers/standin_vms.py); one emulation with the trainer
(a minute or two on 2 cores) shows a queued run completing after the withheld slice returned, none of its Pods
started before."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.config import load_stack_file
from infra.local.emulated_stack import Options
from infra.local.faults import Fault
from infra.local.idle_capacity import IdleCapacity
from infra.local.withholds import Withhold
from tests.helpers.emulation import gke_stack, processes_under, run_cli
from tests.helpers.standin_vms import booted, running

#: The gke emu stack on flex-start capacity, which GKE takes no TPU v4 on: v5p-16 (2 VMs of 4 chips, the
#: same 2 × 2 × 4-device job as v4-16) in a v5p zone.
ON_FLEX_START = (
    ("  multislice:capacity: spot\n", "  multislice:capacity: flex-start\n"),
    ("multislice:acceleratorType: v4-16", "multislice:acceleratorType: v5p-16"),
    ("gcp:zone: us-central2-b", "gcp:zone: us-east5-a"),
)
QUEUED = "  multislice:gke: {queuedProvisioning: true}\n"
#: Steps of the emulation with the trainer: those of tests/local/test_gke_emulation.py, whose 2 × 2 × 4-device
#: mesh and model these are too (the compiled programs come from the session's compilation cache).
STEPS = 16


def flex_start_stack(tmp_path: Path, *, queued: bool, steps: int | None = None) -> Path:
    path = gke_stack(tmp_path, steps=steps)
    text = path.read_text()
    for old, new in ON_FLEX_START:
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text + (QUEUED if queued else ""))
    return path


def boots(pods) -> list[tuple[int, int, bool]]:
    """(slice, boots, running) of every Pod."""
    return [(vm.slice_id, vm.boots, running(vm.pgid)) for vm in pods.vms]


#: Slice 1 struck, its capacity back at the emulator's next look (the tests release it themselves).
WITHHELD = Options(withhold={1: Withhold(seconds=0.0)}, reboot_grace_s=5, preempt_grace_s=5, reset_grace_s=5)


def test_with_queued_provisioning_no_pod_starts_before_every_slice_has_capacity(tmp_path):
    with booted(flex_start_stack(tmp_path, queued=True), tmp_path) as pods:
        assert pods.repairs.inject(Fault("kill", 1, 5), WITHHELD, observed_step=5)
        assert boots(pods) == [(0, 1, False), (0, 1, False), (1, 1, False), (1, 1, False)]
        assert pods.lines[-1] == (
            "capacity: every slice or none (queued provisioning): no Pod starts until slice 1 has capacity too; the "
            "other slices hold none meanwhile"
        )
        assert pods.repairs.running() == []  # nothing the emulator expects to run (nor a completed run)
        pods.repairs.reset(WITHHELD)  # a reset meanwhile starts nothing either
        assert [b for _, b, _ in boots(pods)] == [1, 1, 1, 1]
        assert pods.repairs.release_withheld(WITHHELD)
        assert pods.lines[-2:] == [
            "capacity: slice 1's capacity is back",
            "repair: every slice has capacity: every Pod starts (queued provisioning)",
        ]
        assert boots(pods) == [(0, 2, True), (0, 2, True), (1, 2, True), (1, 2, True)]  # all at once, once
        assert pods.repairs.summary()["idle_capacity_slice_seconds"] == 0.0


def test_without_it_the_other_slice_starts_at_once_and_holds_its_nodes(tmp_path):
    with booted(flex_start_stack(tmp_path, queued=False), tmp_path) as pods:
        assert pods.repairs.inject(Fault("kill", 1, 5), WITHHELD, observed_step=5)
        assert boots(pods) == [(0, 2, True), (0, 2, True), (1, 1, False), (1, 1, False)]
        assert pods.lines[-1] == (
            "repair: JobSet recreates every Job: slice(s) 0 start again on their nodes and hold them without "
            "training until slice 1 has capacity"
        )
        assert pods.repairs.release_withheld(WITHHELD)
        assert pods.lines[-1] == "repair: slice 1's Pods start on new nodes; the waiting slices take them in"
        assert boots(pods) == [(0, 2, True), (0, 2, True), (1, 2, True), (1, 2, True)]  # slice 0 not restarted
        assert "idle_capacity_slice_seconds" in pods.repairs.summary()


def stack_like(slices: int, *, min_slices: int | None = None, supervisor: str = "container") -> SimpleNamespace:
    return SimpleNamespace(
        slices=slices,
        elastic=SimpleNamespace(min_slices=min_slices),
        backend_spec=SimpleNamespace(supervisor=supervisor),
    )


@pytest.mark.parametrize(
    ("stack", "all_or_none", "held"),
    [
        (stack_like(2), False, 30.0),  # slice 0 waits the 30 s slice 1 has none
        (stack_like(4), False, 90.0),  # three slices wait
        (stack_like(2), True, 0.0),  # queued provisioning: none holds anything
        (stack_like(2, min_slices=1, supervisor="systemd"), False, 0.0),  # elastic: slice 0 trains on
        (stack_like(2, min_slices=1), False, 30.0),  # elastic, but not carried out in a container (gke)
    ],
    ids=["2 slices", "4 slices", "all slices or none", "elastic", "elastic on gke"],
)
def test_idle_capacity_counts_the_slices_that_wait_holding_theirs(stack, all_or_none, held):
    now = [100.0]
    idle = IdleCapacity(stack, SimpleNamespace(all_slices_or_none=all_or_none), clock=lambda: now[0])
    assert (idle.seconds, idle.counted) == (0.0, False)
    idle.withheld({1})
    now[0] += 30
    assert idle.seconds == held
    idle.withheld(set())
    now[0] += 100  # every slice back: nothing more counts
    assert (idle.seconds, idle.counted) == (held, True)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_queued_run_starts_no_pod_before_the_withheld_slice_is_back_and_completes(tmp_path):
    stack = flex_start_stack(tmp_path, queued=True, steps=STEPS)
    config = load_stack_file(stack)
    assert (config.backend, config.capacity, config.gke.queued_provisioning) == ("gke", "flex-start", True)
    summary_path = tmp_path / "summary.json"
    args = ["--kill", "1@4", "--withhold", "1:10s", "--summary-json", str(summary_path)]
    result = run_cli(["local", "up", "--config-file", str(stack), *args], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert processes_under(tmp_path) == []
    out = result.stdout
    order = [
        "fault: kill slice 1 at step 4",
        "capacity: every slice or none (queued provisioning): no Pod starts until slice 1 has capacity too",
        "capacity: slice 1's capacity is back",
        "repair: every slice has capacity: every Pod starts (queued provisioning)",
    ]
    at = [out.index(line) for line in order]
    assert at == sorted(at), out
    # No trainer of the run started between the fault and the capacity's return (the lines shown: slice 0 worker 0).
    assert "trainer: starting" not in out[at[0] : at[2]], out
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] is True and summary["steps_completed"] == STEPS
    assert (summary["restarts"], summary["unplanned_restarts"], summary["idle_capacity_slice_seconds"]) == (1, [], 0.0)
    for slice_id in range(2):
        for worker in range(2):
            log = (tmp_path / config.stack / "logs" / f"slice-{slice_id}-worker-{worker}.log").read_text()
            assert len(re.findall(r"^===== boot \d+ of ", log, re.M)) == 2, log[-2000:]  # the first, and once back

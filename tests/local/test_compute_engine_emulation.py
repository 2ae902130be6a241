"""`multislice local up` of a ``multislice:backend: compute-engine`` stack: the emu stack as 2 slices
× 2 VMs × 4 CPU devices (v5p-16) on managed instance groups. Its VMs have none of Cloud TPU's identity keys;
each one's boot.sh asks the emulated Compute API (infra.backends.compute_engine.emulated_api) for its group and slice
0's, and gives the trainer the identity in the environment. The trainer runs as 4 processes. A
killed slice stays down, as a preempted Spot slice that neither its group nor Compute Engine
recovers, until a VM of the other slice's slice watch resizes its group to 0 and back; then training resumes from
the last checkpoint. A release written to the bucket mid-run is booted in place by every VM's
release watch, and the run resumes from the checkpoint saved at the agreed step, to completion.

Two short emulations (one to two minutes each on 2 cores)."""

from __future__ import annotations

import json
import re

import pytest

from infra import startup
from infra.config import load_stack_file
from infra.emulated import gcs
from tests.helpers.emulation import (
    COMMAND_STACK,
    ON_COMPUTE_ENGINE,
    BackgroundCli,
    compute_engine_stack,
    processes_under,
    run_cli,
    run_records,
)

#: The first release's steps (fewer than the emu stack's 24: the run never gets past :data:`SWITCH_AT`
#: with it); the gke emulation's too, which then shares its compiled programs (tests/local/test_gke_emulation.py).
STEPS = 16

#: The step after the repair at which the test writes a new release (the trainers are held there
#: until it did: ``--hold-at``); the new release's steps.
SWITCH_AT = 10
NEW_STEPS = 20


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_compute_engine_stack_is_repaired_whole_switches_release_in_place_and_resumes(tmp_path):
    """Killed at step 6, slice 1 stays down until slice 0's first VM's slice watch resizes its
    group to 0 and back (its 2 VMs recreated together); then training resumes; then, while it trains, a new release is
    written to the bucket as ``pulumi up`` writes it (the same stack with :data:`NEW_STEPS` steps):
    each VM's release watch boots it in place, the trainers save at the agreed step and resume
    from it with the new release, which trains to its own end."""
    stack = compute_engine_stack(tmp_path, steps=STEPS)
    config = load_stack_file(stack)
    assert config.backend == "compute-engine" and config.slices == 2 and config.accelerator.hosts == 2
    assert config.training.steps == STEPS
    first = startup.render(config)
    second = startup.render(
        config.model_copy(update={"training": config.training.model_copy(update={"steps": NEW_STEPS})})
    )
    summary_path = tmp_path / "summary.json"
    args = ["local", "up", "--config-file", str(stack), "--summary-json", str(summary_path), "--kill", "1@6"]
    args += ["--hold-at", str(SWITCH_AT)]  # the trainers wait there: the run cannot end before the switch
    with BackgroundCli(args, tmp_path) as run:
        # After the repair (its restart reported), once the run trains again to step SWITCH_AT.
        run.wait_until(
            lambda: any("repair" in line for line in run.lines) and run.reached(SWITCH_AT, STEPS),
            600,
            f"the repair, then step {SWITCH_AT} of the repaired run",
        )
        storage = next(m[1] for line in run.lines if (m := re.search(r"emulated Cloud Storage at (\S+);", line)))
        for name, data in startup.bucket_objects(config.stack, config.run_dir, second).items():
            gcs.upload(storage, config.bucket_name, name, data)  # pulumi up #2
        # The watches stop the held trainers (a notice: they save at the agreed step) and boot
        # the new release, which resumes past the hold; then the hold is released for good.
        run.wait_until(
            lambda: sum("training resumed from the checkpoint" in line for line in run.lines) >= 2,
            600,
            "the new release to resume training",
        )
        (tmp_path / config.stack / "holds" / str(SWITCH_AT)).touch()
        code = run.finish(600)
    out = run.output()
    assert code == 0, out + run.stderr()
    assert processes_under(tmp_path) == []
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] is True and summary["repairs"] == 1 and summary["capacity"] == "kept"
    assert "deleteOnComplete is not built for the compute-engine backend" in out
    # The struck slice waited for a VM to ask, and was then recreated whole.
    lost, asked, repaired = (
        out.index("repair: slice 1's VMs are down and neither its group nor Compute Engine recreates a Spot slice"),
        out.index(f"repair: a VM asked to recreate group {config.node_ids[1]}'s VMs (instanceGroupManagers.resize"),
        out.index("repair: recreating slice 1, restarting slice(s) 0"),
    )
    assert lost < asked < repaired

    logs = {
        (s, w): (tmp_path / config.stack / "logs" / f"slice-{s}-worker-{w}.log").read_text()
        for s in (0, 1)
        for w in (0, 1)
    }
    # The first VM up outside slice 1 (slice 0's worker 0, first by name) saw it lost on one poll,
    # resized its group to 0 at a later one (past the grace) and back to 2 once it listed none; no
    # other VM asked.
    watch_lines = {key: [line for line in log.splitlines() if "slice watch:" in line] for key, log in logs.items()}
    group_1 = config.node_ids[1]
    assert len(watch_lines[0, 0]) == 3, watch_lines[0, 0]
    assert all(line.startswith(f"[slice 0 worker 0] slice watch: group {group_1}") for line in watch_lines[0, 0])
    assert "lost VM" in watch_lines[0, 0][0] and "(TERMINATED)" in watch_lines[0, 0][0]
    assert f"group {group_1}: resizing it to 0 to recreate all 2 of its VMs together" in watch_lines[0, 0][1]
    assert f"group {group_1} lists no VM: resizing it to its slice's 2 VMs" in watch_lines[0, 0][2]
    assert all(watch_lines[key] == [] for key in ((0, 1), (1, 0), (1, 1))), watch_lines
    for (slice_id, worker), log in logs.items():
        group = config.node_ids[slice_id]
        # Each boot (2: the first, and the one after the repair) found its place from the groups:
        # its own name is a MIG's (<group>-<4 of [a-z0-9]>), its worker by sorted name, slice 0's
        # first host the coordinator; the trainer then ran as one of 4 processes.
        found = re.findall(
            rf"\[slice {slice_id} worker \?\] compute engine: VM ({re.escape(group)}-[a-z0-9]{{4}}) of group "
            rf"{re.escape(group)} in {config.project}/{config.zone}",
            log,
        )
        assert len(found) >= 2 and len(set(found)) == 1, log
        assert f"compute engine: worker {worker} of slice {slice_id} (sorted names)," in log
        assert f"process {2 * slice_id + worker}/4" in log
        assert "agent-worker-number is absent" not in log
    for slice_id in (0, 1):
        log = logs[slice_id, 0]
        # The switch: the watch booted the new release. (The first VM to switch stops its trainer;
        # the job's processes save at the agreed step and exit 75; a VM whose watch had not read
        # the record yet refuses to restart its older trainer, status 76, until it has.)
        prefix = f"[slice {slice_id} worker 0] "
        switch = log.index(
            f"{prefix}release: the record names release {second.release_id[:12]}, not this VM's "
            f"{first.release_id[:12]}: booting it"
        )
        assert f"{prefix}release: running release {second.release_id[:12]} (verified)" in log[switch:]
        assert f"{prefix}release watch: release {second.release_id[:12]}; the record" in log[switch:]
        assert log.rstrip().endswith("multislice-release-watch.service: Deactivated successfully."), log[-2000:]

    events = run_records(tmp_path, "events")
    starts = [e for e in events if e.get("event") == "start"]
    assert [e["processes"] for e in starts][:3] == [4, 4, 4]
    assert {e["slices_by"] for e in starts} == {"slice_index"}  # 2 VMs a slice: the chips' slice_index
    # The kill lands at some step K ≥ 6 (the emulator polls); the second attempt resumed from the
    # newest checkpoint R ≤ K (every 4 steps, so R ≥ 4).
    assert starts[0]["step"] == 0 and starts[1]["restored"]
    assert 4 <= starts[1]["step"] <= summary["fault_steps"][0] and starts[1]["step"] % 4 == 0
    # The new release resumed from the checkpoint its predecessor saved at the agreed step, at
    # or after the step the test saw, and trained to the new release's end.
    assert starts[-1]["restored"] and starts[-1]["step"] >= SWITCH_AT
    assert f"preemption checkpoint saved at step {starts[-1]['step']}" in out
    assert f"training resumed from the checkpoint of step {starts[-1]['step']}" in out
    losses = {r["step"] for r in run_records(tmp_path, "metrics") if "loss" in r}
    assert losses == set(range(1, NEW_STEPS + 1))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_jax_program_s_argumentless_initialize_finds_every_chip_across_the_groups_vms(tmp_path):
    """The emu-command stack (tests/fakes/workload/workload_program.py: ``jax.distributed.initialize()``
    with no arguments, then exit 78 unless ``jax.device_count()`` is every chip of both slices) on
    the compute-engine backend: JAX finds the job from the environment boot.sh gave the unit
    (vm_site's EmulatedGkeTpuCluster, as GkeTpuCluster on a TPU VM)."""
    stack = tmp_path / "stack" / COMMAND_STACK.name
    stack.parent.mkdir()
    text = COMMAND_STACK.read_text()
    text = text.replace(
        "  multislice:capacity: spot\n", "  multislice:capacity: spot\n  multislice:backend: compute-engine\n"
    )
    for old, new in ON_COMPUTE_ENGINE:
        assert old in text
        text = text.replace(old, new)
    text = text.replace("source: ../fakes/workload", f"source: {COMMAND_STACK.parents[1] / 'fakes' / 'workload'}")
    stack.write_text(text)
    config = load_stack_file(stack)
    assert config.backend == "compute-engine" and config.workload is not None
    summary_path = tmp_path / "summary.json"
    result = run_cli(["local", "up", "--config-file", str(stack), "--summary-json", str(summary_path)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert processes_under(tmp_path) == []
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] is True and summary["restarts"] == 0
    logs = "".join((tmp_path / config.stack / "logs" / f"slice-{s}-worker-0.log").read_text() for s in (0, 1))
    assert logs.count("compute engine: worker 0 of slice") == 2
    assert "exited with status 78" not in logs and "trained 24 steps" in logs

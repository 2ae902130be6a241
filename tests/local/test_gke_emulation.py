"""`multislice local up` of a ``multislice:backend: gke`` stack: the emu stack as a JobSet of 2 slices ×
2 Pods × 4 CPU devices (v4-16), each Pod a process whose container runs the stack's startup script with
the environment GKE and the JobSet give it (no systemd), so the trainer finds its place from
``TPU_WORKER_ID``, ``MEGASCALE_SLICE_ID`` and ``MULTISLICE_RUN_DIR``. While the run waits at a step, the
README's day-one commands run on it (``local status`` and its plot, ``logs``, ``exec`` on every Pod, then
``local reset``: every Pod saves the step after the hold and new Pods resume there). A preemption of
slice 1 is the kubelet's SIGTERM to its Pods: every process saves the same agreed step and every
container ends 75, which fails its Job; JobSet then recreates every Job: slice 1's new Pods start on new
nodes (empty disks), slice 0's on their nodes, whose folder (mounted non-executable, as a GKE node's OS
mounts it; the virtualenvs' archives on a TPU node: tests/startup/test_gke_boot.py) they find again; all
resume at that step and complete. A stack's own JAX
program (``multislice:workload``) calling
``jax.distributed.initialize()`` with no arguments finds its job of 4 processes and 16 devices from the
same Pods' environment. Two emulations (one to two minutes each on 2 cores)."""

from __future__ import annotations

import json
import re

import pytest

from infra.config import load_stack_file
from tests.helpers.emulation import COMMAND_STACK, ON_GKE, BackgroundCli, gke_stack, processes_under, run_cli

PODS = [(s, w) for s in range(2) for w in range(2)]

#: Where the preemption is aimed (the trainers wait at that step until it struck).
PREEMPT_AT = 6
#: Where the run waits until the README's day-one commands have run on it.
HOLD_AT = 4  # a step the progress lines report (every 2nd)
#: The run's steps: enough to resume past the preemption and complete (fewer than the emu stack's 24),
#: and those of the compute-engine emulation's first release (tests/local/test_compute_engine_emulation.py),
#: whose model and 2 × 2 × 4-device mesh are these too: the steps are in the compiled train step (its
#: learning-rate schedule), so with the same steps the test that runs second loads the other's programs
#: from the session's compilation cache (tests/compilation_cache.py) instead of compiling them.
STEPS = 16


def operate_the_held_run(stack, config, tmp_path) -> None:
    """The README's day-one commands on the run held at :data:`HOLD_AT`, as a newcomer types them
    on a gke stack: status (and its plot), logs, exec on every Pod, and reset (the JobSet suspended
    and resumed: every Pod saves the agreed step, new Pods resume from it)."""
    args = ["--config-file", str(stack)]
    status = run_cli(["local", "status", *args], tmp_path)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "emulated node pools" in status.stdout and status.stdout.count("2/2 Pods running") == 2, status.stdout
    assert re.search(rf"│ step +│ {HOLD_AT}/{config.training.steps} ", status.stdout), status.stdout
    plot = run_cli(["local", "status", *args, "--plot", str(tmp_path / "run.png")], tmp_path)
    assert plot.returncode == 0 and (tmp_path / "run.png").read_bytes()[:4] == b"\x89PNG", plot.stderr
    logs = run_cli(["local", "logs", *args, "--since", "10m"], tmp_path)
    assert logs.returncode == 0, logs.stderr
    for slice_id, worker in PODS:
        assert f"[slice {slice_id} worker {worker}]" in logs.stdout, logs.stdout[-2000:]
    echoed = run_cli(["local", "exec", *args, "--", 'echo "$TPU_WORKER_ID $MEGASCALE_SLICE_ID"'], tmp_path)
    assert echoed.returncode == 0, echoed.stdout + echoed.stderr
    assert sorted(echoed.stdout.splitlines()) == [f"[slice {s} worker {w}] {w} {s}" for s, w in PODS], echoed.stdout
    reset = run_cli(["local", "reset", *args, "--yes"], tmp_path)  # the JobSet suspended and resumed
    assert reset.returncode == 0, reset.stdout + reset.stderr
    assert all(f"slice {s} worker {w}: booted again" in reset.stdout for s, w in PODS), reset.stdout
    assert "reset: the emulated Pods of stack" in reset.stdout, reset.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_pods_train_save_the_agreed_step_on_a_preemption_and_new_pods_resume(tmp_path):
    stack = gke_stack(tmp_path, steps=STEPS)
    config = load_stack_file(stack)
    assert (config.backend, config.slices, config.workers_per_slice, config.training.steps) == ("gke", 2, 2, STEPS)
    summary_path = tmp_path / "summary.json"
    steps = config.training.steps
    fault = ["--preempt", f"1@{PREEMPT_AT}", "--hold-at", str(HOLD_AT)]
    up = ["local", "up", "--config-file", str(stack), *fault, "--summary-json", str(summary_path)]
    with BackgroundCli(up, tmp_path) as run:
        run.wait_until(lambda: run.reached(HOLD_AT, steps), 600, f"step {HOLD_AT}, where the run is held")
        operate_the_held_run(stack, config, tmp_path)
        (tmp_path / config.stack / "holds" / str(HOLD_AT)).touch()  # acted on: the preemption may come
        code = run.finish(600)
    result = run.output()
    assert code == 0, result + run.stderr()
    assert processes_under(tmp_path) == []
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] is True and summary["steps_completed"] == steps
    # Two restarts (the reset's, the preemption's), and no step lost to either.
    assert (summary["restarts"], summary["steps_lost"], summary["capacity"]) == (2, 0, "kept")
    assert f"capacity: node pools {', '.join(config.node_ids)} kept" in result
    saved: set[tuple[int, ...]] = set()
    for slice_id, worker in PODS:
        log = (tmp_path / config.stack / "logs" / f"slice-{slice_id}-worker-{worker}.log").read_text()
        # Each boot took its place from the Pod's environment: the first Pods, the reset's, the repair's.
        identity = f"gke: worker {worker} of slice {slice_id} (TPU_WORKER_ID, MEGASCALE_SLICE_ID)"
        assert log.count(identity) == 3, log[-3000:]
        notices = [int(step) for step in re.findall(r"stop notice: saved step (\d+)", log)]
        assert len(notices) == 2 and HOLD_AT < notices[0] <= PREEMPT_AT <= notices[1], log[-3000:]
        saved.add(tuple(notices))
        assert (
            log.count(
                "trainer: exited with status 75: it saved a checkpoint after a stop notice "
                "(a preemption, a maintenance event, a stop)"
                " or to change its slice count (elastic)"
            )
            == 2
        )
        for notice in notices:
            assert f"resuming at step {notice}/{steps}: 4 processes" in log
        assert "trainer: exited with status 0: training is complete" in log
        # Every new Pod unpacks the release in its own container (from the ConfigMap's script), as on GKE.
        found = re.findall(r"release [0-9a-f]{12} \((unpacked by this boot|found on this disk)", log)
        assert found == ["unpacked by this boot"] * 3, log[-3000:]
    assert "node cache: each Pod's node folder is " in result
    assert len(saved) == 1, saved  # every process saved the same agreed steps


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stacks_own_jax_program_finds_its_job_from_the_pods_environment(tmp_path):
    """tests/fakes/workload/workload_program.py checks ``jax.device_count()`` against EXPECTED_DEVICES."""
    stack = tmp_path / "stack" / COMMAND_STACK.name
    stack.parent.mkdir()
    text = COMMAND_STACK.read_text()
    for old, new in (*ON_GKE[:2], ("EXPECTED_DEVICES: 8", "EXPECTED_DEVICES: 16")):
        assert old in text, old
        text = text.replace(old, new)
    stack.write_text(
        text.replace("source: ../fakes/workload", f"source: {COMMAND_STACK.parents[1] / 'fakes' / 'workload'}")
    )
    config = load_stack_file(stack)
    assert (config.backend, config.slices, config.workers_per_slice) == ("gke", 2, 2)
    summary_path = tmp_path / "summary.json"
    result = run_cli(["local", "up", "--config-file", str(stack), "--summary-json", str(summary_path)], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert processes_under(tmp_path) == []
    assert json.loads(summary_path.read_text())["complete"] is True
    for slice_id in range(2):
        for worker in range(2):
            log = (tmp_path / config.stack / "logs" / f"slice-{slice_id}-worker-{worker}.log").read_text()
            assert f"gke: worker {worker} of slice {slice_id}" in log and "trained 24 steps" in log, log[-2000:]
            assert f"workload: process {2 * slice_id + worker}/4 starting" in log

"""``multislice local reset`` and ``multislice local exec`` on a real emulation of the tests' emu
stack (2 slices × 1 worker, a checkpoint every 6 steps, 12 steps instead of 24), held at step 8 until the test has
acted (``local up --hold-at 8``: the trainers wait there, so the run cannot end first however slow
the machine): a JAX program run by exec first is refused on every worker (the run holds the chips), the reset
restarts every VM through the emulated TPU API, exec then runs in each emulated VM with its new
boot's metadata server, and the run resumes from its newest checkpoint and completes. One
run (about a minute); run it alone (``-n 0``)."""

from __future__ import annotations

import json
import re

import pytest

from infra.local.repairs import RESET_LINE
from tests.helpers.emulation import STACK, BackgroundCli, processes_under, run_cli, run_records

STEPS = 12
#: The step the trainers wait at until the test releases it (after the reset and the second exec).
HOLD_AT = 8


@pytest.mark.slow
def test_exec_then_reset_of_a_run_in_progress_resumes_it_from_its_last_checkpoint(tmp_path):
    summary_path = tmp_path / "summary.json"
    stack = tmp_path / "stack" / "Pulumi.emu.yaml"
    stack.parent.mkdir()
    stack.write_text(STACK.read_text().replace("    steps: 24", f"    steps: {STEPS}"))
    args = ["local", "up", "--config-file", str(stack), "--summary-json", str(summary_path), "--hold-at", str(HOLD_AT)]
    with BackgroundCli(args, tmp_path) as run:
        run.wait_until(lambda: run.reached(HOLD_AT, STEPS), 300, f"step {HOLD_AT}, where the run is held")
        # A JAX program run by exec while the run holds the chips, as on a TPU VM (libtpu's lock):
        # it fails on each worker at once with libtpu's message, whether it only asks for devices
        # or first tries to join a job, and the run goes on untouched.
        line = "; ".join(
            f'"$MULTISLICE_PYTHON" -c "import jax; {program}"'
            for program in ("print(jax.device_count())", "jax.distributed.initialize(); print(jax.device_count())")
        )
        refused = run_cli(["local", "exec", "--config-file", str(stack), "--", line], tmp_path)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        for worker in ("[slice 0 worker 0]", "[slice 1 worker 0]"):
            found = re.findall(
                rf"^{re.escape(worker)} .*The TPU is already in use by process with pid \d+", refused.stdout, re.M
            )
            assert len(found) == 2, refused.stdout
        reset = run_cli(["local", "reset", "--config-file", str(stack), "--yes"], tmp_path)
        assert reset.returncode == 0, reset.stdout + reset.stderr
        assert "slice 0 worker 0: booted again" in reset.stdout and "slice 1 worker 0: booted again" in reset.stdout
        assert "reset: the emulated VMs of stack emu restarted in" in reset.stdout
        exec_result = run_cli(
            ["local", "exec", "--config-file", str(stack), "--", 'echo "$GCE_METADATA_IP $(basename $PWD)"'], tmp_path
        )
        assert exec_result.returncode == 0, exec_result.stderr
        got = sorted(exec_result.stdout.splitlines())
        assert [line.split(" 127.0.0.1:")[0] for line in got] == ["[slice 0 worker 0]", "[slice 1 worker 0]"]
        assert [line.rsplit(" ", 1)[1] for line in got] == ["slice-0-worker-0", "slice-1-worker-0"]
        (tmp_path / "emu" / "holds" / str(HOLD_AT)).touch()  # acted on: the run may go on to its end
        code = run.finish(300)
    out = run.output()
    assert code == 0, out + run.stderr()
    assert "reset: restarting every VM of the queued resource (ResetQueuedResource)" in out
    summary = json.loads(summary_path.read_text())
    assert summary["complete"] is True and summary["steps_completed"] == STEPS and summary["restarts"] == 1
    # The reset's restart is the only one: nothing the refused programs did restarted the run.
    assert len(summary["restart_causes"]) == 1 and summary["unplanned_restarts"] == []
    starts = [e["step"] for e in run_records(tmp_path, "events") if e["event"] == "start"]
    assert len(starts) == 2 and starts[1] >= 6  # resumed from a checkpoint, not from scratch
    assert f"training resumed from the checkpoint of step {starts[1]}" in out
    # Named as the reset it was, not as a preemption: the trainer records its stop notice as one.
    [cause] = summary["restart_causes"]
    assert cause.startswith("your reset") and cause.endswith(f": resumed at step {starts[1]}"), cause
    assert "checkpoint saved at step" in out and "the preemption checkpoint" not in out, out
    assert "preemption checkpoint saved" not in out, out
    for log in sorted((tmp_path / "emu" / "logs").glob("slice-*-worker-0.log")):
        text = log.read_text()
        notice = text.index("training.preemption: stop notice (")  # the trainer's own line, after ours
        assert 0 <= text.rfind(RESET_LINE, 0, notice), text[-3000:]
    assert processes_under(tmp_path) == []

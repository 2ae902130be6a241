"""docs/compute-engine.md's "Try it on this machine", run exactly as written
(tests/helpers/documented_lines.py; the lines: tests.helpers.readme.bash_lines): a compute-engine
stack in a file of the user's own, planned, emulated with a kill of slice 1 at step 17 (its
one-VM group recreates the VM; training resumes from the newest checkpoint and completes), then
its status and slice 1's lines."""

from __future__ import annotations

import re

import pytest

from infra.config import load_stack_file
from tests.helpers.documented_lines import Lines, shell_env
from tests.helpers.emulation import processes_under
from tests.helpers.readme import bash_lines, page, section

LINES = bash_lines(section(page("compute-engine.md"), "## Try it on this machine"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_compute_engine_example_runs_as_written(tmp_path, monkeypatch):
    copy, backend, plan, up, status, logs = LINES
    env = shell_env(tmp_path)
    run_line = Lines(env)
    for line in (copy, backend):
        done = run_line(line)
        assert done.returncode == 0, done.stderr
    config = load_stack_file(tmp_path / "home" / "Pulumi.ce.yaml")
    assert (config.stack, config.backend, config.slices, config.accelerator.hosts) == ("ce", "compute-engine", 2, 1)
    assert config.capacity == "spot" and config.training.steps == 20 and config.training.checkpoint.interval_steps == 6

    planned = run_line(plan)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    said = " ".join(planned.stdout.split())
    assert "stack ce: 2 × v5p-8 (v5p) = 8 chips on 2 TPU VMs" in said
    assert "capacity: spot (SPOT VMs): each group creates its 1 VM; the group recreates a failed VM" in said
    assert "billed until pulumi destroy" in said

    ran = run_line(up, timeout=800)
    out = ran.stdout
    assert ran.returncode == 0, out + ran.stderr
    assert "fault: kill slice 1 at step 17" in out and "repair: recreating slice 1" in out, out
    resumed = re.search(r"training resumed from the checkpoint of step (\d+)", out)
    assert resumed and int(resumed[1]) == 12, out  # the newest checkpoint before step 17 (every 6 steps)
    assert "step 20/20" in out
    assert (
        "capacity: kept: deleteOnComplete is not built for the compute-engine backend; the instance groups' spot VMs"
        in out
    )
    assert processes_under(tmp_path) == []

    shown = run_line(status)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "20/20" in shown.stdout and "complete" in shown.stdout, shown.stdout
    slice_1 = run_line(logs)
    assert slice_1.returncode == 0, slice_1.stderr
    lines = slice_1.stdout.splitlines()
    assert lines and all(line.startswith("[slice 1 worker 0]") for line in lines if line.startswith("[slice ")), lines[
        :5
    ]
    named = re.findall(r"compute engine: VM (multislice-ce-1-[a-z0-9]{4}) of group multislice-ce-1 ", slice_1.stdout)
    assert len(named) >= 2 and len(set(named)) == 1, named  # both boots, one name: the group kept it
    run_line.check_hints(monkeypatch, minimum=1)  # the run's "every VM's: multislice local logs …"

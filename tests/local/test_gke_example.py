"""docs/gke.md's "Try it on this machine", run exactly as written (tests/helpers/documented_lines.py;
the lines: tests.helpers.readme.bash_lines): a gke stack in a file of the user's own, planned (its
capacity line and the APIs it enables), emulated as 4 Pods with a kill of slice 1 at step 17 (as
JobSet does, every Pod starts again; training resumes from the newest checkpoint and completes),
then its status and slice 1's lines."""

from __future__ import annotations

import re

import pytest

from infra.config import load_stack_file
from tests.helpers.documented_lines import Lines, shell_env
from tests.helpers.emulation import processes_under
from tests.helpers.readme import bash_lines, page, section

LINES = bash_lines(section(page("gke.md"), "## Try it on this machine"))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_gke_example_runs_as_written(tmp_path, monkeypatch):
    copy, backend, plan, up, status, logs = LINES
    env = shell_env(tmp_path)
    run_line = Lines(env)
    for line in (copy, backend):
        done = run_line(line)
        assert done.returncode == 0, done.stderr
    config = load_stack_file(tmp_path / "home" / "Pulumi.gke.yaml")
    assert (config.stack, config.backend, config.slices, config.accelerator.hosts) == ("gke", "gke", 2, 2)
    assert config.training.parallelism.ici.fsdp == config.accelerator.chips == 8  # fsdp spans each slice
    assert config.capacity == "spot" and config.training.steps == 20 and config.training.checkpoint.interval_steps == 6

    planned = run_line(plan)
    assert planned.returncode == 0, planned.stdout + planned.stderr
    said = " ".join(planned.stdout.split())
    assert "stack gke: 2 × v4-16 (v4) = 16 chips on 4 TPU VMs (2 per slice, 4 chips each)" in said
    assert "capacity: spot node pools in a new zonal cluster" in said and "a system pool of" in said
    assert "each pool holds its 2 VMs" in said and "until pulumi destroy" in said
    assert re.search(r"Google APIs pulumi up enables: [^\n]*container\.googleapis\.com", planned.stdout)

    ran = run_line(up, timeout=800)
    out = ran.stdout
    assert ran.returncode == 0, out + ran.stderr
    assert "booting 4 VM(s): 2 slice(s) × 2 worker(s) of v4-16" in out
    assert "fault: kill slice 1 at step 17" in out and "repair: recreating slice 1" in out, out
    resumed = re.search(r"training resumed from the checkpoint of step (\d+)", out)
    assert resumed and int(resumed[1]) == 12, out  # the newest checkpoint before step 17 (every 6 steps)
    assert "step 20/20" in out
    assert "capacity: node pools multislice-gke-0, multislice-gke-1 kept" in out
    assert "final_eval_loss" in out and "— (no evaluation: eval every 40 steps, the run had 20)" in out
    assert processes_under(tmp_path) == []

    shown = run_line(status)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "20/20" in shown.stdout and "complete" in shown.stdout, shown.stdout
    slice_1 = run_line(logs)
    assert slice_1.returncode == 0, slice_1.stderr
    lines = slice_1.stdout.splitlines()
    assert lines and all(line.startswith("[slice 1 worker ") for line in lines), lines[:5]
    assert {line.split("]")[0] for line in lines} == {"[slice 1 worker 0", "[slice 1 worker 1"}
    assert not [line for line in lines if "[Gloo]" in line or "GOOGLE_AUTH_TOKEN_FOR_TESTING" in line]
    assert not [line for line in lines if "could not be restored" in line or "is read only" in line]
    assert any("training: resuming at step 12/20" in line for line in lines), lines
    run_line.check_hints(monkeypatch, minimum=1)  # the run's "every VM's: uv run --frozen multislice local logs …"

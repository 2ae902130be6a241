"""Emulated chips know their slice: a multislice program as the field writes one, run unmodified by
``multislice local exec`` on an emulated 2-slice stack whose workload holds no chips (a command that
only waits), finds each device's slice in ``slice_index`` as on Cloud TPU — it builds its hybrid mesh
with ``create_hybrid_device_mesh`` over ``slice_index`` (tests/fakes/slices/hybrid_mesh.py) and
passes the Multislice overview's slice check (tests/fakes/slices/slice_count.py). One emulation of
two VMs (infra/emulated/vm_site/sitecustomize.py, point 4; docs/emulation.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.emulation import BackgroundCli, processes_under, run_cli

PROGRAMS = Path(__file__).parents[1] / "fakes" / "slices"

#: 2 slices × 1 VM × 4 chips; the workload waits for a file the test writes, so the run is in
#: progress (its VMs up) while exec runs, and holds no chips.
STACK = """\
config:
  gcp:project: multislice-tests
  gcp:zone: us-central2-b
  multislice:acceleratorType: v4-8
  multislice:slices: 2
  multislice:capacity: spot
  multislice:workload:
    command: [sh, -c, 'until [ -e "$GO_FILE" ]; do sleep 0.2; done']
    steps: 1
    env: {{GO_FILE: {go}}}
"""


@pytest.mark.slow
def test_a_field_s_multislice_programs_find_each_chip_s_slice(tmp_path):
    go = tmp_path / "go"
    stack = tmp_path / "stack" / "Pulumi.slices.yaml"
    stack.parent.mkdir()
    stack.write_text(STACK.format(go=go))
    with BackgroundCli(["local", "up", "--config-file", str(stack)], tmp_path) as run:
        run.wait_until(lambda: "training started" in run.output(), 300, "the command's start on every VM")
        line = " && ".join(
            f'"$MULTISLICE_PYTHON" {PROGRAMS / program} 2' for program in ("slice_count.py", "hybrid_mesh.py")
        )
        result = run_cli(["local", "exec", "--config-file", str(stack), "--", line], tmp_path)
        go.touch()
        assert result.returncode == 0, result.stdout + result.stderr
        # gloo's C++ threads write their connection lines to the program's stream in pieces: one may
        # land on a program's line before its text or between its text and the newline (``print``
        # writes the two apart when unbuffered): a line is matched from the prefix on.
        for worker, process in (("[slice 0 worker 0]", 0), ("[slice 1 worker 0]", 1)):
            spans = rf"process {process}: data axis spans slices \[\[0\], \[1\]\]"
            for said in (rf"process {process}: 2 slices", spans):
                assert re.search(rf"^{re.escape(worker)} .*{said}", result.stdout, re.M), result.stdout
        assert run.finish(120) == 0, run.last_lines()
    assert processes_under(tmp_path) == []
    # The run was started from a file outside stacks/: its name reaches it too.
    status = run_cli(["local", "status", "--stack", "slices"], tmp_path)
    assert status.returncode == 0 and "complete" in status.stdout.lower(), status.stdout + status.stderr

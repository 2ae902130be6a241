"""Who finished the run: the completion marker names the slice whose trainer wrote it, and
``python -m training completed-by`` tells trainer.sh, whose worker 0 of that slice then releases the
capacity (an elastic run may finish without slice 0)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.checkpoint import completion
from training.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("marker", "writer"),
    [
        ({"step": 120, "loss": 2.5, "slice": 1}, 1),
        ({"step": 120, "loss": 2.5}, 0),  # training.workload complete, or an older release: slice 0
        ({"step": 120, "loss": 2.5, "slice": True}, 0),
        ({"step": 120, "loss": 2.5, "slice": -1}, 0),
        ({"step": 120, "loss": 2.5, "slice": "1; rm -rf /"}, 0),
        ({"step": 120, "loss": 2.5, "slice": 10**30}, 0),
    ],
)
def test_the_marker_names_the_slice_that_wrote_it(tmp_path, marker, writer):
    run_dir = RunDir(str(tmp_path))
    completion.write_completion(run_dir, marker)
    assert completion.completed_by(run_dir) == writer
    assert completion.read_completion(run_dir) == {"step": 120, "loss": 2.5}  # what every other reader sees


def test_no_marker_names_no_writer(tmp_path):
    assert completion.completed_by(RunDir(str(tmp_path))) is None
    (tmp_path / completion.COMPLETE_MARKER).write_text("{damaged")
    assert completion.completed_by(RunDir(str(tmp_path))) is None


def test_the_command_trainer_sh_asks(tmp_path):
    ask = [sys.executable, "-m", "training", "completed-by", str(tmp_path)]
    missing = subprocess.run(ask, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (missing.returncode, missing.stdout) == (1, "")
    (tmp_path / completion.COMPLETE_MARKER).write_text(json.dumps({"step": 3, "loss": None, "slice": 2}))
    found = subprocess.run(ask, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (found.returncode, found.stdout) == (0, "2\n")

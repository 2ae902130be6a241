"""How far the loss of a run that shrank and grew back (elastic slices) drifts from an uninterrupted run.

    uv run --frozen python benchmarks/elastic_drift.py [--json]

The dev stack with ``multislice:elastic: {minSlices: 1, shrinkAfter: 30s, growAfter: 5s}``, run twice
with ``multislice local up --fresh``, each with its own state directory: once uninterrupted, once with
slice 1 preempted at step 50 and its capacity withheld for 40 s (``--preempt 1@50 --withhold 1:40s``),
held at step 70 until slice 1 is recreated (``--hold-at 70``: the return lands inside the run on any
machine), so that steps from the preemption save to the grow run on slice 0 alone (twice the
microbatches) and the rest on both. It prints each run's slice changes and, over every step both runs
recorded (the last record of each), the largest absolute and relative loss difference, and both final
losses. Not bit-identical by design: one slice adds the gradients of its microbatches in another order
than two slices' all-reduce (docs/faults.md, "Elastic slices").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.config import load_stack_file  # noqa: E402
from infra.emulated import gcs_clients  # noqa: E402
from training.metrics.run_log import read_records  # noqa: E402
from training.run_dir import RunDir  # noqa: E402

ELASTIC = "  multislice:elastic: {minSlices: 1, shrinkAfter: 30s, growAfter: 5s}\n"


def stack_file(directory: Path) -> Path:
    text = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()
    path = directory / "Pulumi.drift.yaml"
    path.write_text(text.replace("  multislice:capacity: spot\n", "  multislice:capacity: spot\n" + ELASTIC))
    return path


def run(stack: Path, state: Path, *faults: str) -> tuple[dict[int, float], list[str]]:
    """One ``local up``; each step's loss (its last record) and the summary's slice changes."""
    env = {**os.environ, "MULTISLICE_STATE_DIR": str(state), "COLUMNS": "200"}
    summary = state / "summary.json"
    command = [sys.executable, "-m", "infra.cli", "local", "up", "--config-file", str(stack), "--fresh"]
    proc = subprocess.Popen(
        [*command, "--summary-json", str(summary), *faults], env=env, stdout=subprocess.PIPE, text=True
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(iter(proc.stdout.readline, "")) if proc.stdout else None)
    reader.start()
    if "--hold-at" in faults:
        while not any("repair: recreating slice 1" in line for line in out) and proc.poll() is None:
            time.sleep(0.5)
        time.sleep(10)  # the recreated slice boots and stands by
        (state / "drift" / "holds").mkdir(parents=True, exist_ok=True)
        (state / "drift" / "holds" / "70").touch()
    proc.wait()
    reader.join()
    if proc.returncode != 0:
        raise SystemExit("".join(out))
    config = load_stack_file(stack)
    with gcs_clients.clients_pointed_at(state / config.stack / "gcs", state / "reader.log"):
        metrics = read_records(RunDir(config.run_dir), "metrics")
    losses = {int(m["step"]): float(m["loss"]) for m in metrics if "loss" in m}
    return losses, json.loads(summary.read_text())["slice_changes"]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stack = stack_file(Path(tmp))
        plain, _ = run(stack, Path(tmp) / "plain")
        elastic, changes = run(
            stack, Path(tmp) / "elastic", "--preempt", "1@50", "--withhold", "1:40s", "--hold-at", "70"
        )
    steps = sorted(set(plain) & set(elastic))
    absolute = max(abs(plain[s] - elastic[s]) for s in steps)
    relative = max(abs(plain[s] - elastic[s]) / abs(plain[s]) for s in steps)
    result = {
        "steps_compared": len(steps),
        "slice_changes": changes,
        "max_abs_loss_difference": absolute,
        "max_rel_loss_difference": relative,
        "final_loss_uninterrupted": plain[max(steps)],
        "final_loss_elastic": elastic[max(steps)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


if __name__ == "__main__":
    main()

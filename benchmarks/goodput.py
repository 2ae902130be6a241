"""Goodput of the dev stack emulated through two preemptions and one kill (issue 14's target ≥ 0.85).

    uv run --frozen python benchmarks/goodput.py [--repeat 1] [--json]

Runs ``multislice local up --stack dev --fresh --preempt 0@30 --preempt 1@60 --kill 1@90
--summary-json PATH`` (its own state directory each time) and prints, from the summary and
the run's ``goodput.json`` (training.goodput): goodput = productive step time ÷ wall time
from the first trainer process start to the ``complete`` event (boot, compilation, saves,
restores and recomputed steps included), badput seconds by cause, steps lost, the command's
own wall time, and the machine's load average before and after. The kill at step 90 comes
10 steps after the step-80 checkpoint (``checkpoint.interval_steps`` 20): those steps are
recomputed. On a shared machine the figures vary with load: rerun on a quiet one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ["--preempt", "0@30", "--preempt", "1@60", "--kill", "1@90"]
UP = ["local", "up", "--stack", "dev", "--fresh", *FAULTS]
TARGET = 0.85


def one_run(state_dir: Path) -> dict:
    """One ``local up`` with its own state directory: the summary plus the command's wall time (s)."""
    summary = state_dir / "summary.json"
    env = {k: v for k, v in os.environ.items()
           if k not in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["MULTISLICE_STATE_DIR"] = str(state_dir)
    # A TPU VM's Python keeps the bytecode it compiled on its first start; where this machine
    # sets PYTHONDONTWRITEBYTECODE, every emulated start would compile every module from source
    # (seconds of CPU each). The first start fills a temporary prefix, as on a VM.
    env["PYTHONPYCACHEPREFIX"] = str(state_dir / "bytecode")
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", *UP, "--summary-json", str(summary)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,
    )
    wall = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"local up failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    data = json.loads(summary.read_text())
    badput = sum(data["badput"].values())  # wall = productive + badput, productive = goodput × wall
    span = badput / (1 - data["goodput"]) if data["goodput"] < 1 else None
    return data | {"command_seconds": round(wall, 1), "goodput_wall_seconds": round(span, 1) if span else None,
                   "productive_seconds": round(span - badput, 1) if span else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = []
    for index in range(args.repeat):
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="goodput-bench-") as tmp:
            run = one_run(Path(tmp))
        run["load_average"] = [round(x, 1) for x in (*load_before, *os.getloadavg())]
        runs.append(run)
        if not args.json:
            badput = "; ".join(f"{k} {v:.1f} s" for k, v in sorted(run["badput"].items(), key=lambda kv: -kv[1]) if v >= 0.05)
            print(
                f"run {index + 1}: goodput {run['goodput']:.3f} (target ≥ {TARGET}), steps lost {run['steps_lost']}, "
                f"restarts {run['restarts']}, complete {run['complete']}, final loss {run['final_loss']:.4f}, "
                f"productive {run['productive_seconds']} s of {run['goodput_wall_seconds']} s from the first process start; "
                f"command {run['command_seconds']:.0f} s, load average before/after {run['load_average']}\n"
                f"  badput: {badput}"
            )
    if args.json:
        print(json.dumps({"command": "multislice " + " ".join(UP), "target": TARGET, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()

"""Goodput of the dev stack emulated through two preemptions and one kill (issue 14's target ≥ 0.85).

    uv run --frozen python benchmarks/goodput.py [--repeat 1] [--steps 120] [--no-faults] [--json]

Runs ``multislice local up --stack dev --fresh --preempt 0@30 --preempt 1@60 --kill 1@90
--summary-json PATH`` (its own state directory each time) and prints, from the summary and
the run's ``goodput.json`` (training.goodput): goodput = productive step time ÷ wall time
from the first trainer process start to the ``complete`` event (boot, compilation, saves,
restores and recomputed steps included), badput seconds by cause, badput per restart, steps
lost, the command's own wall time, and the machine's load average before and after. The kill
at step 90 comes 10 steps after the step-80 checkpoint (``checkpoint.interval_steps`` 20):
those steps are recomputed. On a shared machine the figures vary with load: rerun on a quiet one.

Goodput depends on how long the run is against what each restart costs: ``--steps N`` runs
the dev stack with ``training.steps`` N instead (a copy of the stack file, through
``--config-file``), its faults at the same fractions of the run (25 %, 50 %, 75 %);
``--no-faults`` runs it without faults (the start-up cost alone: the best goodput this
machine allows for that run length).
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

import yaml

ROOT = Path(__file__).resolve().parents[1]
DEV_STEPS = 120
TARGET = 0.85


def faults(steps: int) -> list[str]:
    """The benchmark's faults at 25 %, 50 % and 75 % of a run of ``steps`` (dev: 30, 60, 90)."""
    at = [round(steps * fraction) for fraction in (0.25, 0.5, 0.75)]
    return ["--preempt", f"0@{at[0]}", "--preempt", f"1@{at[1]}", "--kill", f"1@{at[2]}"]


def up_args(steps: int, with_faults: bool, state_dir: Path) -> list[str]:
    """``local up`` arguments: the dev stack itself, or a copy of it with ``training.steps``."""
    if steps == DEV_STEPS:
        stack = ["--stack", "dev"]
    else:
        config = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
        config["config"]["multislice:training"]["steps"] = steps
        copy = state_dir / "Pulumi.dev.yaml"  # the stack name comes from the file name
        copy.write_text(yaml.safe_dump(config, sort_keys=False))
        stack = ["--config-file", str(copy)]
    return ["local", "up", *stack, "--fresh", *(faults(steps) if with_faults else [])]


def one_run(state_dir: Path, up: list[str]) -> dict:
    """One ``local up`` with its own state directory: the summary plus the command's wall time (s)."""
    summary = state_dir / "summary.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    env["MULTISLICE_STATE_DIR"] = str(state_dir)
    # A TPU VM's Python keeps the bytecode it compiled on its first start; where this machine
    # sets PYTHONDONTWRITEBYTECODE, every emulated start would compile every module from source
    # (seconds of CPU each). The first start fills a temporary prefix, as on a VM.
    env["PYTHONPYCACHEPREFIX"] = str(state_dir / "bytecode")
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", *up, "--summary-json", str(summary)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    wall = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"local up failed ({result.returncode}):\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    data = json.loads(summary.read_text())
    badput = sum(data["badput"].values())  # wall = productive + badput, productive = goodput × wall
    span = badput / (1 - data["goodput"]) if data["goodput"] < 1 else None
    return data | {
        "command_seconds": round(wall, 1),
        "goodput_wall_seconds": round(span, 1) if span else None,
        "productive_seconds": round(span - badput, 1) if span else None,
        "badput_seconds": round(badput, 1),
        "starts": data["restarts"] + 1,
        "badput_seconds_per_start": round(badput / (data["restarts"] + 1), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--steps", type=int, default=DEV_STEPS, help="training.steps (default: the dev stack's 120)")
    parser.add_argument("--no-faults", action="store_true", help="no preemption and no kill: the start-up cost alone")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.steps < 8:
        parser.error("--steps must be at least 8 (the faults need distinct steps)")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    runs = []
    up: list[str] = []  # the last run's arguments, for the report
    for index in range(args.repeat):
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="goodput-bench-") as tmp:
            up = up_args(args.steps, not args.no_faults, Path(tmp))
            run = one_run(Path(tmp), up)
        run["load_average"] = [round(x, 1) for x in (*load_before, *os.getloadavg())]
        runs.append(run)
        if not args.json:
            badput = "; ".join(
                f"{k} {v:.1f} s" for k, v in sorted(run["badput"].items(), key=lambda kv: -kv[1]) if v >= 0.05
            )
            print(
                f"run {index + 1}: goodput {run['goodput']:.3f} (target ≥ {TARGET}), steps lost {run['steps_lost']}, "
                f"restarts {run['restarts']}, complete {run['complete']}, final loss {run['final_loss']:.4f}, "
                f"productive {run['productive_seconds']} s of {run['goodput_wall_seconds']} "
                "s from the first process start; "
                f"command {run['command_seconds']:.0f} s, load average before/after {run['load_average']}\n"
                f"  badput: {badput}\n"
                f"  badput per start: {run['badput_seconds_per_start']} s "
                f"({run['badput_seconds']} s over {run['starts']} start(s))"
            )
    command = (
        "multislice "
        + " ".join(up)
        + ("" if args.steps == DEV_STEPS else f" (a copy of the dev stack with training.steps {args.steps})")
    )
    if args.json:
        print(json.dumps({"command": command, "steps": args.steps, "target": TARGET, "runs": runs}, indent=2))
    else:
        print(f"command: {command}")


if __name__ == "__main__":
    main()

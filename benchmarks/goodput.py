"""Goodput of the dev stack emulated through two preemptions and one kill (targets: ≥ 0.6 for its
120 steps, ≥ 0.85 for 480).

    uv run --frozen python benchmarks/goodput.py [--repeat 1] [--steps 120] [--no-faults] [--warm-stack]
        [--kill-step N] [--crash] [--standby on|off] [--json]

Runs ``multislice local up --stack dev --fresh --preempt 0@30 --preempt 1@60 --kill 1@90
--summary-json PATH`` (its own state directory each time) and prints, from the summary and
the run's records (training.metrics.goodput): goodput = productive step time ÷ wall time
from the first trainer process start to the ``complete`` event (boot, compilation, saves,
restores and recomputed steps included), badput seconds by cause, badput per restart, steps
lost, the first start's compilation, the command's own wall time, and the machine's load
average before and after. The kill at step 90 comes 10 steps after the step-80 checkpoint
(``checkpoint.interval_steps`` 20): those steps are recomputed. On a shared machine the
figures vary with load: rerun on a quiet one.

Goodput depends on how long the run is against what each restart costs: ``--steps N`` runs
the dev stack with ``training.steps`` N instead (a copy of the stack file, through
``--config-file``), its preemptions at the same fractions of the run (25 %, 50 %) and its kill
half an interval after the checkpoint at or before 75 % (:func:`faults`; 480 steps: 120, 240,
370; ``--kill-step`` puts the kill elsewhere);
``--crash`` makes the third fault ``--crash`` instead of ``--kill`` at the same step: an application
failure (an OOM kill, a runtime crash) that keeps the VMs, so its restarts are forked by each VM's
warm standby instead of starting with a boot (docs/faults.md); each start's ``initialization`` and
kind (``cold``, ``warm`` after a boot's wait for the standby, ``warm`` at once) is printed either way;
``--no-faults`` runs it without faults (the start-up cost alone: the best goodput this
machine allows for that run length). Each run's state directory is new, so by default the
run is a new stack's first: its compilation cache (``gs://<bucket>/compilation-cache``,
training.compile_cache) and the VMs' bytecode are cold. ``--warm-stack`` first runs the same
stack in that state directory until its first evaluation (:func:`warm_up`, which prints its
first start's compilation: the cold figure), so that the measured run is a new run (``--fresh``)
of a stack that ran before.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training.metrics.goodput import account  # noqa: E402

DEV_STEPS = 120
#: Goodput targets by run length, with the three faults (an idle 2-core machine).
TARGETS = {DEV_STEPS: 0.6, 480: 0.85}


def faults(steps: int, interval: int, kill_step: int | None = None, crash: bool = False) -> list[str]:
    """The benchmark's faults: preemptions at 25 % and 50 % of a run of ``steps``, and the kill
    half a checkpoint ``interval`` after the checkpoint at or before 75 % (dev, interval 20:
    30, 60, 90; 480 steps: 120, 240, 370), or at ``kill_step``.

    Half an interval is what a fault at a random moment loses on average. At exactly 75 % of
    480 steps the kill would fall on the step-360 checkpoint: the emulator kills once it sees
    the step reported, while that save is still starting, so a whole interval is lost (the
    worst case, measured in docs/goodput.md; ``--kill-step 360`` reproduces it)."""
    at = [round(steps * fraction) for fraction in (0.25, 0.5, 0.75)]
    kill = kill_step if kill_step is not None else at[2] // interval * interval + interval // 2
    return ["--preempt", f"0@{at[0]}", "--preempt", f"1@{at[1]}", "--crash" if crash else "--kill", f"1@{kill}"]


def up_args(
    steps: int,
    with_faults: bool,
    state_dir: Path,
    kill_step: int | None = None,
    standby: bool = True,
    crash: bool = False,
) -> list[str]:
    """``local up`` arguments: the dev stack itself, or a copy of it with ``training.steps``
    (faults: :func:`faults`) or, ``standby`` False, ``multislice:warmStandby: false``."""
    config = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    training = config["config"]["multislice:training"]
    chosen = faults(steps, training["checkpoint"]["interval_steps"], kill_step, crash) if with_faults else []
    if steps == DEV_STEPS and standby:
        stack = ["--stack", "dev"]
    else:
        training["steps"] = steps
        if not standby:
            config["config"]["multislice:warmStandby"] = False
        copy = state_dir / "Pulumi.dev.yaml"  # the stack name comes from the file name
        copy.write_text(yaml.safe_dump(config, sort_keys=False))
        stack = ["--config-file", str(copy)]
    return ["local", "up", *stack, "--fresh", *chosen]


def cli_env(state_dir: Path) -> dict[str, str]:
    """The environment of ``multislice local up`` with its state in ``state_dir``."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")
    }
    env["MULTISLICE_STATE_DIR"] = str(state_dir)
    # A TPU VM's virtualenv holds its wheels' bytecode from the build (boot.sh: uv pip install
    # --compile-bytecode); where this machine sets PYTHONDONTWRITEBYTECODE, every emulated start
    # would compile every module from source (seconds of CPU each). The first start fills a
    # temporary prefix that every VM shares, as each VM's own build would.
    env["PYTHONPYCACHEPREFIX"] = str(state_dir / "bytecode")
    return env


def stack_config(up: list[str]):
    """The StackConfig that ``local up`` arguments name (``--stack`` or ``--config-file``)."""
    from infra.config import load_stack, load_stack_file

    flag = up.index("--stack") if "--stack" in up else up.index("--config-file")
    return load_stack(up[flag + 1]) if up[flag] == "--stack" else load_stack_file(Path(up[flag + 1]))


def run_records(state_dir: Path, config) -> tuple[list[dict], list[dict]]:
    """The events and metrics of the stack's run stored in ``state_dir``, read through a
    temporary storage server over its emulated bucket."""
    from infra.emulated import gcs_clients
    from training.metrics.run_log import read_records
    from training.run_dir import RunDir

    with gcs_clients.clients_pointed_at(state_dir / config.stack / "gcs", state_dir / "reader.log") as stored:
        if not stored:
            return [], []
        run_dir = RunDir(config.run_dir)
        return read_records(run_dir, "events"), read_records(run_dir, "metrics")


def warm_up(state_dir: Path, up: list[str]) -> dict:
    """A new stack's first run, stopped once it has recorded a step past its first checkpoint
    and its first evaluation (``local up`` without faults, interrupted as Ctrl-C does): it
    leaves what any earlier run of the stack leaves, the stack's compilation cache
    (``gs://<bucket>/compilation-cache``, every program of the loop in it) and the VMs'
    bytecode. Returns its first start's figures from its records (``per_attempt`` of
    training.metrics.goodput.account): the cold stack's compilation badput, and its imports."""
    from training.metrics.goodput import account

    config = stack_config(up)
    past = max(config.training.eval_every_steps or 0, config.training.checkpoint.interval_steps) + 1
    command = [sys.executable, "-m", "infra.cli", *[a for a in up if a != "--fresh"]]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=cli_env(state_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            match = re.search(r"\bstep (\d+)/\d+", line)
            if match and int(match.group(1)) >= past:
                proc.send_signal(signal.SIGINT)  # Ctrl-C: every VM is stopped
                break
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    events, metrics = run_records(state_dir, config)
    report = account(events, metrics)
    if report is None or not any("step_time_s" in m for m in metrics):
        raise SystemExit(f"the warm-up run recorded no step:\n{''.join(seen[-40:])}")
    first = report["per_attempt"][0]
    return {
        "steps": max(m["step"] for m in metrics if "step_time_s" in m),
        "first_start_compilation_s": first["badput"]["compilation"],
        "first_start_initialization_s": first["badput"]["initialization"],
        "first_start_import_s": first.get("import_s"),
    }


def one_run(state_dir: Path, up: list[str]) -> dict:
    """One ``local up`` with its own state directory: the summary plus the command's wall time (s)."""
    summary = state_dir / "summary.json"
    env = cli_env(state_dir)
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
    events, metrics = run_records(state_dir, stack_config(up))
    report = account(events, metrics) or {}
    attempts = report.get("per_attempt", [])
    return data | {
        "per_attempt": attempts,
        "start_kinds": [start_label(e) for e in events if e.get("event") == "start"],
        "first_start_compilation_s": attempts[0]["badput"]["compilation"] if attempts else None,
        "command_seconds": round(wall, 1),
        "goodput_wall_seconds": round(span, 1) if span else None,
        "productive_seconds": round(span - badput, 1) if span else None,
        "badput_seconds": round(badput, 1),
        "starts": data["restarts"] + 1,
        "badput_seconds_per_start": round(badput / (data["restarts"] + 1), 1),
    }


def start_label(start: dict) -> str:
    """How a start began, from its event (training/start.py ``start_kind``): ``cold``, ``warm after a
    wait`` (a boot's first, forked once the standby had prepared) or ``warm``."""
    if start.get("start_kind") == "warm":
        return "warm after a wait" if "standby_wait_s" in start else "warm"
    return str(start.get("start_kind") or "cold")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--steps", type=int, default=DEV_STEPS, help="training.steps (default: the dev stack's 120)")
    parser.add_argument("--no-faults", action="store_true", help="no preemption and no kill: the start-up cost alone")
    parser.add_argument(
        "--warm-stack",
        action="store_true",
        help="first a warm-up run of the stack in the same state directory (stopped after its first evaluation), "
        "so the measured run (--fresh) is a new run of a stack that ran before: its compilation cache is warm",
    )
    parser.add_argument(
        "--kill-step",
        type=int,
        help="the kill's step instead of half a checkpoint interval after the one at or before 75 %% of the run",
    )
    parser.add_argument(
        "--crash",
        action="store_true",
        help="the third fault an application failure (--crash: the VMs stay up) instead of a --kill, same step",
    )
    parser.add_argument(
        "--standby",
        choices=("on", "off"),
        default="on",
        help="multislice:warmStandby (on: the dev stack's default; off: a copy of the stack without it)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.steps < 8:
        parser.error("--steps must be at least 8 (the faults need distinct steps)")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    if args.kill_step is not None and not 0 < args.kill_step < args.steps:
        parser.error(f"--kill-step must be a step of the run: 1 to {args.steps - 1}")
    runs = []
    up: list[str] = []  # the last run's arguments, for the report
    for index in range(args.repeat):
        load_before = os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="goodput-bench-") as tmp:
            up = up_args(args.steps, not args.no_faults, Path(tmp), args.kill_step, args.standby == "on", args.crash)
            warm = warm_up(Path(tmp), up) if args.warm_stack else None
            load_measured = os.getloadavg()
            run = one_run(Path(tmp), up)
        if warm is not None:
            run["warm_up"] = warm | {"load_average": [round(x, 1) for x in (*load_before, *load_measured)]}
            load_before = load_measured
        run["load_average"] = [round(x, 1) for x in (*load_before, *os.getloadavg())]
        runs.append(run)
        if not args.json:
            badput = "; ".join(
                f"{k} {v:.1f} s" for k, v in sorted(run["badput"].items(), key=lambda kv: -kv[1]) if v >= 0.05
            )
            target = f" (target ≥ {TARGETS[args.steps]})" if args.steps in TARGETS and not args.no_faults else ""
            if warm is not None:
                print(
                    f"warm-up run (a new stack, stopped at step {warm['steps']}): first start's compilation "
                    f"{warm['first_start_compilation_s']:.1f} s (cold stack cache), "
                    f"load average before/after {run['warm_up']['load_average']}"
                )
            print(
                f"run {index + 1}: goodput {run['goodput']:.3f}{target}, steps lost {run['steps_lost']}, "
                f"restarts {run['restarts']}, complete {run['complete']}, final loss {run['final_loss']:.4f}, "
                f"productive {run['productive_seconds']} s of {run['goodput_wall_seconds']} "
                "s from the first process start; "
                f"command {run['command_seconds']:.0f} s, load average before/after {run['load_average']}\n"
                f"  badput: {badput}\n"
                f"  badput per start: {run['badput_seconds_per_start']} s "
                f"({run['badput_seconds']} s over {run['starts']} start(s))\n"
                "  initialization by start: "
                + ", ".join(
                    f"{a['badput']['initialization']:.1f} s ({kind})"
                    for a, kind in zip(run["per_attempt"], run["start_kinds"], strict=False)
                )
                + "\n"
                f"  first start's compilation: {run['first_start_compilation_s']:.1f} s "
                f"({'warm stack cache' if warm is not None else 'a new stack: cold stack cache'})"
            )
    changes = [f"training.steps {args.steps}"] if args.steps != DEV_STEPS else []
    changes += ["multislice:warmStandby false"] if args.standby == "off" else []
    copied = f" (a copy of the dev stack with {', '.join(changes)})" if changes else ""
    command = "multislice " + " ".join(up) + copied
    if args.json:
        target = TARGETS.get(args.steps) if not args.no_faults else None
        print(json.dumps({"command": command, "steps": args.steps, "target": target, "runs": runs}, indent=2))
    else:
        print(f"command: {command}")


if __name__ == "__main__":
    main()

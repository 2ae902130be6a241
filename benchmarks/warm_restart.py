"""Warm restarts against cold ones, in the same run twice: the VM's standby on and off.

    uv run --frozen python benchmarks/warm_restart.py [--steps 120] [--crash-at 30 70] [--order warm,cold] [--json]

Runs the dev stack (``local up --config-file`` of a copy with ``training.steps`` and
``multislice:warmStandby`` true, then false; each run in a state directory of its own) and at each
``--crash-at`` step SIGKILLs the trainer process of every VM of slice 1: an application failure (an
OOM kill, a crash of the runtime), which leaves the VMs up. Their units restart the trainer, and slice
0's trainers, which end on the lost peer, restart too: every process of the job starts again on a VM
that kept its standby. (A repair that recreates or reboots VMs, the goodput benchmark's faults, starts
every trainer cold with or without a standby: docs/vm-boot.md, "The warm standby".)

Prints, per run: each restart's ``initialization`` badput (process 0's start event: the handoff's process
start → ready to restore) with its ``start_kind``, goodput, badput by cause, the final loss (the two runs
must agree: a warm attempt computes what a cold one does), the median steady step time (what the idle
standby costs the training beside it), and the standby's resident memory (its ``ready`` line). The load
average is printed with every figure: on a shared machine compare the ratios, never the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from goodput import cli_env, run_records, stack_config  # noqa: E402

from training.metrics.goodput import account  # noqa: E402

STEP = re.compile(r"\bstep (\d+)/\d+")


def stack_copy(state_dir: Path, steps: int, warm: bool) -> Path:
    config = yaml.safe_load((ROOT / "stacks" / "Pulumi.dev.yaml").read_text())
    config["config"]["multislice:training"]["steps"] = steps
    config["config"]["multislice:warmStandby"] = warm
    path = state_dir / "Pulumi.dev.yaml"  # the stack name comes from the file name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def attempts_of_slice(state_dir: Path, slice_id: int) -> list[int]:
    """The trainer attempts running on slice ``slice_id``'s emulated VMs of this state directory:
    ``python -m training run`` (cold) or a process the standby forked (warm)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        try:
            cmdline, cwd = proc.info["cmdline"] or [], proc.info["cwd"] or ""
            if not cwd.startswith(str(state_dir)) or proc.environ().get("MULTISLICE_SLICE") != str(slice_id):
                continue
            cold = cmdline[1:4] == ["-m", "training", "run"]
            parent = proc.parent()
            warm = "training.standby" in cmdline and parent is not None and "training.standby" in parent.cmdline()
            if cold or warm:
                found.append(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def one_run(state_dir: Path, steps: int, crash_at: list[int], warm: bool) -> dict:
    stack = stack_copy(state_dir, steps, warm)
    summary = state_dir / "summary.json"
    command = [sys.executable, "-m", "infra.cli", "local", "up", "--config-file", str(stack), "--fresh"]
    proc = subprocess.Popen(
        [*command, "--summary-json", str(summary)],
        cwd=ROOT,
        env=cli_env(state_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    pending, seen, crashes = sorted(crash_at), [], []
    assert proc.stdout is not None
    for line in proc.stdout:
        seen.append(line)
        match = STEP.search(line)
        if pending and match and int(match.group(1)) >= pending[0]:
            pids = attempts_of_slice(state_dir, 1)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            if pids:
                crashes.append({"step": int(match.group(1)), "killed": len(pids)})
                pending.pop(0)
    proc.wait(timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"local up failed ({proc.returncode}):\n{''.join(seen[-40:])}")
    data = json.loads(summary.read_text())
    events, metrics = run_records(state_dir, stack_config(["--config-file", str(stack)]))
    report = account(events, metrics) or {}
    starts = [e for e in events if e.get("event") == "start"]
    restarts = [
        {
            "initialization_s": attempt["badput"]["initialization"],
            "start_kind": start.get("start_kind", "?"),
            "standby_wait_s": start.get("standby_wait_s", 0.0),
            "import_s": start.get("import_s"),
            "join_s": start.get("join_s"),
        }
        for attempt, start in zip(report.get("per_attempt", [])[1:], starts[1:], strict=False)
    ]
    step_times = [m["step_time_s"] for m in metrics if "step_time_s" in m]
    ready = []
    for log in (state_dir / "dev" / "logs").glob("slice-*.log"):
        ready += [float(m) for m in re.findall(r"standby: ready in [0-9.]+ s: \d+ modules, (\d+) MiB", log.read_text())]
    return {
        "warm_standby": warm,
        "crashes": crashes,
        "restarts": restarts,
        "goodput": data["goodput"],
        "badput": data["badput"],
        "final_loss": data["final_loss"],
        "median_step_time_s": round(statistics.median(step_times), 4) if step_times else None,
        "standby_rss_mib": max(ready) if ready else None,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--crash-at", type=int, nargs="+", default=[30, 70])
    parser.add_argument("--order", default="warm,cold", help="the runs, in order (warm, cold)")
    parser.add_argument("--keep", action="store_true", help="keep each run's state directory (printed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = []
    for mode in args.order.split(","):
        tmp = tempfile.mkdtemp(prefix=f"multislice-warm-restart-{mode}-")
        try:
            results.append(one_run(Path(tmp), args.steps, args.crash_at, mode == "warm") | {"state_dir": tmp})
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for run in results:
        kinds = ", ".join(
            f"{r['start_kind']} {r['initialization_s']:.1f} s"
            + (f" (waited {r['standby_wait_s']:.1f})" if r["standby_wait_s"] else "")
            for r in run["restarts"]
        )
        print(
            f"warmStandby {str(run['warm_standby']).lower():5}  goodput {run['goodput']:.3f}"
            f"  final loss {run['final_loss']}"
            f"  median step {run['median_step_time_s']} s  standby {run['standby_rss_mib']} MiB  load {run['load']:.1f}"
        )
        print(f"  restarts' initialization: {kinds}")
        print(f"  badput: {run['badput']}")


if __name__ == "__main__":
    main()

"""What ``multislice local exec`` costs on the dev stack: its start-to-first-output latency, and
its overhead per worker against running the same command directly in an emulated VM.

    uv run python benchmarks/exec_latency.py [--repeat 5] [--json]

It starts ``multislice local up`` on the dev stack's file with ``training.steps`` raised so the
run outlasts the measurement (a private ``MULTISLICE_STATE_DIR``; stopped with ``local down`` at
the end), waits until training runs, and then, while it trains, takes the median of
``--repeat`` runs (after one untimed run of each) of:

* ``exec first line``: from launching ``multislice local exec --stack dev -- CMD`` (a fresh
  process, as a user runs it: interpreter start, imports, the stack file, the state file, every
  VM's environment) to its first output line; ``exec total``: to its exit;
* ``direct``: the same ``bash -c CMD`` started by this process in slice 0 worker 0's directory
  with that VM's environment (what a shell on the VM runs), to its exit;
* ``fanout``: :func:`infra.remote.fanout.run_all` over every worker in this process (no CLI
  start-up), to the end.

For ``CMD`` = ``echo hi`` (nothing to run: all overhead) and ``sleep 1; echo hi`` (a command that
takes a second). The overhead per worker is ``(exec total - direct) / workers`` (mostly the
CLI's start-up, paid once), of which the fan-out's own is ``(fanout - direct) / workers``; the
ratios are ``exec total / direct`` and ``fanout / direct``. The load average (1 min) is printed
before and after: the emulated VMs train meanwhile, so on 2 cores every figure includes waiting
for a core.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.config import load_stack_file  # noqa: E402
from infra.emulated import state as local_state  # noqa: E402
from infra.emulated.state import LocalPaths  # noqa: E402
from infra.remote import emulated  # noqa: E402
from infra.remote.fanout import run_all  # noqa: E402
from infra.remote.selection import select_workers  # noqa: E402

COMMANDS = {"echo hi": "echo hi", "sleep 1; echo hi": "sleep 1; echo hi"}


def cli() -> list[str]:
    local = ROOT / ".venv" / "bin" / "multislice"
    return [str(local)] if local.exists() else [shutil.which("multislice") or "multislice"]


def first_line_and_exit(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(seconds to the first stdout line, seconds to the exit) of one run."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    first_s = time.perf_counter() - start
    proc.stdout.read()
    code = proc.wait(timeout=120)
    total_s = time.perf_counter() - start
    if code != 0 or not first:
        raise RuntimeError(f"{argv} exited {code} (first line {first!r})")
    return first_s, total_s


def wait_training(paths: LocalPaths, log: Path, proc: subprocess.Popen, timeout_s: float = 900) -> None:
    """Until the run reported a training step (every VM booted and the trainers run)."""
    deadline = time.monotonic() + timeout_s
    while "step " not in (log.read_text() if log.exists() else ""):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"local up did not start training: {log.read_text() if log.exists() else ''}")
        time.sleep(0.5)
    assert local_state.read_state(paths)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each measurement (median reported)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="exec-latency-") as tmp:
        tmp_path = Path(tmp)
        stack = tmp_path / "stack" / "Pulumi.dev.yaml"
        stack.parent.mkdir()
        stack.write_text((ROOT / "stacks" / "Pulumi.dev.yaml").read_text().replace("steps: 120", "steps: 1000000"))
        config = load_stack_file(stack)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        env.update(MULTISLICE_STATE_DIR=str(tmp_path / "state"), PYTHONPYCACHEPREFIX=str(tmp_path / "bytecode"))
        paths = LocalPaths(tmp_path / "state" / config.stack)
        log = tmp_path / "local-up.log"
        with open(log, "w") as out:
            up = subprocess.Popen(
                [*cli(), "local", "up", "--config-file", str(stack), "--fresh"],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_training(paths, log, up)
            load_before = os.getloadavg()[0]
            figures = measure(config, paths, stack, env, args.repeat, tmp_path)
            load_after = os.getloadavg()[0]
        finally:
            subprocess.run([*cli(), "local", "down"], env=env, cwd=ROOT, capture_output=True, timeout=300)
            up.wait(timeout=300)
    workers = config.slices * config.workers_per_slice
    result = {
        "stack": "dev",
        "workers": workers,
        "repeat": args.repeat,
        "load_1min_before": round(load_before, 2),
        "load_1min_after": round(load_after, 2),
        "commands": figures,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"multislice local exec on stack dev ({workers} emulated VMs, training meanwhile); "
        f"median of {args.repeat}; load {load_before:.2f} -> {load_after:.2f}"
    )
    for name, f in figures.items():
        print(
            f"  {name!r}: exec first line {f['exec_first_line_s']:.3f} s, exec total {f['exec_total_s']:.3f} s, "
            f"direct {f['direct_s']:.3f} s, fanout in-process {f['fanout_s']:.3f} s; "
            f"overhead per worker {f['overhead_per_worker_s']:.3f} s (of it the fan-out's "
            f"{f['fanout_overhead_per_worker_s']:.3f} s); exec/direct {f['exec_over_direct']:.2f}x, "
            f"fanout/direct {f['fanout_over_direct']:.2f}x"
        )


def measure(config, paths: LocalPaths, stack: Path, env: dict[str, str], repeat: int, tmp_path: Path) -> dict:
    workers = select_workers(config)
    figures = {}
    for name, line in COMMANDS.items():
        targets = emulated.targets(config, paths, workers, line)
        direct = targets[0]
        exec_argv = [
            *cli(),
            "local",
            "exec",
            "--config-file",
            str(stack),
            "--log-dir",
            str(tmp_path / "logs"),
            "--",
            line,
        ]
        runs: dict[str, list[float]] = {"first": [], "total": [], "direct": [], "fanout": []}
        for attempt in range(repeat + 1):
            first_s, total_s = first_line_and_exit(exec_argv, env, ROOT)
            _, direct_s = first_line_and_exit(list(direct.argv), direct.env or {}, direct.cwd or ROOT)
            start = time.perf_counter()
            run = run_all(targets, tmp_path / "fanout", lambda text: None)
            fanout_s = time.perf_counter() - start
            if run.failed:
                raise RuntimeError(f"fanout failed: {run.failed}")
            if attempt:  # the first run of each is untimed (bytecode, caches)
                for key, value in (("first", first_s), ("total", total_s), ("direct", direct_s), ("fanout", fanout_s)):
                    runs[key].append(value)
        med = {key: statistics.median(values) for key, values in runs.items()}
        figures[name] = {
            "exec_first_line_s": round(med["first"], 3),
            "exec_total_s": round(med["total"], 3),
            "direct_s": round(med["direct"], 3),
            "fanout_s": round(med["fanout"], 3),
            "overhead_per_worker_s": round((med["total"] - med["direct"]) / len(workers), 3),
            "fanout_overhead_per_worker_s": round((med["fanout"] - med["direct"]) / len(workers), 3),
            "exec_over_direct": round(med["total"] / med["direct"], 2),
            "fanout_over_direct": round(med["fanout"] / med["direct"], 2),
        }
    return figures


if __name__ == "__main__":
    main()

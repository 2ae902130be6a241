"""How long the ``multislice`` commands that neither train nor evaluate the program take on
this machine, against the 1.5 s target (issue 12: "every command that does not train or
evaluate the program returns in ≤ 1.5 s").

    uv run python benchmarks/cli_speed.py [--repeat 5] [--json]

Each figure is the wall time of the whole command as a user runs it (``.venv/bin/multislice``,
a fresh process: interpreter start, imports, work, exit), the median of ``--repeat`` runs
taken in turns after one untimed run of each (which compiles the bytecode a user's machine
has cached; kept in a temporary ``PYTHONPYCACHEPREFIX`` even where ``PYTHONDONTWRITEBYTECODE``
is set). ``local down`` finds nothing running (a private ``MULTISLICE_STATE_DIR``); the
typos are rejected before anything starts. ``check`` evaluates the program under mocks, so the
target does not apply to it; it is listed for comparison. The load average (1 min) is printed
before and after: on a shared machine, compare runs at similar load and run more than once.
Next to each wall time is the command's CPU time (user + system, its processes together): on a
loaded machine the wall time is the CPU time stretched by waiting for a core; on an idle one
the two are close.
tests/cli/test_light_imports.py checks that the light commands import no jax, orbax or tensorstore.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 1.5
STACK = ROOT / "tests" / "stacks" / "Pulumi.emu.yaml"

#: name → (argv after ``multislice``, whether the 1.5 s target applies).
COMMANDS: dict[str, tuple[list[str], bool]] = {
    "--help": (["--help"], True),
    "local up --help": (["local", "up", "--help"], True),
    "local down (nothing running)": (["local", "down"], True),
    "local up --kill typo": (["local", "up", "--config-file", str(STACK), "--kill", "x"], True),
    "local up --preempt out of range": (["local", "up", "--config-file", str(STACK), "--preempt", "9@1"], True),
    "plan": (["plan", "--stack", "prod"], True),
    "plan --json": (["plan", "--stack", "prod", "--json"], True),
    "render": (["render", "--stack", "prod"], True),
    "render --config": (["render", "--stack", "prod", "--config"], True),
    "check (evaluates the program)": (["check", "--stack", "prod"], False),
}


def cli() -> list[str]:
    local = ROOT / ".venv" / "bin" / "multislice"
    return [str(local)] if local.exists() else [shutil.which("multislice") or "multislice"]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of the command."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cli() + argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per command (median reported)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cli-speed-") as state:
        # A user's Python keeps the bytecode it compiled (__pycache__); an environment with
        # PYTHONDONTWRITEBYTECODE set (CI images, sandboxes) would compile every module from
        # source on every run. Keep it in a temporary prefix, filled by the untimed runs.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        env.update(MULTISLICE_STATE_DIR=state, PYTHONPYCACHEPREFIX=str(Path(state) / "bytecode"))
        load_before = os.getloadavg()[0]
        for argv, _ in COMMANDS.values():  # untimed: bytecode compiled, caches filled
            timed(argv, env)
        runs: dict[str, list[float]] = {name: [] for name in COMMANDS}
        cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
        for _ in range(args.repeat):
            for name, (argv, _) in COMMANDS.items():
                wall, seconds = timed(argv, env)
                runs[name].append(wall)
                cpu[name].append(seconds)
        load_after = os.getloadavg()[0]
    medians = {name: statistics.median(times) for name, times in runs.items()}
    cpu_medians = {name: statistics.median(times) for name, times in cpu.items()}
    if args.json:
        print(
            json.dumps(
                {
                    "target_s": TARGET_S,
                    "load_average_1min": [load_before, load_after],
                    "cpus": os.cpu_count(),
                    "median_s": medians,
                    "runs_s": runs,
                    "cpu_median_s": cpu_medians,
                },
                indent=2,
            )
        )
        return
    print(
        f"load average (1 min) {load_before:.1f} before, {load_after:.1f} after; {os.cpu_count()} CPUs; "
        f"median of {args.repeat} runs; target {TARGET_S} s"
    )
    for name, (_, applies) in COMMANDS.items():
        verdict = ("ok" if medians[name] <= TARGET_S else "OVER") if applies else "n/a"
        print(
            f"  {name:<34} {medians[name]:6.2f} s  {verdict}  "
            f"(min {min(runs[name]):.2f} s; CPU {cpu_medians[name]:.2f} s)"
        )
    over = [name for name, (_, applies) in COMMANDS.items() if applies and medians[name] > TARGET_S]
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()

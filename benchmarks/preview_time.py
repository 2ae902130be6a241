"""What ``pulumi preview`` costs in Python on this machine, in one run: the import floor, the
program's cold evaluation of each stack, their ratio, and a warm evaluation.

    uv run python benchmarks/preview_time.py [--repeat 3] [--bytecode cached|none] [--json]

* **import floor**: a fresh process that only imports ``pulumi``, ``pulumi.dynamic`` and the
  pulumi_gcp modules the program uses, touching each resource class the program registers
  (pulumi_gcp loads a subpackage lazily, on first attribute access: ``import
  pulumi_gcp.compute`` alone loads nothing). The classes are the ones the cold evaluation
  registered, so the floor follows the program.
* **cold evaluation** of a stack: a fresh process that evaluates the program the way the
  Python language host does (``runpy`` of ``infra/`` as ``__main__``) as a preview under the
  mocks harness the tests use (``tests/fakes/pulumi_program.py``), until every resource is
  registered.
* **warm evaluation** of a stack: the time to evaluate it as the second stack of a process
  that already evaluated another one (measured inside that process).

Floor and cold figures are the wall time of the whole process, spawn to exit (interpreter
start included in both), the median of ``--repeat`` runs taken in turns. Before them, one
untimed run of each process fills the caches a user's machine has from its previous preview:
the content cache (``infra.startup.content_cache``; a private ``MULTISLICE_CACHE_DIR``) and, with
``--bytecode cached`` (the default), compiled bytecode in a private ``PYTHONPYCACHEPREFIX``;
that first run is reported too. ``--bytecode none`` makes every process compile every module it
imports, floor and evaluation alike (``PYTHONDONTWRITEBYTECODE=1`` over an empty prefix),
which is what this machine's default environment does. The load average is printed with
the figures: on a shared machine, compare runs at similar load, and run more than once.

Targets (issue 13): cold evaluation ≤ 2 × the import floor for every stack; warm ≤ 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.config import available_stacks  # noqa: E402

COLD_RATIO_TARGET = 2.0
WARM_TARGET_S = 0.5

#: One cold evaluation: prints the pulumi_gcp resource types it registered.
EVALUATE = """
import json, sys
from tests.fakes import pulumi_program
world = pulumi_program.evaluate(sys.argv[1], preview=True, as_main=True)
print(json.dumps(sorted({r.typ for r in world.registrations if r.typ.startswith("gcp:")})))
"""

#: The floor: pulumi, pulumi.dynamic, and each pulumi_gcp class named by a type token
#: ``gcp:<module>/<member>:<Class>`` (``pulumi_gcp.<module>.<Class>``).
FLOOR = """
import sys
import pulumi, pulumi.dynamic, pulumi_gcp
for token in sys.argv[1:]:
    _, path, cls = token.split(":")
    getattr(getattr(pulumi_gcp, path.split("/")[0]), cls)
"""

#: Warm: evaluate one stack untimed, then time a second one in the same process (and the
#: part of that time the garbage collector spent in full, generation-2 collections).
WARM = """
import gc, json, sys, time
from tests.fakes import pulumi_program
pulumi_program.evaluate(sys.argv[1], preview=True, as_main=True)
full_gc = []
def watch(phase, info, clock=time.perf_counter):
    if info["generation"] == 2:
        full_gc.append(clock() if phase == "start" else clock() - full_gc.pop())
gc.callbacks.append(watch)
start = time.perf_counter()
pulumi_program.evaluate(sys.argv[2], preview=True, as_main=True)
print(json.dumps([time.perf_counter() - start, sum(full_gc)]))
"""


def run(code: str, args: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds of ``python -c code args`` (spawn to exit) in the checkout, and its stdout.

    Raises:
      RuntimeError: the process failed (its stderr is in the message).
    """
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"python -c ... {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return wall, out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""


def environment(bytecode: str, scratch: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["MULTISLICE_CACHE_DIR"] = str(scratch / "content-cache")
    env["PYTHONPYCACHEPREFIX"] = str(scratch / "bytecode")  # never the checkout's or the venv's __pycache__
    if bytecode == "none":
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # the prefix stays empty: every import compiles
    return env


def measure(stacks: list[str], repeat: int, bytecode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="preview-time-") as scratch:
        env = environment(bytecode, Path(scratch))
        first: dict[str, float] = {}
        types: set[str] = set()
        for stack in stacks:  # untimed: fills the content cache (and bytecode, when cached)
            first[stack], out = run(EVALUATE, [stack], env)
            types |= set(json.loads(out))
        floor_args = sorted(types)
        first_floor, _ = run(FLOOR, floor_args, env)
        floors: list[float] = []
        colds: dict[str, list[float]] = {stack: [] for stack in stacks}
        warms: dict[str, list[float]] = {stack: [] for stack in stacks}
        warm_gcs: dict[str, list[float]] = {stack: [] for stack in stacks}
        load_before = os.getloadavg()
        for _ in range(repeat):
            floors.append(run(FLOOR, floor_args, env)[0])
            for stack in stacks:
                colds[stack].append(run(EVALUATE, [stack], env)[0])
            for index, stack in enumerate(stacks):  # primed by another stack (itself if it is the only one)
                _, out = run(WARM, [stacks[index - 1], stack], env)
                seconds, full_gc = json.loads(out)
                warms[stack].append(seconds)
                warm_gcs[stack].append(full_gc)
        load_after = os.getloadavg()
    floor = statistics.median(floors)
    cold = {stack: statistics.median(samples) for stack, samples in colds.items()}
    warm = {stack: statistics.median(samples) for stack, samples in warms.items()}
    ratio = {stack: seconds / floor for stack, seconds in cold.items()}
    return {
        "bytecode": bytecode,
        "repeat": repeat,
        "floor_classes": floor_args,
        "floor_seconds": floor,
        "cold_seconds": cold,
        "cold_over_floor": ratio,
        "warm_seconds": warm,
        "warm_full_gc_seconds": {stack: statistics.median(samples) for stack, samples in warm_gcs.items()},
        "first_run_seconds": {"floor": first_floor, **first},
        "samples": {"floor": floors, "cold": colds, "warm": warms},
        "load_average": {"before": list(load_before), "after": list(load_after)},
        "cores": os.cpu_count(),
        "targets": {
            "cold_over_floor_max": COLD_RATIO_TARGET,
            "warm_seconds_max": WARM_TARGET_S,
            "cold_met": all(r <= COLD_RATIO_TARGET for r in ratio.values()),
            "warm_met": all(w <= WARM_TARGET_S for w in warm.values()),
        },
    }


def report(result: dict) -> str:
    modules = sorted({token.split(":")[1].split("/")[0] for token in result["floor_classes"]})
    load = result["load_average"]
    mode = (
        "cached (a private PYTHONPYCACHEPREFIX, filled by the first run)"
        if result["bytecode"] == "cached"
        else "none (every process compiles every module it imports)"
    )
    lines = [
        f"pulumi preview in Python: {result['cores']} cores, "
        f"load average {load['before'][0]:.2f} → {load['after'][0]:.2f}, "
        f"bytecode {mode}, median of {result['repeat']} runs",
        f"  import floor              {result['floor_seconds']:6.2f} s   pulumi, pulumi.dynamic, pulumi_gcp "
        f"{', '.join(modules)} ({len(result['floor_classes'])} resource classes)",
    ]
    for stack, seconds in result["cold_seconds"].items():
        lines.append(
            f"  cold evaluation {stack:9s} {seconds:6.2f} s   {result['cold_over_floor'][stack]:.2f} × floor   "
            f"(first run, empty caches: {result['first_run_seconds'][stack]:.2f} s)"
        )
    warm = ", ".join(
        f"{stack} {seconds:.3f} s (full GC {result['warm_full_gc_seconds'][stack]:.3f} s)"
        for stack, seconds in result["warm_seconds"].items()
    )
    lines.append(f"  warm evaluation (the second stack of a process): {warm}")
    targets = result["targets"]
    lines.append(
        f"  targets (issue 13): cold ≤ {targets['cold_over_floor_max']:g} × floor for every stack: "
        f"{'met' if targets['cold_met'] else 'NOT met'}; warm ≤ {targets['warm_seconds_max']:g} s: "
        f"{'met' if targets['warm_met'] else 'NOT met'}"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs of each process (median)")
    parser.add_argument("--bytecode", choices=("cached", "none"), default="cached")
    parser.add_argument("--stack", action="append", help="stack to evaluate (repeatable; default: every stack)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    stacks = args.stack or available_stacks()
    result = measure(stacks, args.repeat, args.bytecode)
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

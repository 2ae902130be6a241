"""The badput of one restart on the gke backend beside the queued resource's: the tests' emu stack as
2 slices × 2 workers (v4-16) on each backend, slice 1 preempted at step 12, run alternately.

    uv run --frozen python benchmarks/restart_by_backend.py [--repeat 2] [--json]

Each run is ``multislice local up --config-file <copy> --fresh --preempt 1@12`` with its own state
directory (benchmarks/goodput.py's helpers). On the queued resource the repair recreates slice 1's VMs
and restarts slice 0's (their disks kept); on gke JobSet recreates every Pod, slice 1's on new nodes,
slice 0's on their nodes, whose cache of releases and virtualenvs (a hostPath) they find again. It
prints, per backend and run, the restart's badput by cause (``per_attempt`` of the second start:
``boot`` is from the first attempt's last record to the second one's process start), the whole run's
badput per start, and the order of runs (A B A B: a ratio survives a loaded machine, an absolute time
does not). The emulation builds no virtualenv (``MULTISLICE_PYTHON``), so the cache here saves only the
release's unpacking; the virtualenv build it also saves on a TPU VM is measured apart (docs/goodput.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.goodput import one_run  # noqa: E402

STACK = ROOT / "tests" / "stacks" / "Pulumi.emu.yaml"
#: The emu stack as 2 slices × 2 workers (what GKE takes: multi-host slices), on either backend.
MULTI_HOST = (
    ("  multislice:acceleratorType: v4-8\n", "  multislice:acceleratorType: v4-16\n"),
    ("ici: {data: 1, fsdp: 4, tensor: 1}", "ici: {data: 1, fsdp: 8, tensor: 1}"),
    ("global_batch_size: 8", "global_batch_size: 16"),
)
ON_GKE = (("  multislice:capacity: spot\n", "  multislice:capacity: spot\n  multislice:backend: gke\n"),)
PREEMPT = "1@12"


def stack_file(state_dir: Path, backend: str) -> Path:
    """The emu stack's copy for ``backend`` in ``state_dir`` (its name stays ``emu``)."""
    text = STACK.read_text()
    for old, new in (*MULTI_HOST, *(ON_GKE if backend == "gke" else ())):
        assert old in text, old
        text = text.replace(old, new)
    path = state_dir / "stack" / STACK.name
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def measure(backend: str) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"restart-{backend}-") as folder:
        state = Path(folder)
        up = ["local", "up", "--config-file", str(stack_file(state, backend)), "--fresh", "--preempt", PREEMPT]
        result = one_run(state, up)
    restart = result["per_attempt"][1]["badput"] if len(result["per_attempt"]) > 1 else {}
    return {
        "backend": backend,
        "restart_badput_s": {cause: round(seconds, 2) for cause, seconds in restart.items() if seconds},
        "restart_total_s": round(sum(restart.values()), 2),
        "badput_seconds_per_start": result["badput_seconds_per_start"],
        "goodput": result["goodput"],
        "restarts": result["restarts"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="The badput of one restart on gke beside the queued resource's.")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = [measure(backend) for _ in range(args.repeat) for backend in ("queued-resource", "gke")]
    if args.json:
        print(json.dumps(runs, indent=2))
        return
    for run in runs:
        print(
            f"{run['backend']:>16}: restart badput {run['restart_total_s']:.2f} s {run['restart_badput_s']}; "
            f"badput per start {run['badput_seconds_per_start']} s; goodput {run['goodput']:.3f}"
        )
    for backend in ("queued-resource", "gke"):
        mean = sum(r["restart_total_s"] for r in runs if r["backend"] == backend) / args.repeat
        print(f"mean restart badput, {backend}: {mean:.2f} s")


if __name__ == "__main__":
    main()

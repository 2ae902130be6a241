"""Shardings efficiency on this machine, in one run: one process with one device, then the
same per-device work on 2 emulated slices (one CPU process per slice, jax.distributed on
127.0.0.1, data parallelism over the emulated DCN).

    uv run python benchmarks/shardings_efficiency.py [--embedding-dimension 1024] [--json]

Each figure is ``training.bench.shardings``'s efficiency: aggregate achieved FLOP/s (6 · parameters ·
batch per step) ÷ the FLOP/s of one large matmul of the layer's shape in one process using
the whole machine, measured in the same run just before and after (the median of all
those samples, as the step time is the median of the timed steps).
Throughput on a CPU says nothing about TPUs; the ratios say what the sharding costs on the
same hardware (docs/jax-on-cpu.md, "Throughput"). Targets (issue 4): ≥ 0.8 for one process, ≥ 0.6 for 2 emulated
slices. The machine's load average is printed with the figures: on a shared machine,
compare runs at similar load, and run more than once. A run whose before/after reference
matmuls differ more than ``training.bench.reference.REFERENCE_SPREAD_LIMIT`` (1.5×), or whose efficiency
exceeds 1, is reported as too noisy to judge, with the warning.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.local import bench_slices  # noqa: E402
from training.bench.spec import spec_from_options  # noqa: E402
from training.warning_text import as_line as warning_line  # noqa: E402

TARGETS = {"one process, one device": 0.8, "2 emulated slices": 0.6}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--embedding-dimension", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=1024, help="rows per device")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    os.environ.pop("JAX_NUM_CPU_DEVICES", None)  # one device in this process (infra.local.bench_slices.run)
    os.environ["JAX_PLATFORMS"] = "cpu"
    size = {
        "batch_size": args.batch_size,
        "embedding_dimension": args.embedding_dimension,
        "layers": args.layers,
        "steps": args.steps,
        "warmup": args.warmup,
    }
    runs = {
        "one process, one device": spec_from_options(**size),
        "2 emulated slices": spec_from_options(dcn_data=2, **size),
    }
    results = {}
    start = time.perf_counter()
    for name, spec in runs.items():
        load = os.getloadavg()
        print(f"{name}: running (load average {load[0]:.2f})", file=sys.stderr, flush=True)
        results[name] = bench_slices.run(
            spec, timeout_s=args.timeout, report=lambda line: print(f"  {line}", file=sys.stderr)
        )
        results[name]["load_average_before"] = list(load)
    wall = time.perf_counter() - start
    if args.json:
        print(json.dumps({"results": results, "wall_seconds": wall}, indent=2))
        return 0
    print(
        f"shardings efficiency: {args.layers} MLP layers, E {args.embedding_dimension}, "
        f"batch {args.batch_size} rows per device, float32 on CPU ({os.cpu_count()} cores), {wall:.0f} s in all"
    )
    for name, result in results.items():
        ref = result["reference"]["tflops_before_after"]
        if not result["efficiency_trusted"]:
            verdict = "too noisy to judge against"
        else:
            verdict = "meets" if result["efficiency"] >= TARGETS[name] else "BELOW"
        print(
            f"  {name:24s} efficiency {result['efficiency']:.3f} ({verdict} the {TARGETS[name]} target)  "
            f"{result['tflops_per_device'] * 1e3:.1f} GFLOP/s per device, step {result['step_seconds']:.3f} s; "
            f"reference {result['reference_tflops'] * 1e3:.1f} GFLOP/s (before/after "
            f"{ref[0] * 1e3:.1f}/{ref[1] * 1e3:.1f}, spread {result['reference']['spread']:.2f}×); "
            f"load {result['load_average_before'][0]:.2f}"
        )
        for warning in result["warnings"]:
            print(f"    {warning_line(warning)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

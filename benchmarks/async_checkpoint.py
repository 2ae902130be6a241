"""Async checkpoint overhead at the default model size (issue 14's target: ≤ 5 % of step time).

    uv run --frozen python benchmarks/async_checkpoint.py
        [--steps 16] [--interval 4] [--stack dev] [--repeat 1] [--json]

In one process (one CPU device, this machine), the trainer (``training.train.run``) trains
the default ``TrainConfig`` model twice per repeat, in turns, each in a fresh local run
directory: once saving only at its last step ("none") and once saving asynchronously every
``--interval`` steps ("async", Orbax ``enable_async_checkpointing``). From each run's records:
time per step = (Σ ``step_time_s`` of steps 2..N, compile excluded, + Σ ``save_s``, the
blocking part of each save before the last) ÷ (N − 1): the background writes slow the steps
they overlap, and the steps' own times show it. Overhead = async ÷ none − 1, printed per step
at ``--interval`` and amortized to the default ``checkpoint.interval_steps`` (50) as
overhead × interval ÷ 50. The load average is printed: rerun on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training import train  # noqa: E402
from training.cluster import ClusterIdentity  # noqa: E402
from training.config import CheckpointConfig, TrainConfig  # noqa: E402
from training.metrics.run_log import read_records  # noqa: E402
from training.run_dir import RunDir  # noqa: E402

DEFAULT_INTERVAL = CheckpointConfig().interval_steps
TARGET = 0.05


def per_step_seconds(base: TrainConfig, steps: int, interval: int, save: bool) -> dict:
    """Train ``steps`` steps of ``base`` in a fresh run directory; seconds per step and per-save figures."""
    config = base.model_copy(
        update={"steps": steps, "checkpoint": CheckpointConfig(interval_steps=interval if save else steps + 1)}
    )
    with tempfile.TemporaryDirectory(prefix="async-ckpt-") as tmp:
        result = train.run(config, tmp, ClusterIdentity.single_process())
        assert result.exit_code == train.EXIT_COMPLETE, result
        run = RunDir(tmp)
        metrics = [m for m in read_records(run, "metrics") if "step_time_s" in m]
        saves = [e for e in read_records(run, "events") if e.get("event") == "checkpoint" and e["step"] < steps]
    busy = sum(m["step_time_s"] for m in metrics[1:]) + sum(e["save_s"] for e in saves)
    return {
        "seconds_per_step": busy / (len(metrics) - 1),
        "median_step_s": statistics.median(m["step_time_s"] for m in metrics[1:]),
        "saves": len(saves),
        "blocking_save_s": [e["save_s"] for e in saves],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--interval", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--stack",
        help="Train this stack's model, sequence length and batch (one device) instead of the default TrainConfig.",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    base = TrainConfig()
    if args.stack:
        from infra.config import load_stack

        base = load_stack(args.stack).training.model_copy(update={"parallelism": TrainConfig().parallelism})
    logging.basicConfig(level=logging.WARNING)
    runs = []
    for _ in range(args.repeat):
        load = os.getloadavg()
        none = per_step_seconds(base, args.steps, args.interval, save=False)
        saving = per_step_seconds(base, args.steps, args.interval, save=True)
        overhead = saving["seconds_per_step"] / none["seconds_per_step"] - 1
        runs.append(
            {
                "none": none,
                "async": saving,
                "overhead": overhead,
                "overhead_at_default_interval": overhead * args.interval / DEFAULT_INTERVAL,
                "load_average": [round(x, 1) for x in (*load, *os.getloadavg())],
            }
        )
    if args.json:
        print(
            json.dumps(
                {"model": base.model.model_dump(), "steps": args.steps, "interval": args.interval, "runs": runs},
                indent=2,
            )
        )
        return
    for run in runs:
        print(
            f"time per step: none {run['none']['seconds_per_step']:.3f} s, async saves every {args.interval} steps "
            f"{run['async']['seconds_per_step']:.3f} s (blocking part per save: "
            f"{', '.join(f'{s:.3f}' for s in run['async']['blocking_save_s'])} s)\n"
            f"overhead {run['overhead']:+.1%} of step time at interval {args.interval}; "
            f"{run['overhead_at_default_interval']:+.2%} amortized to the default interval {DEFAULT_INTERVAL} "
            f"(target ≤ {TARGET:.0%}); load average before/after {run['load_average']}"
        )


if __name__ == "__main__":
    main()

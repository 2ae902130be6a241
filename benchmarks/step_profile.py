"""The compiled train step alone: its step times and, with ``--trace``, where they go.

    uv run --frozen python benchmarks/step_profile.py [--preset smollm2-135m] [--layers 4]
        [--dtype bfloat16] [--batch 8] [--steps 8] [--trace] [--top 25]

Builds the train step exactly as the trainer does (``training.aot.lower_train_step``: the
config's mesh on this process's devices, the optimizer, the state shardings), compiles it, and
runs it ``--steps`` times on the preset's initial parameters and one fixed random batch of
``--batch`` × 257 tokens (sequence 256), printing each step's wall time and the median of all
but the first (the first runs right after the compile, with cold buffers). No data pipeline,
metrics or checkpoints: for A/B comparisons of the step's program, run two versions of the code
alternately on the same machine (on a shared machine the run-to-run spread is large).

``--trace`` then runs three more steps under ``jax.profiler`` with a Perfetto trace
(https://docs.jax.dev/en/latest/profiling.html) and prints the ``--top`` operations by time per
step, as XLA's CPU runtime names them (its fusions, e.g. ``ynn_fusion.12``: a dot run by
YNNPACK), with the op's HLO from the compiled module's text. Two operations can run at once
(XLA's CPU runtime runs independent ones concurrently), so their times can add up to more than
the step. Like ``python -m training run``, the script re-executes itself with glibc's huge-page
tunable (``training.host_allocator``).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training import host_allocator  # noqa: E402

if __name__ == "__main__":
    host_allocator.reexec_with_tunable()

import jax  # noqa: E402
import numpy as np  # noqa: E402

from training import aot, optimizer as optimizer_lib, state as state_lib  # noqa: E402
from training.config import TrainConfig  # noqa: E402


def top_ops(trace_dir: Path, hlo: str, steps: int, top: int) -> list[str]:
    """Lines ``"<ms per step>  x<calls per step>  <name>: <its HLO>"`` of the ``top`` XLA
    operations by total duration in the Perfetto trace under ``trace_dir``."""
    trace_file = next(trace_dir.rglob("*.trace.json.gz"))
    events = json.loads(gzip.decompress(trace_file.read_bytes()))["traceEvents"]
    total: collections.Counter[str] = collections.Counter()
    calls: collections.Counter[str] = collections.Counter()
    for event in events:
        name = event.get("name", "")
        if event.get("ph") == "X" and not name.startswith(("ThunkExecutor", "SlinkyThreadPool", "$")):
            total[name] += event["dur"]
            calls[name] += 1
    lines = []
    for name, micros in total.most_common(top):
        found = re.search(rf"%{re.escape(name)} = ([^\n]*?)(?:, metadata=|\n)", hlo)
        text = found.group(1)[:140] if found else ""
        lines.append(f"{micros / steps / 1000:9.1f} ms  x{calls[name] // steps:<3d} {name}: {text}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--layers", type=int, default=4, help="Layers of the preset (its own count if 0).")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--batch", type=int, default=8, help="Sequences per step (256 tokens each).")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    model_keys: dict[str, object] = {"preset": args.preset, "compute_dtype": args.dtype}
    if args.layers:
        model_keys["n_layers"] = args.layers
    config = TrainConfig.model_validate({"model": model_keys, "global_batch_size": args.batch})
    started = time.perf_counter()
    compiled = aot.lower_train_step(config).compile()
    print(f"compiled in {time.perf_counter() - started:.1f} s")
    opt, _ = optimizer_lib.make_optimizer(config.optimizer, config.steps)
    state = jax.jit(state_lib.initializer(config, opt))()
    rows = np.random.default_rng(0).integers(0, config.vocab_size, (args.batch, config.sequence_length + 1))
    batch = jax.numpy.asarray(rows, dtype=jax.numpy.int32)
    times = []
    for _ in range(args.steps):
        started = time.perf_counter()
        state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - started)
    print("step times (s):", " ".join(f"{t:.3f}" for t in times))
    if len(times) > 1:
        print(f"median after the first: {statistics.median(times[1:]):.3f} s")
    if args.trace:
        with tempfile.TemporaryDirectory(prefix="step-profile-") as tmp:
            jax.profiler.start_trace(tmp, create_perfetto_trace=True)
            for _ in range(3):
                state, metrics = compiled(state, batch)
                jax.block_until_ready(metrics)
            jax.profiler.stop_trace()
            print(f"top {args.top} operations, per step (3 traced steps):")
            print("\n".join(top_ops(Path(tmp), compiled.as_text(), 3, args.top)))


if __name__ == "__main__":
    main()

"""Trainer efficiency: the trainer's model FLOP/s ÷ a matmul's FLOP/s, in the same run.

    uv run --frozen python benchmarks/trainer_efficiency.py [--models byte,smollm2-135m]
        [--dtypes bfloat16,float32] [--steps 12] [--smollm-layers 4] [--stack dev] [--repeat 1] [--json]

In one process on one device (this machine's CPU, or the accelerator JAX finds), the
trainer (``training.train.run``) trains each model in each compute dtype in a fresh local run
directory: ``byte``, the default ``TrainConfig`` (4 layers, batch 32 × 256 tokens), and
``smollm2-135m``, the ~125M preset (``training.model.presets``: width 576, 9/3 heads, SwiGLU 1,536,
vocabulary 49,152, tied) with ``--smollm-layers`` of its 30 layers (default 4: a full-depth
step takes tens of seconds on a 2-core CPU; the layers are identical, so depth changes the
step's length, not its mix of work, apart from the unembedding's share) at 8 × 256 tokens.
Model FLOP/s = :func:`training.model.transformer.flops_per_token` (6·N + 12·L·H·K·S: PaLM, Chowdhery et
al. 2022, arXiv:2204.02311, Appendix B) × tokens per step ÷ the median ``step_time_s`` of the
steps after the first (compile excluded); the spread of those steps is the slowest ÷ the
fastest. The reference is :func:`training.bench.reference.matmul_reference` of the model's MLP matmul,
``[batch·sequence, d_model] · [d_model, d_ff]`` in the model's compute dtype with float32
accumulation (the form of the trainer's own weight matmuls), timed just before and just after
the training (median of both), on the same device; the plain matmul in the compute dtype
(``a @ b``, the reference before the trainer's matmuls accumulated in float32 explicitly; on
this CPU the bfloat16 one is about half as fast) is timed too and its ratio printed beside.
The ratio says how much of
what this device does on one large matmul the whole training step achieves (attention, norms,
the optimizer, the data pipeline and the metrics included). The load average is printed:
rerun on a quiet machine. ``--stack`` trains that stack's model, sequence length and batch
instead (one device). Like ``python -m training run``, the benchmark re-executes itself with
glibc's huge-page tunable (``training.host_allocator``); ``GLIBC_TUNABLES=glibc.malloc.hugetlb=0``
measures without it.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from training import host_allocator  # noqa: E402

if __name__ == "__main__":  # measure the trainer with the allocator `python -m training run` gives it
    host_allocator.reexec_with_tunable()

import jax  # noqa: E402
from jax.experimental.compilation_cache import compilation_cache as jax_compilation_cache  # noqa: E402

from training import train  # noqa: E402
from training.bench import reference  # noqa: E402
from training.cluster import ClusterIdentity  # noqa: E402
from training.config import CheckpointConfig, TrainConfig  # noqa: E402
from training.metrics.run_log import read_records  # noqa: E402
from training.model import transformer as model  # noqa: E402
from training.run_dir import RunDir  # noqa: E402
from training.warning_text import as_line as warning_line  # noqa: E402


def measure(base: TrainConfig, steps: int) -> dict:
    config = base.model_copy(update={"steps": steps, "checkpoint": CheckpointConfig(interval_steps=steps + 1)})
    rows, d, f = config.global_batch_tokens, config.model.d_model, config.model.ff_width
    dtype = config.model.compute_dtype

    def references() -> tuple[dict, dict]:
        return (
            reference.matmul_reference(rows, d, f, dtype, steps=10, warmup=2, accumulation_dtype="float32"),
            reference.matmul_reference(rows, d, f, dtype, steps=10, warmup=2),
        )

    before, plain_before = references()
    with tempfile.TemporaryDirectory(prefix="trainer-efficiency-") as tmp:
        result = train.run(config, tmp, ClusterIdentity.single_process())
        assert result.exit_code == train.EXIT_COMPLETE, result
        step_times = [m["step_time_s"] for m in read_records(RunDir(tmp), "metrics") if "step_time_s" in m][1:]
        after, plain_after = references()  # JAX's compile cache is still in tmp
    # The run pointed JAX's persistent cache into tmp, now gone: the next repeat's compiles
    # would warn that they cannot write there.
    jax.config.update("jax_compilation_cache_dir", None)
    jax_compilation_cache.reset_cache()
    step_s = statistics.median(step_times)
    step_spread = max(step_times) / min(step_times)
    model_rate = (
        model.flops_per_token(config.model, config.sequence_length, config.vocab_size)
        * config.global_batch_tokens
        / step_s
    )
    matmul_rate = 2.0 * rows * d * f / statistics.median(before["times"] + after["times"])
    plain_rate = 2.0 * rows * d * f / statistics.median(plain_before["times"] + plain_after["times"])
    check = reference.reference_check(
        [2.0 * rows * d * f / r["seconds"] for r in (before, after)], model_rate / matmul_rate
    )
    return {
        "platform": before["platform"],
        "dtype": dtype,
        "matmul_shape": [rows, d, f],
        "median_step_s": step_s,
        "step_spread": step_spread,
        "timed_steps": len(step_times),
        "model_tflops": model_rate / 1e12,
        "matmul_tflops": matmul_rate / 1e12,
        "ratio": model_rate / matmul_rate,
        "plain_matmul_tflops": plain_rate / 1e12,
        "ratio_to_plain_matmul": model_rate / plain_rate,
        "reference_spread": check["spread"],
        "warnings": check["warnings"],
    }


#: Sequences per step of each model (sequence length 256, the TrainConfig default).
BATCH = {"byte": 32, "smollm2-135m": 8}


def configs(models: list[str], dtypes: list[str], smollm_layers: int) -> dict[str, TrainConfig]:
    """``"model/dtype" -> TrainConfig`` for each model and compute dtype (module docstring)."""
    out = {}
    for name in models:
        model: dict[str, object] = {} if name == "byte" else {"preset": name}
        if name == "smollm2-135m":
            model["n_layers"] = smollm_layers
        for dtype in dtypes:
            out[f"{name}/{dtype}"] = TrainConfig.model_validate(
                {"model": model | {"compute_dtype": dtype}, "global_batch_size": BATCH.get(name, 32)}
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--models", default="byte,smollm2-135m", help="Comma-separated: byte, smollm2-135m.")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="Comma-separated compute dtypes.")
    parser.add_argument("--smollm-layers", type=int, default=4, help="Layers of smollm2-135m (30 in the preset).")
    parser.add_argument(
        "--stack",
        help="Train this stack's model, sequence length and batch (one device) instead of the default TrainConfig.",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.stack:
        from infra.config import load_stack

        stack = load_stack(args.stack).training.model_copy(update={"parallelism": TrainConfig().parallelism})
        bases = {args.stack: stack}
    else:
        bases = configs(args.models.split(","), args.dtypes.split(","), args.smollm_layers)
    logging.basicConfig(level=logging.WARNING)
    runs = []
    for name, base in bases.items():
        for _ in range(args.repeat):
            load = os.getloadavg()
            run = measure(base, args.steps)
            runs.append(
                {"name": name}
                | run
                | {
                    "load_average": [round(x, 1) for x in (*load, *os.getloadavg())],
                    # The allocator's settings change the step (docs/model.md): say which ran.
                    "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
                }
            )
            if not args.json:
                print(line(runs[-1]), flush=True)
    if args.json:
        print(json.dumps({"models": {n: b.model.model_dump() for n, b in bases.items()}, "runs": runs}, indent=2))


def line(run: dict) -> str:
    rows, d, f = run["matmul_shape"]
    return (
        f"{run['name']} on {run['platform']}: trainer {run['model_tflops']:.4g} TFLOP/s "
        f"(median step {run['median_step_s']:.3f} s of {run['timed_steps']}, spread {run['step_spread']:.2f}) ÷ "
        f"matmul [{rows}, {d}]·[{d}, {f}] {run['dtype']} (float32 accumulation) {run['matmul_tflops']:.4g} TFLOP/s "
        f"= {run['ratio']:.3f} (reference spread {run['reference_spread']:.2f}; against the plain "
        f"{run['dtype']} matmul, {run['plain_matmul_tflops']:.4g} TFLOP/s: {run['ratio_to_plain_matmul']:.3f}); "
        f"load average before/after {run['load_average']}"
        + (f"; GLIBC_TUNABLES={run['glibc_tunables']}" if run.get("glibc_tunables") else "")
        + "".join(f"\n  {warning_line(w)}" for w in run["warnings"])
    )


if __name__ == "__main__":
    main()

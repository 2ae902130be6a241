"""The reference matmul: the capacity the shardings benchmark (:mod:`training.bench.shardings`) is
judged against, and whether a run's reference can be trusted.

One large matmul of the benchmark's own layer shape (``[rows, E] · [E, 4E]``, same dtype, compiled
and warmed up the same way), timed :data:`REFERENCE_SAMPLES` times just before and again just after
the benchmark; its rate is the median of those samples. :func:`reference_check` says whether the
before and after medians agree well enough (:data:`REFERENCE_SPREAD_LIMIT`) for an efficiency
against them to mean anything. ``benchmarks/trainer_efficiency.py`` uses the same reference for the
trainer's model. This module ships to the TPU VMs: it imports nothing from ``infra``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from training.bench.spec import BenchSpec
from training.warning_text import WarningText, act

#: Timed reference matmuls before, and again after, the benchmark (at least ``--steps``).
REFERENCE_SAMPLES = 10
#: Largest spread (faster ÷ slower median) of the before and after reference matmuls for which
#: the efficiency is trusted. A heuristic of this benchmark, not from a document: a machine
#: whose matmul speed changes by half within one run (other load, frequency scaling) gives a
#: reference that does not say what capacity the benchmark had.
REFERENCE_SPREAD_LIMIT = 1.5


def timed_calls(fn: Callable[[], Any], steps: int, warmup: int) -> list[float]:
    """Wall seconds of ``steps`` calls of ``fn`` (each blocked until ready) after ``warmup``."""
    import jax

    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return times


def matmul_reference(
    rows: int,
    k: int,
    n: int,
    dtype: str,
    *,
    steps: int = 5,
    warmup: int = 2,
    device: Any = None,
    accumulation_dtype: str | None = None,
) -> dict[str, Any]:
    """FLOP/s of one ``[rows, k] · [k, n]`` matmul on one device (``jax.devices()[0]`` by
    default), median of ``steps`` timed calls after ``warmup``.

    Both operands are in ``dtype``, and so is the product. ``accumulation_dtype`` None: the
    product is ``a @ b``, accumulated as XLA chooses for ``dtype``; ``"float32"``: the dot
    accumulates in float32 (``preferred_element_type``) and is rounded to ``dtype``, as the
    trainer's weight matmuls are (``training.model.transformer``; on XLA's CPU backend this is the form
    that reaches its bfloat16 dot kernels).

    Returns:
      ``{"flops_per_second", "seconds" (median), "times", "shape", "dtype",
      "accumulation_dtype", "platform"}``.
    """
    import jax
    import jax.numpy as jnp

    device = device if device is not None else jax.local_devices()[0]
    dt = jnp.dtype(dtype)
    kx, kw = jax.random.split(jax.random.key(1))
    x = jax.device_put(jax.random.normal(kx, (rows, k), dt), device)
    w = jax.device_put(jax.random.normal(kw, (k, n), dt), device)
    if accumulation_dtype is None:
        matmul = jax.jit(lambda a, b: a @ b)
    else:
        acc = jnp.dtype(accumulation_dtype)
        matmul = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=acc).astype(dt))
    times = timed_calls(lambda: matmul(x, w), steps, warmup)
    seconds = statistics.median(times)
    return {
        "flops_per_second": 2.0 * rows * k * n / seconds,
        "seconds": seconds,
        "times": times,
        "shape": [rows, k, n],
        "dtype": dtype,
        "accumulation_dtype": accumulation_dtype,
        "platform": device.platform,
    }


def reference_rows(spec: BenchSpec, platform: str) -> int:
    """Rows of the reference matmul: the global batch on CPU (the whole machine is the unit),
    one device's rows on an accelerator (one chip is the unit)."""
    return spec.global_batch if platform == "cpu" else spec.batch_size


def reference_check(
    rates: Sequence[float], efficiency: float, *, limit: float = REFERENCE_SPREAD_LIMIT
) -> dict[str, Any]:
    """Whether an efficiency can be trusted, from the reference matmul rates measured before
    and after the benchmark.

    Args:
      rates: FLOP/s (any one unit) of each reference run, e.g. the before and after medians;
        all positive.
      efficiency: aggregate FLOP/s ÷ the reference capacity (dimensionless).
      limit: largest trusted spread (:data:`REFERENCE_SPREAD_LIMIT`).

    Returns:
      ``{"spread": max(rates) / min(rates), "trusted": bool, "warnings": [str, ...]}``: not
      trusted, with one warning each, when the spread exceeds ``limit`` or the efficiency
      exceeds 1 (a sharded step faster than one large matmul of its own layer shape on the
      same hardware means the reference understated the capacity).

    Raises:
      ValueError: no rates, or a rate that is not positive.
    """
    if not rates or min(rates) <= 0:
        raise ValueError(f"reference rates must be positive; got {list(rates)!r}")
    spread = max(rates) / min(rates)
    warnings: list[WarningText] = []
    if spread > limit:
        warnings.append(
            act(
                f"the reference matmuls before and after the benchmark differ {spread:.2f}× (more than {limit:g}×): "
                "the machine's speed changed during the run, so the efficiency is too noisy to trust",
                "rerun on a quieter machine",
                when="you rely on the efficiency",
            )
        )
    if efficiency > 1:
        warnings.append(
            act(
                f"efficiency {efficiency:.3f} is above 1: the benchmark outran one large matmul of its own layer "
                "shape, so the reference understated the machine's capacity; the efficiency is too noisy to trust",
                "rerun it",
                when="you rely on the efficiency",
            )
        )
    return {"spread": spread, "trusted": not warnings, "warnings": warnings}

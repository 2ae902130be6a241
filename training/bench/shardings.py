"""The shardings benchmark: what a (dcn × ici) mesh achieves on an MLP stack.

The MLP-stack experiment of the Cloud TPU Multislice overview
(https://cloud.google.com/tpu/docs/multislice-introduction), MaxText's
``pedagogical_examples/shardings.py``
(https://github.com/AI-Hypercomputer/maxtext/blob/main/pedagogical_examples/shardings.py;
FSDP 4-way on v4-8, batch 131072, embedding 2048: about 260 TFLOP/s per chip there):
``layers`` MLP blocks ``x → relu(x·W_in) → relu(·W_out)`` with
``W_in`` ``[E, 4E]`` and ``W_out`` ``[4E, E]``, ``value_and_grad`` of the sum of the output and
an SGD update, all under one ``jax.jit``, over the hybrid mesh of ``training.mesh.build_mesh``
with the trainer's sharding rules (``embed`` over fsdp, ``mlp`` over tensor, the batch over
data × fsdp).

Figures (all measured in the same run):

* FLOPs per step = 6 · parameters · global batch rows (shardings.py's formula; parameters =
  ``2 · E · 4E · layers``, global batch = ``--batch-size`` per device × devices). It counts
  the input gradient of the first matmul, which autodiff never computes (x is data), so
  it overstates the work by ``1 / (12 · layers)`` (2 % at 4 layers).
* ``tflops_per_device`` = FLOPs per step ÷ median step time ÷ devices ÷ 1e12.
* ``efficiency`` = aggregate achieved FLOP/s ÷ the reference capacity, where the reference is
  one large matmul of the benchmark's own layer shape (``[rows, E] · [E, 4E]``, same dtype,
  compiled and warmed up the same way; :mod:`training.bench.reference`), timed
  :data:`REFERENCE_SAMPLES` times just before and again just after the benchmark; its rate is
  the median of all those samples, as the step time is the median of the timed steps. Medians on
  both sides, pooled over the span of the run, keep the ratio fair on a shared machine: the best
  of many short matmuls would catch quiet moments that multi-second steps cannot;

  - on CPU, one process using the whole machine (the launching process, while no emulated
    slice runs, when the slices are emulated), over the global batch rows: emulated devices
    and processes share the machine, so the ratio says what the sharding costs on the same
    hardware;
  - on an accelerator, one chip over its per-device rows, times the number of devices.

* ``reference.spread`` = the faster ÷ the slower of the before and after reference medians.
  Above :data:`training.bench.reference.REFERENCE_SPREAD_LIMIT` the machine's speed changed during the run, and an
  efficiency above 1 means the reference understated the capacity the benchmark had: either
  way ``efficiency_trusted`` is False and ``warnings`` (also printed by :func:`summary`) says
  the efficiency is too noisy to trust (:func:`training.bench.reference.reference_check`).

Where it runs:

* a single process (CPU with emulated devices, one GPU, one TPU VM): in-process;
* on a TPU multislice or multi-host slice, every worker runs the same command with
  ``--from-metadata`` (identity from TPU metadata, as ``python -m training run``);
* ``dcn > 1`` without TPU slices: ``multislice bench shardings`` emulates the slices as
  local CPU processes (``infra.local.bench_slices``), each calling :func:`measure_shardings`.

The benchmark's definition and command-line options are :mod:`training.bench.spec`. This
module ships to the TPU VMs: it imports nothing from ``infra``.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from training.bench.reference import (
    REFERENCE_SAMPLES,
    REFERENCE_SPREAD_LIMIT,
    matmul_reference,
    reference_check,
    reference_rows,
    timed_calls,
)
from training.bench.spec import BenchConfigError, BenchSpec
from training.config import MESH_AXES
from training.warning_text import as_line

#: Learning rate of the benchmark's SGD update (its value does not change the work).
SGD_LEARNING_RATE = 1e-4


class BenchError(RuntimeError):
    """The benchmark run failed (a child crashed, timed out, or the mesh could not be built)."""


# --- measurements (in-process) ---------------------------------------------------------------


def measure_shardings(spec: BenchSpec, mesh: Any, dtype: str) -> dict[str, Any]:
    """Time the MLP training step of ``spec`` on ``mesh`` (every process of the job calls it).

    Returns:
      ``{"step_seconds" (median), "step_times", "flops_per_second" (aggregate)}``.
    """
    import jax
    import jax.numpy as jnp

    from training import mesh as mesh_lib

    dt = jnp.dtype(dtype)
    e, f = spec.embedding_dimension, spec.ff_width
    w_in_sharding = mesh_lib.sharding_for(mesh, ("embed", "mlp"))
    w_out_sharding = mesh_lib.sharding_for(mesh, ("mlp", "embed"))
    x_sharding = mesh_lib.sharding_for(mesh, ("batch", "activation_embed"))
    param_shardings = [{"w_in": w_in_sharding, "w_out": w_out_sharding} for _ in range(spec.layers)]

    def init_params():
        keys = jax.random.split(jax.random.key(0), 2 * spec.layers)
        return [
            {
                "w_in": (jax.random.normal(keys[2 * i], (e, f), jnp.float32) / math.sqrt(e)).astype(dt),
                "w_out": (jax.random.normal(keys[2 * i + 1], (f, e), jnp.float32) / math.sqrt(f)).astype(dt),
            }
            for i in range(spec.layers)
        ]

    def init_data():
        return jax.random.uniform(jax.random.key(1), (spec.global_batch, e), jnp.float32).astype(dt)

    def constrain(x: Any, axes: tuple[str, ...]) -> Any:
        return jax.lax.with_sharding_constraint(x, mesh_lib.sharding_for(mesh, axes))

    def loss(params: list[dict[str, Any]], x: Any) -> Any:
        for layer in params:
            h = constrain(jax.nn.relu(x @ layer["w_in"]), ("batch", "mlp"))
            x = constrain(jax.nn.relu(h @ layer["w_out"]), ("batch", "activation_embed"))
        return jnp.sum(x.astype(jnp.float32))

    def train_step(params: list[dict[str, Any]], x: Any) -> list[dict[str, Any]]:
        _, grads = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - jnp.asarray(SGD_LEARNING_RATE, p.dtype) * g, params, grads)

    params = jax.jit(init_params, out_shardings=param_shardings)()
    x = jax.jit(init_data, out_shardings=x_sharding)()
    step = jax.jit(
        train_step, in_shardings=(param_shardings, x_sharding), out_shardings=param_shardings, donate_argnums=0
    )
    state = {"params": params}

    def one_step():
        state["params"] = step(state["params"], x)
        return state["params"]

    times = timed_calls(one_step, spec.steps, spec.warmup)
    seconds = statistics.median(times)
    return {"step_seconds": seconds, "step_times": times, "flops_per_second": spec.flops_per_step / seconds}


def figures(
    spec: BenchSpec,
    bench: dict[str, Any],
    references: Sequence[dict[str, Any]],
    *,
    platform: str,
    dtype: str,
    processes: int,
    emulated: bool,
) -> dict[str, Any]:
    """The benchmark's result (see the module docstring): ``bench`` is
    :func:`measure_shardings`'s, ``references`` the :func:`matmul_reference` runs before and
    after it, all on ``platform`` in ``dtype``, over ``processes`` processes (``emulated``:
    emulated slices)."""
    samples = [t for r in references for t in r["times"]]
    rows, k, n = references[0]["shape"]
    matmul_rate = 2.0 * rows * k * n / statistics.median(samples)
    units = 1 if platform == "cpu" else spec.devices
    capacity = matmul_rate * units
    aggregate = bench["flops_per_second"]
    check = reference_check([r["flops_per_second"] for r in references], aggregate / capacity)
    return {
        "tflops_per_device": aggregate / spec.devices / 1e12,
        "efficiency": aggregate / capacity,
        "efficiency_trusted": check["trusted"],
        "warnings": check["warnings"],
        "aggregate_tflops": aggregate / 1e12,
        "reference_tflops": capacity / 1e12,
        "reference": {
            "unit": "one process, whole machine" if platform == "cpu" else f"one chip × {spec.devices}",
            "matmul_shape": [rows, k, n],
            "matmul_tflops": matmul_rate / 1e12,
            "tflops_before_after": [r["flops_per_second"] / 1e12 for r in references],
            "spread": check["spread"],
            "times": [r["times"] for r in references],
        },
        "step_seconds": bench["step_seconds"],
        "step_times": bench["step_times"],
        "flops_per_step": spec.flops_per_step,
        "parameters": spec.parameters,
        "global_batch": spec.global_batch,
        "devices": spec.devices,
        "processes": processes,
        "slices": spec.slices,
        "emulated_slices": emulated,
        "platform": platform,
        "dtype": dtype,
        "mesh": {axis: {"dcn": spec.dcn[axis], "ici": spec.ici[axis]} for axis in MESH_AXES},
        "spec": spec.to_json(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }


def run_in_process(
    spec: BenchSpec, *, workers_per_slice: int = 1, report: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Run the benchmark with the devices this process (and its jax.distributed peers) has.

    Raises:
      BenchConfigError: the devices cannot form the mesh (e.g. ``--ici-fsdp 4`` with 2
        devices, or ``--dcn-data 2`` on one CPU process: :func:`run` emulates those slices).
    """
    import jax

    from training import mesh as mesh_lib

    platform = jax.devices()[0].platform
    dtype = spec.resolved_dtype(platform)
    try:
        mesh = mesh_lib.build_mesh(spec.parallelism, workers_per_slice=workers_per_slice)
    except mesh_lib.MeshError as err:
        raise BenchConfigError(
            f"--ici-*/--dcn-*: {err}; the flags must multiply out to the job's devices per slice and slices"
        ) from None
    rows = reference_rows(spec, platform)
    report(
        f"reference matmul [{rows}, {spec.embedding_dimension}]·[{spec.embedding_dimension}, {spec.ff_width}] {dtype}"
    )
    samples = max(spec.steps, REFERENCE_SAMPLES)
    before = matmul_reference(rows, spec.embedding_dimension, spec.ff_width, dtype, steps=samples, warmup=spec.warmup)
    report(f"benchmark: mesh {dict(mesh.shape)}, {spec.parameters:,} parameters, global batch {spec.global_batch}")
    bench = measure_shardings(spec, mesh, dtype)
    after = matmul_reference(rows, spec.embedding_dimension, spec.ff_width, dtype, steps=samples, warmup=spec.warmup)
    return figures(
        spec, bench, [before, after], platform=platform, dtype=dtype, processes=jax.process_count(), emulated=False
    )


def needs_emulated_slices(spec: BenchSpec) -> bool:
    """Whether ``spec`` asks for more slices than this process's job has: ``dcn > 1`` in a single
    process without TPU slices (``infra.local.bench_slices`` then emulates them on CPU)."""
    if spec.slices == 1:
        return False
    import jax

    device = jax.devices()[0]
    return jax.process_count() == 1 and not (device.platform == "tpu" and hasattr(device, "slice_index"))


def run(
    spec: BenchSpec, *, from_metadata: bool = False, report: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Run the benchmark in this process, or (``from_metadata``) in the TPU job read from
    metadata, every worker running the same command.

    Unless ``JAX_NUM_CPU_DEVICES`` or ``XLA_FLAGS`` set the CPU device count, the CPU backend
    of a single slice gets ``spec.devices`` devices (so ``--ici-fsdp 4`` just works on CPU).

    Raises:
      BenchConfigError: the mesh does not match the devices, or ``dcn > 1`` where this
        process has no slices to span (emulated slices are launched by ``multislice bench``).
      BenchError: (``from_metadata``) the TPU metadata is unusable.
    """
    if from_metadata:
        from training import cluster

        try:
            identity = cluster.current_identity()
        except cluster.MetadataError as err:
            raise BenchError(f"--from-metadata: {err}") from None
        cluster.initialize(identity)
        return run_in_process(spec, workers_per_slice=identity.workers_per_slice, report=report)
    import jax

    if (
        spec.slices == 1
        and "JAX_NUM_CPU_DEVICES" not in os.environ
        and ("xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""))
    ):
        try:  # a CPU-only machine gets the devices the mesh needs (before any JAX operation)
            jax.config.update("jax_num_cpu_devices", spec.devices)
        except RuntimeError:
            pass  # the backend already exists: use its devices
    if needs_emulated_slices(spec):
        raise BenchConfigError(
            f"--dcn-*: {spec.slices} slices, but this is one process without TPU slices; on TPU VMs pass "
            "--from-metadata on every worker, elsewhere run `multislice bench shardings` (it emulates the slices)"
        )
    return run_in_process(spec, report=report)


def summary(result: dict[str, Any]) -> str:
    """A few human-readable lines about a :func:`run` result; the efficiency line gives the
    reference spread, followed by one ``warning:`` line per :func:`reference_check` warning
    (recomputed from the printed figures, so an efficiency above 1 never prints without one)."""
    mesh = ", ".join(f"{axis} {v['dcn']}×{v['ici']}" for axis, v in result["mesh"].items())
    spec = result["spec"]
    ref = result["reference"]
    rows, k, n = ref["matmul_shape"]
    where = f"{result['processes']} process{'es' if result['processes'] != 1 else ''}"
    if result["emulated_slices"]:
        where += ", emulated slices"
    times = ", ".join(f"{t:.3f}" for t in result["step_times"])
    before_after = ", ".join(f"{t:.4g}" for t in ref["tflops_before_after"])
    check = reference_check(ref["tflops_before_after"], result["efficiency"])  # from the figures it prints
    return "\n".join(
        [
            f"shardings: {result['slices']} slice(s) × {result['devices'] // result['slices']} device(s) "
            f"({result['platform']}, {result['dtype']}, {where}); mesh (dcn×ici): {mesh}",
            f"model: {spec['layers']} MLP layers, E {spec['embedding_dimension']}, "
            f"FF {4 * spec['embedding_dimension']}: "
            f"{result['parameters']:,} parameters; global batch {result['global_batch']:,} rows",
            f"step: {result['step_seconds']:.4f} s (median of {times})",
            f"achieved: {result['tflops_per_device']:.4g} TFLOP/s per device, "
            f"{result['aggregate_tflops']:.4g} aggregate "
            "(6 · parameters · batch per step)",
            f"reference: matmul [{rows}, {k}]·[{k}, {n}] on {ref['unit']}: {result['reference_tflops']:.4g} TFLOP/s "
            f"(median of all samples; medians before/after: {before_after})",
            f"efficiency: {result['efficiency']:.3f} (reference spread before/after {check['spread']:.2f}×, trusted up "
            f"to {REFERENCE_SPREAD_LIMIT:g}×)",
            *(as_line(warning) for warning in check["warnings"]),
        ]
    )

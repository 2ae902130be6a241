"""The shardings benchmark: what a (dcn × ici) mesh achieves on an MLP stack.

The seed's pedagogical experiment (SEED-NOTES.md, "Headline results to beat": MaxText's
``pedagogical_examples/shardings.py``; FSDP 4-way on v4-8, batch 131072, embedding 2048:
about 260 TFLOP/s per chip): ``layers`` MLP blocks ``x → relu(x·W_in) → relu(·W_out)`` with
``W_in`` ``[E, 4E]`` and ``W_out`` ``[4E, E]``, ``value_and_grad`` of the sum of the output and
an SGD update, all under one ``jax.jit``, over the hybrid mesh of ``training.mesh.build_mesh``
with the trainer's sharding rules (``embed`` over fsdp, ``mlp`` over tensor, the batch over
data × fsdp).

Figures (all measured in the same run):

* FLOPs per step = 6 · parameters · global batch rows (the seed's formula; parameters =
  ``2 · E · 4E · layers``, global batch = ``--batch-size`` per device × devices). It counts
  the input gradient of the first matmul, which autodiff never computes (x is data), so
  it overstates the work by ``1 / (12 · layers)`` (2 % at 4 layers).
* ``tflops_per_device`` = FLOPs per step ÷ median step time ÷ devices ÷ 1e12.
* ``efficiency`` = aggregate achieved FLOP/s ÷ the reference capacity, where the reference
  is one large matmul of the benchmark's own layer shape (``[rows, E] · [E, 4E]``, same
  dtype, compiled and warmed up the same way), timed :data:`REFERENCE_SAMPLES` times just
  before and again just after the benchmark; its rate is the median of all those samples,
  as the step time is the median of the timed steps. Medians on both sides, pooled over the
  span of the run, keep the ratio fair on a shared machine: the best of many short matmuls
  would catch quiet moments that multi-second steps cannot;

  - on CPU, one process using the whole machine (the launching process, while no emulated
    slice runs, when the slices are emulated), over the global batch rows: emulated devices
    and processes share the machine, so the ratio says what the sharding costs on the same
    hardware;
  - on an accelerator, one chip over its per-device rows, times the number of devices.

Where it runs:

* a single process (CPU with emulated devices, one GPU, one TPU VM): in-process;
* on a TPU multislice or multi-host slice, every worker runs the same command with
  ``--from-metadata`` (identity from TPU metadata, as ``python -m training run``);
* ``dcn > 1`` without TPU slices: ``multislice bench shardings`` emulates the slices as
  local CPU processes (``infra.local.bench_slices``), each calling :func:`measure_shardings`.

This module ships to the TPU VMs: it imports nothing from ``infra``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from training.config import MESH_AXES, AxisSizes, ParallelismConfig

#: Seconds a child waits for the others in jax.distributed.initialize, and its heartbeat.
CHILD_INIT_TIMEOUT_S = 60
CHILD_HEARTBEAT_TIMEOUT_S = 10
SGD_LEARNING_RATE = 1e-4
#: Timed reference matmuls before, and again after, the benchmark (at least ``--steps``).
REFERENCE_SAMPLES = 10
_CPUS_ENV = "MULTISLICE_BENCH_CPUS"


class BenchConfigError(ValueError):
    """Benchmark options that cannot work; the message names the option."""


class BenchError(RuntimeError):
    """The benchmark run failed (a child crashed, timed out, or the mesh could not be built)."""


@dataclasses.dataclass(frozen=True)
class BenchSpec:
    """One shardings benchmark.

    Attributes:
      ici, dcn: mesh axis sizes (``data``, ``fsdp``, ``tensor``) inside and across slices.
      batch_size: rows per device (the global batch is this × devices, as in the seed).
      embedding_dimension: E; the feed-forward width is 4E.
      layers: MLP blocks.
      steps: timed steps (and timed reference matmuls); the median is used.
      warmup: untimed steps first (the first one compiles).
      dtype: "float32", "bfloat16", or "auto" (bfloat16 on TPU/GPU, float32 on CPU, where
        XLA's bfloat16 matmuls are slow).
    """

    ici: dict[str, int] = dataclasses.field(default_factory=lambda: {"data": 1, "fsdp": 1, "tensor": 1})
    dcn: dict[str, int] = dataclasses.field(default_factory=lambda: {"data": 1, "fsdp": 1, "tensor": 1})
    batch_size: int = 1024
    embedding_dimension: int = 512
    layers: int = 4
    steps: int = 5
    warmup: int = 2
    dtype: str = "auto"

    def __post_init__(self) -> None:
        problems = []
        for net in ("ici", "dcn"):
            sizes = getattr(self, net)
            if set(sizes) != set(MESH_AXES):
                problems.append(f"--{net}-*: expected the axes {', '.join(MESH_AXES)}; got {sorted(sizes)}")
                continue
            for axis in MESH_AXES:
                if not _positive_int(sizes[axis]):
                    problems.append(f"--{net}-{axis}: must be a positive integer; got {sizes[axis]!r}")
        for name in ("batch_size", "embedding_dimension", "layers", "steps"):
            if not _positive_int(getattr(self, name)):
                problems.append(f"--{name.replace('_', '-')}: must be a positive integer; got {getattr(self, name)!r}")
        if not isinstance(self.warmup, int) or self.warmup < 1:
            problems.append(f"--warmup: must be at least 1 (the first step compiles); got {self.warmup!r}")
        if self.dtype not in ("auto", "float32", "bfloat16"):
            problems.append(f"--dtype: allowed: auto, float32, bfloat16; got {self.dtype!r}")
        if problems:
            raise BenchConfigError("; ".join(problems))
        if self.dcn["tensor"] != 1:
            raise BenchConfigError(f"--dcn-tensor: must be 1 (tensor parallelism never crosses DCN); got {self.dcn['tensor']}")
        shape = self.parallelism.mesh_shape
        if self.embedding_dimension % shape["fsdp"]:
            raise BenchConfigError(
                f"--embedding-dimension {self.embedding_dimension} is not divisible by the fsdp axis "
                f"(ici × dcn = {shape['fsdp']})"
            )
        if (4 * self.embedding_dimension) % shape["tensor"]:
            raise BenchConfigError(
                f"--embedding-dimension: the feed-forward width {4 * self.embedding_dimension} is not divisible by "
                f"the tensor axis {shape['tensor']}"
            )
        if self.global_batch % self.parallelism.batch_shards:
            raise BenchConfigError(
                f"--batch-size: the global batch {self.global_batch} (= batch size × {self.devices} devices) is not "
                f"divisible by data × fsdp = {self.parallelism.batch_shards}"
            )

    @property
    def parallelism(self) -> ParallelismConfig:
        return ParallelismConfig(ici=AxisSizes(**self.ici), dcn=AxisSizes(**self.dcn))

    @property
    def slices(self) -> int:
        return self.parallelism.dcn.product

    @property
    def devices_per_slice(self) -> int:
        return self.parallelism.ici.product

    @property
    def devices(self) -> int:
        return self.slices * self.devices_per_slice

    @property
    def ff_width(self) -> int:
        return 4 * self.embedding_dimension

    @property
    def parameters(self) -> int:
        """2 · E · 4E per layer (the seed's ``2 * D_FF * D_EMB * NUM_LAYERS``)."""
        return 2 * self.embedding_dimension * self.ff_width * self.layers

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.devices

    @property
    def flops_per_step(self) -> float:
        """6 · parameters · global batch rows (forward 2, backward 4 per parameter per row)."""
        return 6.0 * self.parameters * self.global_batch

    def resolved_dtype(self, platform: str) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "float32" if platform == "cpu" else "bfloat16"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BenchSpec:
        return cls(**data)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def spec_from_options(
    *,
    ici_data: int = 1,
    ici_fsdp: int = 1,
    ici_tensor: int = 1,
    dcn_data: int = 1,
    dcn_fsdp: int = 1,
    dcn_tensor: int = 1,
    **rest: Any,
) -> BenchSpec:
    """A :class:`BenchSpec` from command-line options (``--ici-fsdp 4`` → ``ici_fsdp=4``).

    Raises:
      BenchConfigError: the options cannot form a benchmark (the message names the option).
    """
    return BenchSpec(
        ici={"data": ici_data, "fsdp": ici_fsdp, "tensor": ici_tensor},
        dcn={"data": dcn_data, "fsdp": dcn_fsdp, "tensor": dcn_tensor},
        **rest,
    )


# --- measurements (in-process) ---------------------------------------------------------------


def _timed_calls(fn: Callable[[], Any], steps: int, warmup: int) -> list[float]:
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


def matmul_reference(rows: int, k: int, n: int, dtype: str, *, steps: int = 5, warmup: int = 2, device=None) -> dict[str, Any]:
    """FLOP/s of one ``[rows, k] · [k, n]`` matmul on one device (``jax.devices()[0]`` by
    default), median of ``steps`` timed calls after ``warmup``.

    Returns:
      ``{"flops_per_second", "seconds" (median), "times", "shape", "dtype", "platform"}``.
    """
    import jax
    import jax.numpy as jnp

    device = device if device is not None else jax.local_devices()[0]
    dt = jnp.dtype(dtype)
    kx, kw = jax.random.split(jax.random.key(1))
    x = jax.device_put(jax.random.normal(kx, (rows, k), dt), device)
    w = jax.device_put(jax.random.normal(kw, (k, n), dt), device)
    matmul = jax.jit(lambda a, b: a @ b)
    times = _timed_calls(lambda: matmul(x, w), steps, warmup)
    seconds = statistics.median(times)
    del x, w
    return {
        "flops_per_second": 2.0 * rows * k * n / seconds,
        "seconds": seconds,
        "times": times,
        "shape": [rows, k, n],
        "dtype": dtype,
        "platform": device.platform,
    }


def measure_shardings(spec: BenchSpec, mesh, dtype: str) -> dict[str, Any]:
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

    def constrain(x, axes):
        return jax.lax.with_sharding_constraint(x, mesh_lib.sharding_for(mesh, axes))

    def loss(params, x):
        for layer in params:
            h = constrain(jax.nn.relu(x @ layer["w_in"]), ("batch", "mlp"))
            x = constrain(jax.nn.relu(h @ layer["w_out"]), ("batch", "activation_embed"))
        return jnp.sum(x.astype(jnp.float32))

    def train_step(params, x):
        _, grads = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - jnp.asarray(SGD_LEARNING_RATE, p.dtype) * g, params, grads)

    params = jax.jit(init_params, out_shardings=param_shardings)()
    x = jax.jit(init_data, out_shardings=x_sharding)()
    step = jax.jit(train_step, in_shardings=(param_shardings, x_sharding), out_shardings=param_shardings, donate_argnums=0)
    state = {"params": params}

    def one_step():
        state["params"] = step(state["params"], x)
        return state["params"]

    times = _timed_calls(one_step, spec.steps, spec.warmup)
    seconds = statistics.median(times)
    return {"step_seconds": seconds, "step_times": times, "flops_per_second": spec.flops_per_step / seconds}


def _reference_rows(spec: BenchSpec, platform: str) -> int:
    """Rows of the reference matmul: the global batch on CPU (the whole machine is the unit),
    one device's rows on an accelerator (one chip is the unit)."""
    return spec.global_batch if platform == "cpu" else spec.batch_size


def _result(spec: BenchSpec, bench: dict[str, Any], references: Sequence[dict[str, Any]], *, platform: str,
            dtype: str, processes: int, emulated: bool) -> dict[str, Any]:
    """The benchmark's figures (see the module docstring)."""
    samples = [t for r in references for t in r["times"]]
    rows, k, n = references[0]["shape"]
    matmul_rate = 2.0 * rows * k * n / statistics.median(samples)
    units = 1 if platform == "cpu" else spec.devices
    capacity = matmul_rate * units
    aggregate = bench["flops_per_second"]
    return {
        "tflops_per_device": aggregate / spec.devices / 1e12,
        "efficiency": aggregate / capacity,
        "aggregate_tflops": aggregate / 1e12,
        "reference_tflops": capacity / 1e12,
        "reference": {
            "unit": "one process, whole machine" if platform == "cpu" else f"one chip × {spec.devices}",
            "matmul_shape": [rows, k, n],
            "matmul_tflops": matmul_rate / 1e12,
            "tflops_before_after": [r["flops_per_second"] / 1e12 for r in references],
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


def run_in_process(spec: BenchSpec, *, workers_per_slice: int = 1, report: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
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
    rows = _reference_rows(spec, platform)
    report(f"reference matmul [{rows}, {spec.embedding_dimension}]·[{spec.embedding_dimension}, {spec.ff_width}] {dtype}")
    samples = max(spec.steps, REFERENCE_SAMPLES)
    before = matmul_reference(rows, spec.embedding_dimension, spec.ff_width, dtype, steps=samples, warmup=spec.warmup)
    report(f"benchmark: mesh {dict(mesh.shape)}, {spec.parameters:,} parameters, global batch {spec.global_batch}")
    bench = measure_shardings(spec, mesh, dtype)
    after = matmul_reference(rows, spec.embedding_dimension, spec.ff_width, dtype, steps=samples, warmup=spec.warmup)
    return _result(spec, bench, [before, after], platform=platform, dtype=dtype,
                   processes=jax.process_count(), emulated=False)


def needs_emulated_slices(spec: BenchSpec) -> bool:
    """Whether ``spec`` asks for more slices than this process's job has: ``dcn > 1`` in a single
    process without TPU slices (``infra.local.bench_slices`` then emulates them on CPU)."""
    if spec.slices == 1:
        return False
    import jax

    device = jax.devices()[0]
    return jax.process_count() == 1 and not (device.platform == "tpu" and hasattr(device, "slice_index"))


def run(spec: BenchSpec, *, from_metadata: bool = False, report: Callable[[str], None] = lambda s: None) -> dict[str, Any]:
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
            identity = cluster.identity_from_metadata()
        except cluster.MetadataError as err:
            raise BenchError(f"--from-metadata: {err}") from None
        cluster.initialize(identity)
        return run_in_process(spec, workers_per_slice=identity.workers_per_slice, report=report)
    import jax

    if spec.slices == 1 and "JAX_NUM_CPU_DEVICES" not in os.environ and (
        "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", "")
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
    """A few human-readable lines about a :func:`run` result."""
    mesh = ", ".join(f"{axis} {v['dcn']}×{v['ici']}" for axis, v in result["mesh"].items())
    spec = result["spec"]
    ref = result["reference"]
    rows, k, n = ref["matmul_shape"]
    where = f"{result['processes']} process{'es' if result['processes'] != 1 else ''}"
    if result["emulated_slices"]:
        where += ", emulated slices"
    times = ", ".join(f"{t:.3f}" for t in result["step_times"])
    before_after = ", ".join(f"{t:.4g}" for t in ref["tflops_before_after"])
    return "\n".join(
        [
            f"shardings: {result['slices']} slice(s) × {result['devices'] // result['slices']} device(s) "
            f"({result['platform']}, {result['dtype']}, {where}); mesh (dcn×ici): {mesh}",
            f"model: {spec['layers']} MLP layers, E {spec['embedding_dimension']}, FF {4 * spec['embedding_dimension']}: "
            f"{result['parameters']:,} parameters; global batch {result['global_batch']:,} rows",
            f"step: {result['step_seconds']:.4f} s (median of {times})",
            f"achieved: {result['tflops_per_device']:.4g} TFLOP/s per device, {result['aggregate_tflops']:.4g} aggregate "
            "(6 · parameters · batch per step)",
            f"reference: matmul [{rows}, {k}]·[{k}, {n}] on {ref['unit']}: {result['reference_tflops']:.4g} TFLOP/s "
            f"(median of all samples; medians before/after: {before_after})",
            f"efficiency: {result['efficiency']:.3f}",
        ]
    )

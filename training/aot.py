"""XLA's own per-device memory of the real train step, compiled ahead of time from abstract
shapes: nothing is allocated, no device runs.

:func:`compiled_memory` builds the step exactly as ``training.train`` does (a mesh of the
config's shape, the optimizer of ``training.optimizer``, the state shardings of
``training.state``, ``training.step.make_train_step`` with the config's ``microbatches``), gives
it ``jax.ShapeDtypeStruct`` arguments carrying their shardings, and reads
``jax.jit(...).lower(...).compile().memory_analysis()`` (JAX's ahead-of-time API:
https://docs.jax.dev/en/latest/aot.html). It needs as many devices as the mesh has; on a CPU,
``JAX_NUM_CPU_DEVICES=N`` (jax's ``jax_num_cpu_devices``) must be set before jax starts its CPU backend, so
``python -m training.aot`` (:func:`main`) is the entry point a fresh process runs: a
``TrainConfig`` as JSON on stdin, :class:`CompiledMemory` as JSON on stdout (the planner's
``infra/planner/compiled.py`` starts it).

The figure: XLA's ``CompiledMemoryStats`` (``memory_analysis()``; openxla/xla
``xla/pjrt/pjrt_executable.h``, https://github.com/openxla/xla/blob/main/xla/pjrt/pjrt_executable.h)
documents "the on-device memory needed to run an executable is at least
generated_code_size_in_bytes + argument_size_in_bytes + output_size_in_bytes −
alias_size_in_bytes + temp_size_in_bytes". The arguments are the state and the batch, the
outputs the new state and the metrics; the state is donated (``donate_argnums=0``), so its
outputs alias its arguments (``alias_size_in_bytes``) and are counted once; ``temp`` is every
buffer live inside the step (activations, gradients, optimizer temporaries), as XLA's buffer
assignment packs them. :attr:`CompiledMemory.total` leaves out the generated code (0 on CPU,
where code lives in host memory; small on TPU).

The CPU compiler is not the TPU one: its fusion, layout and buffer-assignment decisions differ
(e.g. no padding to TPU tiles, different rematerialization and scheduling), so the figure is
XLA's CPU plan for the same program and shardings, not a TPU measurement.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from training import mesh as mesh_lib, optimizer as optimizer_lib, state as state_lib, step as step_lib
from training.config import MESH_AXES, TrainConfig, load_train_config


@dataclasses.dataclass(frozen=True)
class CompiledMemory:
    """Bytes per device of the compiled train step (``CompiledMemoryStats`` fields of one
    device's program: SPMD compiles one program for every device of the mesh).

    ``total`` = ``argument + output − alias + temp`` (the module docstring: XLA's formula,
    without generated code). ``devices``: the mesh's device count; ``platform``: where it was
    compiled (``cpu`` for the virtual mesh)."""

    argument: int
    output: int
    alias: int
    temp: int
    generated_code: int
    devices: int
    platform: str

    @property
    def total(self) -> int:
        return self.argument + self.output - self.alias + self.temp

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"total": self.total}


def mesh_devices(config: TrainConfig) -> int:
    """Devices of ``config``'s mesh: the product of its axis sizes (ICI × DCN)."""
    return math.prod(config.parallelism.mesh_shape.values())


def lower_train_step(config: TrainConfig, devices: list | None = None) -> Any:
    """The train step of ``config`` lowered for its mesh (``config.parallelism``) over
    ``devices`` (default ``jax.devices()``: exactly the mesh's device count of them), from
    abstract arguments: the state as ``jax.ShapeDtypeStruct`` with its shardings, the batch as
    int32 ``[global_batch_size, sequence_length + 1]``.

    The devices fill the mesh in order, without ``training.mesh.build_mesh``'s grouping by
    slice: one process's virtual CPU devices all report slice 0, and where a device stands
    changes no buffer's size.

    Raises:
      training.mesh.MeshError: fewer devices than the mesh has.
    """
    devices = list(devices if devices is not None else jax.devices())
    shape = config.parallelism.mesh_shape
    if len(devices) < mesh_devices(config):
        raise mesh_lib.MeshError(f"the mesh {shape} needs {mesh_devices(config)} devices; {len(devices)} present")
    # One block of devices in mesh order: which device stands where (slices) changes no buffer size.
    grid = np.array(devices[: mesh_devices(config)], dtype=object).reshape([shape[a] for a in MESH_AXES])
    mesh = Mesh(grid, MESH_AXES)
    opt, _ = optimizer_lib.make_optimizer(config.optimizer, config.steps)
    shardings = state_lib.shardings(config, mesh, opt)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    # a jax.jit function: it has .lower
    step: Any = step_lib.make_train_step(config.model, opt, mesh, shardings, batch_sharding, config.microbatches)

    state = state_lib.abstract(config, opt, shardings)
    batch = jax.ShapeDtypeStruct(
        (config.global_batch_size, config.sequence_length + 1), jnp.int32, sharding=batch_sharding
    )
    return step.lower(state, batch)


def compiled_memory(config: TrainConfig, devices: list | None = None) -> CompiledMemory:
    """XLA's per-device memory of ``config``'s train step (:func:`lower_train_step`, compiled)."""
    stats = lower_train_step(config, devices).compile().memory_analysis()
    return CompiledMemory(
        argument=int(stats.argument_size_in_bytes),
        output=int(stats.output_size_in_bytes),
        alias=int(stats.alias_size_in_bytes),
        temp=int(stats.temp_size_in_bytes),
        generated_code=int(stats.generated_code_size_in_bytes),
        devices=mesh_devices(config),
        platform=jax.default_backend(),
    )


def main() -> None:
    """``python -m training.aot``: a TrainConfig as JSON on stdin, :meth:`CompiledMemory.to_json`
    on stdout. Run it with ``JAX_NUM_CPU_DEVICES=N`` (N the mesh's devices) and
    ``JAX_PLATFORMS=cpu`` for a virtual CPU mesh."""
    config = load_train_config(sys.stdin.read())
    json.dump(compiled_memory(config).to_json(), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()

"""The hybrid (DCN × ICI) device mesh, its axis names, and the sharding rules.

Mesh axes are ``(data, fsdp, tensor)`` (``training.config.MESH_AXES``). Axis ``a`` has size
``dcn.a × ici.a``: devices of one slice fill the ICI block of the mesh, and the slices are
laid out along the DCN factors, exactly as ``jax.experimental.mesh_utils.
create_hybrid_device_mesh`` does (the Cloud TPU Multislice overview: XLA generates the DCN
communication, user code only builds the mesh; docs/cloud-tpu.md). The difference is how
devices are grouped into slices ("granules"):

* by ``device.slice_index``, as a TPU runtime gives it (Cloud TPU's multislice runtime, and the
  local emulation's chips: docs/emulation.md), on TPU always, elsewhere when it names as many
  slices as the job has;
* where no runtime tells the job's slices — XLA's CPU and GPU clients number ``slice_index`` by
  host (one machine's processes all say 0), and a single CPU process has none — by process:
  ``process_index // workers_per_slice``, which is how JAX numbers a Multislice job's processes
  (docs/jax-on-cpu.md, "Devices").

Sharding rules (``training.model.shapes.LOGICAL_AXIS_RULES``) map each array dimension's *logical*
axis name (declared by the model) to mesh axes, MaxText-style: the batch splits over ``data``
and ``fsdp``, weights split their ``embed`` dimension over ``fsdp`` and their
``heads``/``mlp``/``vocab`` dimension over ``tensor``.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from training.config import MESH_AXES, ParallelismConfig
from training.model.shapes import LOGICAL_AXIS_RULES  # jax-free: the planner reads it too

if TYPE_CHECKING:  # jaxlib ships no type stubs for its extension types: to a checker jax.Device is no class
    Device = Any
else:
    Device = jax.Device


class MeshError(ValueError):
    """The devices present cannot form the configured mesh."""


def slice_granules(devices: Sequence[Device], workers_per_slice: int) -> list[list[Device]]:
    """Group devices by slice, in slice order (each slice's devices by process, then id).

    Groups by ``device.slice_index`` where :func:`slices_from_runtime` says so; otherwise as
    consecutive groups of ``workers_per_slice`` processes.
    """
    by_slice_index = slices_from_runtime(devices, workers_per_slice)
    groups: dict[int, list[Device]] = collections.defaultdict(list)
    for device in devices:
        key = device.slice_index if by_slice_index else device.process_index // workers_per_slice
        groups[key].append(device)
    return [sorted(groups[key], key=lambda d: (d.process_index, d.id)) for key in sorted(groups)]


def slices_from_runtime(devices: Sequence[Device], workers_per_slice: int) -> bool:
    """Whether the devices' own ``slice_index`` tells their slices: on TPU whenever they carry
    it (a mismatch with the config is then a :class:`MeshError`), elsewhere when it names as many
    slices as the job's processes make (``processes / workers_per_slice``), as the emulation's
    chips do; XLA's CPU and GPU clients number it by host instead (module docstring)."""
    if not hasattr(devices[0], "slice_index"):
        return False
    if devices[0].platform == "tpu":
        return True
    processes = len({d.process_index for d in devices})
    return len({d.slice_index for d in devices}) == max(1, processes // workers_per_slice)


def hybrid_device_array(
    parallelism: ParallelismConfig, devices: Sequence[Device], workers_per_slice: int = 1
) -> np.ndarray:
    """The ``(data, fsdp, tensor)``-shaped device array: each slice fills one ICI block and
    the blocks are tiled along the DCN factors (as ``create_hybrid_device_mesh``).

    Raises:
      MeshError: the slice count differs from the DCN product, or a slice's device count
        from the ICI product; the message names the config key.
    """
    ici_shape = [getattr(parallelism.ici, axis) for axis in MESH_AXES]
    dcn_shape = [getattr(parallelism.dcn, axis) for axis in MESH_AXES]
    granules = slice_granules(devices, workers_per_slice)
    if len(granules) != int(np.prod(dcn_shape)):
        raise MeshError(
            f"parallelism.dcn: data×fsdp×tensor = {int(np.prod(dcn_shape))} but the job has "
            f"{len(granules)} slice(s) ({len(devices)} devices, {workers_per_slice} worker(s) per slice)"
        )
    for index, granule in enumerate(granules):
        if len(granule) != int(np.prod(ici_shape)):
            raise MeshError(
                f"parallelism.ici: data×fsdp×tensor = {int(np.prod(ici_shape))} but slice {index} has "
                f"{len(granule)} devices"
            )
    per_slice = [mesh_utils.create_device_mesh(ici_shape, granule) for granule in granules]
    slice_grid = np.arange(len(granules)).reshape(dcn_shape)
    blocks = np.vectorize(lambda i: per_slice[i], otypes=[object])(slice_grid)
    return np.block(blocks.tolist())


def build_mesh(
    parallelism: ParallelismConfig,
    *,
    workers_per_slice: int = 1,
    devices: Sequence[Device] | None = None,
) -> Mesh:
    """Build the ``(data, fsdp, tensor)`` mesh of shape ``dcn × ici`` over ``devices``
    (default ``jax.devices()``, all processes). Raises MeshError (see
    :func:`hybrid_device_array`)."""
    devices = list(devices if devices is not None else jax.devices())
    return Mesh(hybrid_device_array(parallelism, devices, workers_per_slice), MESH_AXES)


def logical_to_spec(logical_axes: Sequence[str | None]) -> PartitionSpec:
    """PartitionSpec for an array whose dimensions have these logical axis names."""
    return PartitionSpec(*(LOGICAL_AXIS_RULES[name] if name is not None else None for name in logical_axes))


def sharding_for(mesh: Mesh, logical_axes: Sequence[str | None]) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(logical_axes))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Sharding of a ``[batch, sequence]`` token array."""
    return sharding_for(mesh, ("batch", "sequence"))


def process_batch_rows(mesh: Mesh, global_batch_size: int, sequence_length: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of the global batch that this process's devices hold.

    Raises:
      MeshError: this process's rows are not one contiguous block (the mesh would need a
        different data layout).
    """
    sharding = batch_sharding(mesh)
    indices = sharding.addressable_devices_indices_map((global_batch_size, sequence_length))
    batch_slices = []
    for index in indices.values():
        assert index is not None  # (None only for shardings that do not index an array; this is a NamedSharding)
        batch_slices.append(index[0])
    rows = sorted({(s.start or 0, s.stop if s.stop is not None else global_batch_size) for s in batch_slices})
    start, stop = rows[0][0], rows[0][1]
    for row_start, row_stop in rows[1:]:
        if row_start != stop:
            raise MeshError(f"this process's batch rows are not contiguous: {rows}")
        stop = row_stop
    return start, stop

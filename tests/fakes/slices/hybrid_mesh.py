"""A multislice program as the field writes one, run by ``multislice local exec`` in the tests.

It never calls ``jax.distributed.initialize()`` (on Cloud TPU the runtime joins the job), builds its
hybrid mesh with ``jax.experimental.mesh_utils.create_hybrid_device_mesh`` — which groups devices by
``slice_index``, not told ``process_is_granule`` — with the DCN factor on the ``data`` axis, checks
that each ``data`` index of the mesh is one whole slice and that together they span every slice, and
runs a reduction over the whole mesh. Usage: ``python hybrid_mesh.py SLICES``; exit 0 and a line
``process P: data axis spans slices [[0], [1], ...]``, or an AssertionError.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

slices = int(sys.argv[1])
per_slice = jax.device_count() // slices
devices = mesh_utils.create_hybrid_device_mesh([1, per_slice], [slices, 1])  # (data, fsdp): DCN over data
mesh = Mesh(devices, ("data", "fsdp"))
spans = [sorted({d.slice_index for d in devices[i].flat}) for i in range(slices)]
assert spans == [[i] for i in range(slices)], f"data axis spans slices {spans}"
ones = jax.make_array_from_callback(
    (slices, per_slice), NamedSharding(mesh, PartitionSpec("data", "fsdp")), lambda index: np.ones((1, 1), np.float32)
)
total = float(jax.jit(jnp.sum)(ones))
assert total == jax.device_count(), total
print(f"process {jax.process_index()}: data axis spans slices {spans}", flush=True)

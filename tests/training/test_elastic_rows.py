"""No sample twice or skipped across process counts: for every layout a run can
resume on (1, 2, 4 or 8 processes, 1 or 2 slices, ICI/DCN splits of the batch axes), the
rows of the global batch that each process reads (the rows its devices hold under the batch
sharding, as training.mesh.process_batch_rows computes them) cover rows [0, B) exactly once,
and are one contiguous block per process except in the one layout the trainer refuses.

The layouts are built by training.mesh.hybrid_device_array over stand-in devices that say
which process they belong to; the batch sharding is the trainer's (jax's NamedSharding over
this process's 8 CPU devices standing at the same mesh positions), so what is checked is the
trainer's own layout and sharding rule, not a re-derivation of them."""

from __future__ import annotations

import collections
import types
from itertools import pairwise

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding

from training import mesh as mesh_lib
from training.config import MESH_AXES, ParallelismConfig

GLOBAL_BATCH = 16
SEQUENCE = 33


def rows_per_process(parallelism: dict, processes: int, workers_per_slice: int) -> dict[int, list[tuple[int, int]]]:
    """Process index -> the (start, stop) row blocks of the global batch its devices hold."""
    per_process = 8 // processes
    stand_ins = [
        types.SimpleNamespace(id=i, process_index=i // per_process, platform="cpu", device_kind="cpu") for i in range(8)
    ]
    layout = mesh_lib.hybrid_device_array(ParallelismConfig.model_validate(parallelism), stand_ins, workers_per_slice)
    real = {d.id: d for d in jax.devices()}
    mesh = Mesh(np.vectorize(lambda d: real[d.id], otypes=[object])(layout), MESH_AXES)
    owner = {d.id: d.process_index for d in stand_ins}
    sharding = NamedSharding(mesh, mesh_lib.logical_to_spec(("batch", "sequence")))
    rows: dict[int, set[tuple[int, int]]] = collections.defaultdict(set)
    for device, index in sharding.devices_indices_map((GLOBAL_BATCH, SEQUENCE)).items():
        rows[owner[device.id]].add((index[0].start or 0, GLOBAL_BATCH if index[0].stop is None else index[0].stop))
    return {process: sorted(blocks) for process, blocks in rows.items()}


LAYOUTS = [
    # (parallelism, processes, workers per slice)
    ({"ici": {"data": 2, "fsdp": 2, "tensor": 2}}, 1, 1),
    ({"ici": {"data": 8}}, 1, 1),
    ({"ici": {"fsdp": 4}, "dcn": {"data": 2}}, 2, 1),  # the emulation's 2 slices × 1 worker
    ({"ici": {"fsdp": 2, "tensor": 2}, "dcn": {"data": 2}}, 4, 2),  # 2 slices × 2 workers
    ({"ici": {"data": 4}, "dcn": {"data": 2}}, 8, 4),
    ({"ici": {"fsdp": 8}}, 4, 4),  # one slice of 4 workers
    ({"ici": {"data": 2, "tensor": 2}, "dcn": {"fsdp": 2}}, 2, 1),  # see NOT_CONTIGUOUS
]

#: The batch splits over (data, fsdp), data major: with FSDP over DCN and ICI data > 1, a slice
#: holds rows [0, 4) and [8, 12) of 16. The rows are still read once each, but the trainer
#: refuses the layout at start (training.mesh.process_batch_rows raises MeshError: exit 78)
#: instead of reading two blocks; the test pins that this layout is the one that does so.
NOT_CONTIGUOUS = {str(LAYOUTS[-1][0])}


def blocks_of(rows: dict[int, list[tuple[int, int]]]) -> list[tuple[int, int]]:
    return sorted(block for process_blocks in rows.values() for block in process_blocks)


@pytest.mark.parametrize(("parallelism", "processes", "workers_per_slice"), LAYOUTS)
def test_every_row_of_the_global_batch_is_read_once(parallelism, processes, workers_per_slice):
    rows = rows_per_process(parallelism, processes, workers_per_slice)
    assert sorted(rows) == list(range(processes))  # every process reads some rows
    covered = blocks_of(rows)
    assert covered[0][0] == 0 and covered[-1][1] == GLOBAL_BATCH
    assert all(stop == next_start for (_, stop), (next_start, _) in pairwise(covered))  # no gap, no overlap
    contiguous = all(
        stop == start for blocks in rows.values() for (_, stop), (start, _) in pairwise(blocks)
    )  # one block per process, as process_batch_rows requires
    assert contiguous == (str(parallelism) not in NOT_CONTIGUOUS), rows


def test_a_single_process_reads_what_all_processes_of_another_layout_read():
    # The batch of a step is rows [0, B) however they are split: the single-process layout
    # holds them all, and the union of any multi-process layout's blocks is the same rows.
    union = lambda rows: sorted(r for blocks in rows.values() for start, stop in blocks for r in range(start, stop))  # noqa: E731
    single = union(rows_per_process({"ici": {"data": 2, "fsdp": 2, "tensor": 2}}, 1, 1))
    assert single == list(range(GLOBAL_BATCH))
    for parallelism, processes, workers in LAYOUTS[2:]:
        assert union(rows_per_process(parallelism, processes, workers)) == single

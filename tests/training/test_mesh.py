"""training.mesh: hybrid mesh layout, slice grouping, sharding rules, host rows."""

from __future__ import annotations

import types

import jax
import pytest
from jax.sharding import PartitionSpec

from training import mesh as mesh_lib
from training.config import ParallelismConfig


def fake_device(id_, process_index, platform="cpu", slice_index=None):
    device = types.SimpleNamespace(id=id_, process_index=process_index, platform=platform)
    if slice_index is not None:
        device.slice_index = slice_index
    return device


def test_emulated_slices_group_consecutive_processes():
    devices = [fake_device(i, i // 2) for i in range(8)]  # 4 processes × 2 devices
    granules = mesh_lib.slice_granules(devices, workers_per_slice=2)
    assert [[d.id for d in g] for g in granules] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_tpu_devices_group_by_slice_index():
    devices = [fake_device(i, i // 4, platform="tpu", slice_index=(i + 4) // 8) for i in range(12)]
    granules = mesh_lib.slice_granules(devices, workers_per_slice=1)
    assert [len(g) for g in granules] == [4, 8]


def test_cpu_devices_that_know_their_slice_group_by_it():
    # The emulation's chips (infra/emulated/vm_site/sitecustomize.py) carry the slice of the VM that
    # owns them; when that names as many slices as the job has, it is what groups them, as on TPU
    # (here against process order, so only slice_index can give this grouping).
    devices = [fake_device(i, i // 2, slice_index=1 - i // 4) for i in range(8)]  # 4 processes, 2 slices
    assert mesh_lib.slices_from_runtime(devices, workers_per_slice=2)
    granules = mesh_lib.slice_granules(devices, workers_per_slice=2)
    assert [[d.id for d in g] for g in granules] == [[4, 5, 6, 7], [0, 1, 2, 3]]


def test_cpu_devices_numbered_by_host_group_by_process():
    # XLA's CPU client numbers slice_index by host: every process of one machine says 0. That
    # names 1 slice for a job of 2, so the processes tell the slices.
    devices = [fake_device(i, i // 2, slice_index=0) for i in range(8)]
    assert not mesh_lib.slices_from_runtime(devices, workers_per_slice=2)
    granules = mesh_lib.slice_granules(devices, workers_per_slice=2)
    assert [[d.id for d in g] for g in granules] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # On TPU the runtime's slice_index is the truth, even against the job's shape.
    tpu = [fake_device(i, i // 2, platform="tpu", slice_index=0) for i in range(8)]
    assert mesh_lib.slices_from_runtime(tpu, workers_per_slice=2)
    assert len(mesh_lib.slice_granules(tpu, workers_per_slice=2)) == 1


def test_mesh_shape_is_dcn_times_ici():
    par = ParallelismConfig.model_validate({"ici": {"data": 2, "fsdp": 2, "tensor": 2}})
    mesh = mesh_lib.build_mesh(par)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


def test_hybrid_mesh_puts_each_slice_in_one_dcn_block():
    # 2 slices × 2 workers × 2 devices; dcn data 2, ici fsdp 2 × tensor 2.
    devices = [fake_device(i, i // 2) for i in range(8)]
    for d in devices:
        d.device_kind = "cpu"
    par = ParallelismConfig.model_validate({"ici": {"fsdp": 2, "tensor": 2}, "dcn": {"data": 2}})
    array = mesh_lib.hybrid_device_array(par, devices, workers_per_slice=2)
    assert array.shape == (2, 2, 2)
    ids = [[sorted(d.id for d in array[i].flat)] for i in range(2)]
    assert ids == [[[0, 1, 2, 3]], [[4, 5, 6, 7]]]  # data index i is slice i, wholly
    dcn_fsdp = ParallelismConfig.model_validate({"ici": {"fsdp": 2, "tensor": 2}, "dcn": {"fsdp": 2}})
    array = mesh_lib.hybrid_device_array(dcn_fsdp, devices, workers_per_slice=2)
    assert array.shape == (1, 4, 2)
    assert sorted(d.id for d in array[0, :2].flat) == [0, 1, 2, 3]  # fsdp 0..1 inside slice 0
    with pytest.raises(mesh_lib.MeshError, match=r"parallelism.dcn: data×fsdp×tensor = 2 but the job has 1 slice"):
        mesh_lib.build_mesh(par)  # the real devices belong to one process: one slice


def test_ici_product_must_match_devices_per_slice():
    par = ParallelismConfig.model_validate({"ici": {"fsdp": 4}})
    with pytest.raises(mesh_lib.MeshError, match=r"parallelism.ici: data×fsdp×tensor = 4 but slice 0 has 8 devices"):
        mesh_lib.build_mesh(par)


def test_sharding_rules():
    assert mesh_lib.logical_to_spec(("batch", "sequence")) == PartitionSpec(("data", "fsdp"), None)
    assert mesh_lib.logical_to_spec(("layers", "embed", "heads", "head_dim")) == PartitionSpec(
        None, "fsdp", "tensor", None
    )
    assert mesh_lib.logical_to_spec(("embed", "mlp")) == PartitionSpec("fsdp", "tensor")


def test_a_single_process_holds_every_batch_row():
    par = ParallelismConfig.model_validate({"ici": {"data": 2, "fsdp": 2, "tensor": 2}})
    mesh = mesh_lib.build_mesh(par)
    assert mesh_lib.process_batch_rows(mesh, 8, 33) == (0, 8)

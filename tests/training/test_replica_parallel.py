"""training.checkpoint.manager: a save of small replicated arrays compiles no slicing programs.

Orbax splits the write of a replicated shard among its replicas by slicing each array with an
eager jax.lax.slice_in_dim, one XLA program per slice shape (orbax's replica_slices.py);
training.checkpoint.manager lets it do so only for slices of at least
REPLICA_PARALLEL_MIN_SLICE_BYTES, so the first save of a start compiles nothing but the
state's checksums."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from training.checkpoint import integrity as checkpoint_integrity, manager as checkpointing
from training.config import TrainConfig
from training.run_dir import RunDir

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def _state(mesh: Mesh) -> dict:
    """Arrays of several shapes, sharded over "fsdp" and replicated over "data"."""
    sharding = NamedSharding(mesh, P("fsdp"))
    shapes = [(8, 4), (16, 2), (4, 4, 2), (8,), (12, 4)]
    return {
        f"a{i}": jax.device_put(jnp.arange(np.prod(s), dtype=jnp.float32).reshape(s), sharding)
        for i, s in enumerate(shapes)
    }


def test_a_save_of_small_replicated_arrays_compiles_no_slicing_program(tmp_path):
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "fsdp"))
    state = _state(mesh)
    config = TrainConfig.model_validate({"steps": 10, "checkpoint": {"interval_steps": 5, "async_save": False}})
    manager = checkpointing.make_manager(RunDir(str(tmp_path / "run")), config)
    checkpoint_integrity.summarize(state)  # the save's checksums, compiled beforehand
    compiles: list[float] = []
    listening = [True]
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiles.append(seconds) if listening[0] and event == COMPILE_EVENT else None
    )
    try:
        checkpointing.save(manager, 1, state)
        manager.wait_until_finished()
    finally:
        listening[0] = False
    assert compiles == []  # with replica-parallel slicing: a program per array shape here
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    restored = manager.restore(1, args=checkpointing.ocp.args.StandardRestore(abstract))
    assert all(bool((restored[k] == state[k]).all()) for k in state)

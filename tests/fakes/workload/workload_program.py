"""A user's own JAX program, as a stack's ``multislice:workload`` runs it (tests/stacks/Pulumi.emu-command.yaml).

It knows nothing of this project but the documented contract (docs/workloads.md): it calls
``jax.distributed.initialize()`` with no arguments (JAX finds the job as on a TPU VM), checks that
``jax.device_count()`` is every chip of every slice (``EXPECTED_DEVICES``, from the stack's
``env``), trains a tiny linear model with its data sharded over every device of every process,
checkpoints with Orbax into ``$MULTISLICE_CHECKPOINT_DIR`` and resumes from the newest checkpoint,
saves at a preemption notice (SIGTERM, through Orbax's ``reached_preemption``) and exits 75,
writes its metrics as JSON-lines windows under ``$MULTISLICE_METRICS_DIR``, and exits 0 once it
has trained ``$MULTISLICE_STEPS`` steps.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh, NamedSharding, PartitionSpec

STEP_SECONDS = float(os.environ.get("STEP_SECONDS", "0.3"))  # a fault can land mid-run
SAVE_EVERY = 4
SYNC_EVERY = 2


def write_window(records: list[dict]) -> None:
    """Process 0: the records since the last window as a new object ``<n>.jsonl`` (the contract)."""
    if not records or jax.process_index() != 0:
        return
    folder = epath.Path(os.environ["MULTISLICE_METRICS_DIR"])
    numbers = [int(p.name.split(".")[0]) for p in folder.glob("*.jsonl") if p.name.split(".")[0].isdigit()]
    (folder / f"{max(numbers, default=-1) + 1:08d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    records.clear()


def main() -> int:
    jax.distributed.initialize()  # no arguments: the cluster is detected, as on a TPU VM
    expected = int(os.environ["EXPECTED_DEVICES"])
    if jax.device_count() != expected:
        print(f"error: jax.device_count() is {jax.device_count()}, expected {expected}", file=sys.stderr)
        return 78
    assert jax.process_count() == int(os.environ["MULTISLICE_NUM_PROCESSES"])
    assert jax.process_index() == int(os.environ["MULTISLICE_PROCESS_ID"])
    total = int(os.environ["MULTISLICE_STEPS"])
    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = NamedSharding(mesh, PartitionSpec("data"))

    def batch(step: int) -> jax.Array:  # a pure function of the step: a resumed run computes the same
        x = np.arange(expected * 4, dtype=np.float32).reshape(expected, 4) / 10.0 + step
        return jax.make_array_from_callback(x.shape, rows, lambda index: x[index])

    @jax.jit
    def train_step(w, x):
        def loss_fn(w):
            return jnp.mean((x @ w - 1.0) ** 2)

        loss, grad = jax.value_and_grad(loss_fn)(w)
        return w - 0.001 * grad, loss

    options = ocp.CheckpointManagerOptions(save_interval_steps=SAVE_EVERY, max_to_keep=2)
    manager = ocp.CheckpointManager(os.environ["MULTISLICE_CHECKPOINT_DIR"], options=options)
    w = jax.device_put(jnp.zeros((4,), jnp.float32), replicated)
    step = manager.latest_step() or 0
    if step:
        w = manager.restore(step, args=ocp.args.StandardRestore({"w": w}))["w"]
        print(f"resumed from the checkpoint of step {step}", flush=True)
    records: list[dict] = []
    loss = None
    while step < total:
        w, loss = train_step(w, batch(step))
        step += 1
        records.append({"step": step, "loss": float(loss), "time": round(time.time(), 3)})
        if step % SYNC_EVERY == 0 or step == total:
            write_window(records)
        # Saves every SAVE_EVERY steps, at the last step, and at the step every process agreed on
        # after a preemption notice (Orbax's default policy: CheckpointManager.reached_preemption).
        manager.save(step, args=ocp.args.StandardSave({"w": w}), force=step == total)
        if manager.reached_preemption(step):
            manager.wait_until_finished()
            write_window(records)
            print(f"preempted: saved step {step}", flush=True)
            return 75
        time.sleep(STEP_SECONDS)
    manager.wait_until_finished()
    print(f"trained {total} steps" + (f"; final loss {float(loss):.6f}" if loss is not None else ""), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

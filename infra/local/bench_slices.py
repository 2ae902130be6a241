"""Emulated slices for the shardings benchmark: one local CPU process per slice.

``multislice bench shardings --dcn-data 2`` on a machine without TPU slices runs here: one
process per slice with the ici product of CPU devices (``JAX_NUM_CPU_DEVICES``), joined by
``jax.distributed`` on 127.0.0.1 (a free coordinator port) and grouped into slices by
``training.mesh``, each running ``training.bench.shardings.measure_shardings``. When the machine has
at least as many cores as processes, each process is pinned to its own share of the cores;
the reference matmul runs in the launching process on the whole machine while no slice
runs (see ``training.bench.shardings`` for the figures). Every child is its own process group
(``infra.emulated.supervisor``), killed on error, timeout or Ctrl-C, SIGTERM or SIGHUP, and
dies with the launcher (Linux ``PR_SET_PDEATHSIG``; a child whose launcher died before
that was armed exits at once).

This is local-emulation code, like ``infra.local.emulated_stack``: it is not part of the trainer
bundle that ships to the TPU VMs (``training/`` is), which runs ``training.bench.shardings`` directly.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from infra.emulated import stop_signals, supervisor
from infra.emulated.ports import free_port
from infra.emulated.supervisor import ProcessGroup
from infra.local.tails import last_lines
from infra.vm_contract import HEARTBEAT_TIMEOUT_ENV, INIT_TIMEOUT_ENV
from training.bench import shardings as bench
from training.bench.reference import REFERENCE_SAMPLES, matmul_reference, reference_rows
from training.bench.shardings import BenchError, figures, measure_shardings
from training.bench.spec import BenchSpec

#: Seconds a child waits for the others in jax.distributed.initialize, and its heartbeat.
CHILD_INIT_TIMEOUT_S = 60
CHILD_HEARTBEAT_TIMEOUT_S = 10
_CPUS_ENV = "MULTISLICE_BENCH_CPUS"


def _cpu_shares(processes: int) -> list[list[int]] | None:
    """Disjoint, equal CPU sets for ``processes`` children, or None when the machine has fewer
    usable cores than processes (then nobody is pinned)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < processes or processes < 2:
        return None
    per = len(cpus) // processes
    return [cpus[i * per : (i + 1) * per] for i in range(processes)]


def _child_env(devices: int, cpus: list[int] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "TPU_", "MEGASCALE_"))}
    env.pop(_CPUS_ENV, None)
    package_root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.update(
        {
            "JAX_PLATFORMS": "cpu",
            "JAX_NUM_CPU_DEVICES": str(devices),
            "PYTHONUNBUFFERED": "1",
            INIT_TIMEOUT_ENV: str(CHILD_INIT_TIMEOUT_S),
            HEARTBEAT_TIMEOUT_ENV: str(CHILD_HEARTBEAT_TIMEOUT_S),
        }
    )
    if cpus:
        env[_CPUS_ENV] = ",".join(str(c) for c in cpus)
    return env


def _start_child(name: str, task: dict[str, Any], env: dict[str, str], workdir: Path) -> ProcessGroup:
    """One emulated slice: ``python -m infra.local.bench_slices '<task>'`` in its own process
    group, its output in ``<workdir>/<name>.log``."""
    return ProcessGroup.start(
        name,
        [sys.executable, "-m", "infra.local.bench_slices", json.dumps(task)],
        log_path=workdir / f"{name}.log",
        env=env,
    )


def _wait_children(children: list[ProcessGroup], deadline: float, what: str) -> None:
    """Wait for every child to exit 0.

    Raises:
      BenchError: one exited non-zero (with its log's tail), or the deadline passed.
    """
    try:
        supervisor.wait_groups(children, deadline)
    except supervisor.GroupFailed as failed:
        log = last_lines(failed.group.log_path, 20)
        raise BenchError(
            f"{what}: {failed.group.name} exited with code {failed.code}; its log ends:\n"
            + ("(no log)" if log is None else "\n".join(log))
        ) from None
    except supervisor.DeadlineExceeded as late:
        raise BenchError(f"{what}: timed out (still running: {', '.join(late.running)}); raise --timeout") from None


def run_emulated(
    spec: BenchSpec, *, timeout_s: float = 600.0, report: Callable[[str], None] = lambda s: None
) -> dict[str, Any]:
    """Emulate the ``spec.slices`` slices on CPU: one process per slice with the ici product of
    CPU devices, joined by jax.distributed on 127.0.0.1. The reference matmul runs in this
    process on its CPU device (one process, whole machine) before and after, while no child
    is running. Children are killed on any exit.

    Raises:
      BenchError: a child failed or the run passed ``timeout_s`` seconds.
    """
    dtype = spec.resolved_dtype("cpu")
    deadline = time.monotonic() + timeout_s
    shares = _cpu_shares(spec.slices)
    rows = reference_rows(spec, "cpu")
    import jax

    cpu = jax.devices("cpu")[0]

    def reference() -> dict[str, Any]:
        return matmul_reference(
            rows,
            spec.embedding_dimension,
            spec.ff_width,
            dtype,
            steps=max(spec.steps, REFERENCE_SAMPLES),
            warmup=spec.warmup,
            device=cpu,
        )

    report(
        f"reference matmul [{rows}, {spec.embedding_dimension}]·[{spec.embedding_dimension}, {spec.ff_width}] "
        f"{dtype}: this process, whole machine"
    )
    before = reference()
    # SIGTERM and SIGHUP act as Ctrl-C while children run, so that they are killed (SIGKILL at
    # once: a child holds no state worth saving, and jax's preemption notifier catches SIGTERM)
    # and the temporary directory is removed.
    with (
        stop_signals.signals_raise(KeyboardInterrupt),
        tempfile.TemporaryDirectory(prefix="multislice-bench-") as tmp,
        supervisor.killed_on_exit() as children,
    ):
        port = free_port()
        out = Path(tmp) / "bench.json"
        report(
            f"benchmark: {spec.slices} emulated slices × {spec.devices_per_slice} CPU devices "
            f"(processes on 127.0.0.1:{port}{', pinned to cores ' + str(shares) if shares else ''})"
        )
        for index in range(spec.slices):
            task = {
                "spec": {**spec.to_json(), "dtype": dtype},
                "process_id": index,
                "parent_pid": os.getpid(),
                "num_processes": spec.slices,
                "coordinator": f"127.0.0.1:{port}",
                "result": str(out),
            }
            env = _child_env(spec.devices_per_slice, shares[index] if shares else None)
            # A stop between the child's fork and the append would leave it out of the list
            # that is killed on exit: it is raised once the child is in the list.
            with stop_signals.signals_held():
                children.append(_start_child(f"slice-{index}", task, env, Path(tmp)))
        _wait_children(children, deadline, "emulated slices")
        bench = json.loads(out.read_text())
    after = reference()
    return figures(spec, bench, [before, after], platform="cpu", dtype=dtype, processes=spec.slices, emulated=True)


def run(
    spec: BenchSpec,
    *,
    from_metadata: bool = False,
    timeout_s: float = 600.0,
    report: Callable[[str], None] = lambda s: None,
) -> dict[str, Any]:
    """The benchmark where this machine can run it: emulated CPU slices when
    :func:`training.bench.shardings.needs_emulated_slices`, otherwise :func:`training.bench.shardings.run`.

    Raises:
      BenchConfigError: the mesh does not match the devices.
      BenchError: a child failed, the run passed ``timeout_s`` seconds (emulated slices
        only), or (``from_metadata``) the TPU metadata is unusable.
    """
    if not from_metadata and spec.slices > 1 and bench.needs_emulated_slices(spec):
        return run_emulated(spec, timeout_s=timeout_s, report=report)
    return bench.run(spec, from_metadata=from_metadata, report=report)


# --- child entry point: python -m infra.local.bench_slices '<task json>' -------------------------


def _child(task: dict[str, Any]) -> int:
    if not supervisor.die_with_parent(task["parent_pid"]):
        return 1  # the launcher died before the death signal was armed: do not run orphaned
    cpus = os.environ.get(_CPUS_ENV)
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",")})
    result_path = Path(task["result"])
    from training import cluster, mesh as mesh_lib

    spec = BenchSpec.from_json(task["spec"])
    identity = cluster.ClusterIdentity(
        worker=0,
        workers_per_slice=1,
        slice_id=task["process_id"],
        num_slices=task["num_processes"],
        coordinator_address=task["coordinator"],
    )
    try:
        cluster.initialize(identity)
        import jax

        mesh = mesh_lib.build_mesh(spec.parallelism, workers_per_slice=1)
        result = measure_shardings(spec, mesh, spec.dtype)
        if jax.process_index() == 0:
            result_path.write_text(json.dumps(result))
        jax.distributed.shutdown()
    except BaseException:  # noqa: BLE001 - report, then exit without the shutdown barrier
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))

"""What each restart of the trainer costs against the floor of a restart, measured in one run
(target: badput per restart ≤ 1.3 × the floor).

    uv run --frozen python benchmarks/restart_floor.py [--steps 120] [--floor-repeat 3] [--cold-stack] [--json]

In one state directory, one after the other (the floor's rounds on both sides of step 2):

1. a warm-up run of the dev stack (or its ``--steps`` copy), stopped after its first
   evaluation (benchmarks/goodput.py ``warm_up``): a new stack's first run; it leaves the
   stack's compilation cache and the VMs' bytecode warm, as any earlier run of the stack
   would, and its first start's compilation is the cold-cache figure (``--cold-stack`` skips
   it: the measured run is then a new stack's first);
2. the goodput benchmark's run (``local up --fresh`` with two preemptions and a kill): a new
   run of the stack; the trainer's badput by cause for each of its restarts
   (``per_attempt`` of training.metrics.goodput.account);
3. the floor of a restart, ``--floor-repeat`` rounds after one unmeasured round (which compiles
   this checkout's bytecode), half of them before the run (on the warm-up's checkpoint of the
   same model) and the rest after it (on the run's newest), the median taken. A round is as
   many fresh processes as the trainer has (one per emulated VM, with a VM's environment: CPU
   devices, the emulated bucket, the stack's compilation cache, the VMs' bytecode), each of
   which imports what the trainer imports (``python -m training`` and training.train), joins
   ``jax.distributed`` as the trainer does, restores the newest checkpoint (one Orbax read of
   the state onto the trainer's shardings) and loads the train step from the compilation
   cache meanwhile (in a thread, as the trainer does) — and nothing else (:func:`worker`);
   its ``compilation`` is what the load takes beyond the restore. Phases are process 0's, as
   the trainer's start event is; the floor ends when the slowest process has its train step.

It prints, per cause, the trainer's mean badput per restart beside the floor and their ratio:
``initialization`` (process start → ready to restore: imports, ``jax.distributed``, set-up),
``checkpoint_restore``, ``compilation``; their sum (what the trainer itself spends) against the
floor's total; and what a restart costs beyond the trainer's own start: ``boot`` (the last record
of the attempt before → the next process start: the exit, the emulated repair and VM boot,
systemd's backoff), the exit's checkpoint wait and the preemption save (``checkpoint_save`` of
the attempt before), ``recomputed_steps`` after the kill and ``other``. The machine's load
average is printed with every figure: on a shared machine compare the ratios, never the seconds.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.3
#: The restart causes the floor has a counterpart for (the trainer's own start).
OWN = ("initialization", "checkpoint_restore", "compilation")


def worker(args: argparse.Namespace) -> None:
    """One floor process (see the module docstring); prints its phases as one JSON line."""
    from training.metrics.goodput import process_start_time

    began = process_start_time() or time.time()
    import training.__main__  # noqa: F401  (`python -m training`'s own imports: typer)
    from training import (
        cluster,
        compile_cache,
        mesh as mesh_lib,
        optimizer as optimizer_lib,
        state as state_lib,
        step as step_lib,
    )
    from training.checkpoint import manager as checkpointing
    from training.config import load_train_config
    from training.run_dir import RunDir

    imported = time.time()
    import jax
    import orbax.checkpoint as ocp

    config = load_train_config(Path(args.config).read_bytes())
    identity = cluster.ClusterIdentity(
        worker=args.process_id % args.workers_per_slice,
        workers_per_slice=args.workers_per_slice,
        slice_id=args.process_id // args.workers_per_slice,
        num_slices=args.processes // args.workers_per_slice,
        coordinator_address=args.coordinator,
    )
    compile_cache.enable(args.run_dir)
    joining = time.time()
    cluster.initialize(identity)
    joined = time.time()
    mesh = mesh_lib.build_mesh(config.parallelism, workers_per_slice=identity.workers_per_slice)
    batch_sharding = mesh_lib.batch_sharding(mesh)
    opt, _ = optimizer_lib.make_optimizer(config.optimizer, config.steps)
    shardings = state_lib.shardings(config, mesh, opt)
    train_step = step_lib.make_train_step(config.model, opt, mesh, shardings, batch_sharding)
    built = time.time()
    manager = checkpointing.make_manager(RunDir(args.run_dir), config)
    ready = time.time()
    # The train step is loaded from the cache while the checkpoint is read, as the trainer does
    # (training.setup.warm_up): the floor is the least a start must do, in the best order.
    abstract = state_lib.abstract(config, opt, shardings)
    batch = jax.ShapeDtypeStruct(
        (config.global_batch_size, config.sequence_length + 1), jax.numpy.int32, sharding=batch_sharding
    )
    pool = concurrent.futures.ThreadPoolExecutor(1)
    loading = pool.submit(lambda: train_step.lower(abstract, batch).compile())  # pyright: ignore[reportFunctionMemberAccess]  (a jax.jit)
    step = manager.latest_step()
    state = manager.restore(step, args=ocp.args.StandardRestore(abstract))
    jax.block_until_ready(state)
    restored = time.time()
    loading.result()
    pool.shutdown()
    compiled = time.time()
    print(
        json.dumps(
            {
                "process": args.process_id,
                "began": began,
                "import_s": imported - began,
                "join_s": joined - joining,
                "before_join_s": joining - imported,
                "build_s": built - joined,
                "manager_s": ready - built,
                "ready": ready,
                "restored": restored,
                "compiled": compiled,
                "restored_step": step,
                "cache_hits": compile_cache.stats().hits,
            }
        ),
        flush=True,
    )
    jax.distributed.shutdown()


def floor_once(state_dir: Path, config, config_file: Path) -> dict:
    """One round of floor processes over the stored run; process 0's phases and the end."""
    from infra import vm_contract as contract
    from infra.emulated import gcs
    from infra.emulated.ports import free_port
    from infra.emulated.state import LocalPaths
    from infra.local import topology

    root = state_dir / config.stack
    with gcs.GcsServer(root / "gcs", state_dir / "floor-gcs.log") as server:
        env = topology.vm_environment(
            config,
            emulation_id="restart-floor",
            coordinator_port=free_port(),
            heartbeat_timeout_s=10,
            init_timeout_s=120,
            storage_env=server.client_env(),
            paths=LocalPaths(root),
        )
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONPYCACHEPREFIX"] = str(state_dir / "bytecode")  # the VMs' (benchmarks/goodput.py cli_env)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        bucket = config.run_dir.removeprefix("gs://").split("/")[0]
        cache = f"gs://{bucket}/{contract.COMPILATION_CACHE_FOLDER}"  # what boot.sh gives the trainer
        env[contract.COMPILATION_CACHE_ENV] = os.environ.get(contract.COMPILATION_CACHE_ENV) or cache
        coordinator = f"127.0.0.1:{env[contract.COORDINATOR_PORT_ENV]}"
        processes = config.total_workers
        command = [sys.executable, __file__, "worker", "--config", str(config_file), "--run-dir", config.run_dir]
        common = ["--processes", str(processes), "--workers-per-slice", str(config.accelerator.hosts)]
        spawned = time.time()
        procs = [
            subprocess.Popen(
                [*command, *common, "--process-id", str(p), "--coordinator", coordinator],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for p in range(processes)
        ]
        outs = [proc.communicate(timeout=600) for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit("a floor process failed:\n" + "\n".join(err[-3000:] for _, err in outs))
    phases = sorted((json.loads(out.strip().splitlines()[-1]) for out, _ in outs), key=lambda p: p["process"])
    first, end = phases[0], max(p["compiled"] for p in phases)
    return {
        "initialization": first["ready"] - first["began"],
        "checkpoint_restore": first["restored"] - first["ready"],
        "compilation": end - first["restored"],
        "total": end - first["began"],
        "import_s": first["import_s"],
        "join_s": first["join_s"],
        "before_join_s": first["before_join_s"],
        "build_s": first["build_s"],
        "manager_s": first["manager_s"],
        "spawn_to_process_start_s": first["began"] - spawned,
        "restored_step": first["restored_step"],
        "cache_hits": [p["cache_hits"] for p in phases],
    }


def restart_costs(per_attempt: list[dict]) -> dict:
    """The trainer's mean badput per restart by cause: the restarted attempts' own causes, and
    the boot before each and what the attempt before it spent at its end."""
    restarts = per_attempt[1:]
    if not restarts:
        return {}
    mean = {cause: statistics.mean(a["badput"][cause] for a in restarts) for cause in restarts[0]["badput"]}
    for phase in ("import_s", "join_s"):
        values = [a[phase] for a in restarts if phase in a]
        if values:
            mean[phase] = statistics.mean(values)
    return mean


def report(run: dict, floors: list[dict], warm: dict | None, loads: dict) -> dict:
    per_restart = restart_costs(run["per_attempt"])
    floor = {key: statistics.median(f[key] for f in floors) for key in (*OWN, "total", "import_s", "join_s")}
    own = sum(per_restart[c] for c in OWN)
    beyond = sum(v for c, v in per_restart.items() if c in ("boot", "other"))
    return {
        "goodput": run["goodput"],
        "restarts": len(run["per_attempt"]) - 1,
        "per_restart": per_restart,
        "floor": floor,
        "floors": floors,
        "own_per_restart": own,
        "own_over_floor": own / floor["total"],
        "with_boot_over_floor": (own + beyond) / floor["total"],
        "target_ratio": TARGET_RATIO,
        "warm_up": warm,
        "first_start_compilation_s": run["first_start_compilation_s"],
        "load_average": loads,
        "per_attempt": run["per_attempt"],
    }


def print_report(result: dict) -> None:
    per, floor, loads = result["per_restart"], result["floor"], result["load_average"]
    print(f"trainer run: goodput {result['goodput']:.3f}, {result['restarts']} restarts (load {loads['run']})")
    around = (
        f"before the run (load {loads['floor_before']}) and after it" if "floor_before" in loads else "after the run"
    )
    print(f"floor: median of {len(result['floors'])} rounds {around} (load {loads['floor']})")
    print(f"  {'cause':20} {'trainer/restart':>16} {'floor':>8} {'ratio':>7}")
    for cause in OWN:
        ratio = per[cause] / floor[cause] if floor[cause] > 0 else float("inf")
        print(f"  {cause:20} {per[cause]:14.2f} s {floor[cause]:6.2f} s {ratio:7.2f}")
    for phase, label in (("import_s", "  of which imports"), ("join_s", "  of which the join")):
        if phase in per:
            print(f"  {label:20} {per[phase]:14.2f} s {floor[phase]:6.2f} s {per[phase] / floor[phase]:7.2f}")
    print(
        f"  {'trainer start':20} {result['own_per_restart']:14.2f} s {floor['total']:6.2f} s "
        f"{result['own_over_floor']:7.2f}  (target ≤ {TARGET_RATIO})"
    )
    print("  beyond the trainer's own start, per restart:")
    for cause in ("boot", "other", "checkpoint_save", "recomputed_steps", "evaluation"):
        print(f"    {cause:18} {per[cause]:14.2f} s")
    print(f"  with boot and other: {result['with_boot_over_floor']:.2f} × the floor")
    if result["warm_up"]:
        warm = result["warm_up"]
        print(
            f"first start's compilation: {warm['first_start_compilation_s']:.1f} s with a cold stack cache "
            f"(warm-up run, load {loads['warm_up']}), {result['first_start_compilation_s']:.1f} s with the warm one "
            f"(the measured run)"
        )
    hits = [f["cache_hits"] for f in result["floors"]]
    print(f"floor processes' cache hits per round: {hits} (0 would mean the floor compiled cold)")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        parser = argparse.ArgumentParser()
        parser.add_argument("worker")
        for name in ("--config", "--run-dir", "--coordinator"):
            parser.add_argument(name, required=True)
        for name in ("--process-id", "--processes", "--workers-per-slice"):
            parser.add_argument(name, type=int, required=True)
        worker(parser.parse_args())
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--steps", type=int, default=120, help="training.steps (default: the dev stack's 120)")
    parser.add_argument("--floor-repeat", type=int, default=3)
    parser.add_argument("--cold-stack", action="store_true", help="no warm-up run: the measured run is a new stack's")
    parser.add_argument("--state-dir", type=Path, help="keep the emulation's state here (a new directory)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.state_dir is not None and args.state_dir.exists():
        parser.error(f"--state-dir {args.state_dir} exists; name a new directory")
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import goodput as bench  # benchmarks/goodput.py

    loads: dict[str, list[float]] = {}

    def load_since(before: tuple[float, ...]) -> list[float]:
        return [round(x, 1) for x in (*before, *os.getloadavg())]

    with tempfile.TemporaryDirectory(prefix="restart-floor-") as tmp:
        state_dir = args.state_dir or Path(tmp)
        state_dir.mkdir(parents=True, exist_ok=True)
        up = bench.up_args(args.steps, True, state_dir)
        config = bench.stack_config(up)
        before = os.getloadavg()
        warm = None if args.cold_stack else bench.warm_up(state_dir, up)
        if warm is not None:
            loads["warm_up"] = load_since(before)
        config_file = state_dir / "train_config.json"
        config_file.write_text(config.training.model_dump_json())
        # Floor rounds on both sides of the run (before it on the warm-up's checkpoint), so
        # that a machine whose load changes meanwhile weighs on both figures alike.
        floors: list[dict] = []
        early = args.floor_repeat // 2 if warm is not None else 0
        if early:
            floor_once(state_dir, config, config_file)  # unmeasured: this checkout's bytecode
            before = os.getloadavg()
            floors += [floor_once(state_dir, config, config_file) for _ in range(early)]
            loads["floor_before"] = load_since(before)
        before = os.getloadavg()
        run = bench.one_run(state_dir, up)
        loads["run"] = load_since(before)
        if not early:
            floor_once(state_dir, config, config_file)
        before = os.getloadavg()
        floors += [floor_once(state_dir, config, config_file) for _ in range(args.floor_repeat - early)]
        loads["floor"] = load_since(before)
    result = report(run, floors, warm, loads)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_report(result)


if __name__ == "__main__":
    main()

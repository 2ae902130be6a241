"""Time from a trainer restart to its first step, without and with the compilation cache.

    uv run python benchmarks/restart_compile.py [--stack dev] [--repeat 2] [--json]

For each repeat, in turns: a trainer (``python -m training run --single-process``) trains the
stack's model from scratch and is SIGKILLed once it has recorded a step past its first
checkpoint (a crash); then a fresh trainer process resumes the run and the time from its
spawn to its first recorded step is measured, once with the run directory's compilation cache
(``<run_dir>/compilation_cache``, training.compile_cache) emptied first ("cold": what every
restart cost before the cache) and once with the cache the first process left ("warm").
Both include interpreter start, imports, the checkpoint restore and one step; the difference
is the compile the cache saves. The first record's own ``step_time_s`` (compile plus one step)
and ``compile_cache_hits`` are printed too.

The stack's model, sequence length, batch and optimizer are used unchanged; its parallelism
is replaced by one process with ``ici.fsdp`` = the stack's device count over all slices (a
single process here has no slices to span: the executable differs from a multislice one, the
compile it saves is of the same model). Wall times depend on the machine's load: compare
cold and warm from the same run, never across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.config import load_stack  # noqa: E402
from training import compile_cache  # noqa: E402


def _records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip().endswith("}")]


def _spawn(config: Path, run_dir: Path, devices: int, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update({"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices), "PYTHONPATH": str(ROOT)})
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "training",
            "run",
            "--single-process",
            "--config",
            str(config),
            "--run-dir",
            str(run_dir),
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait_for(proc: subprocess.Popen, run_dir: Path, done, timeout_s: float = 900.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = done(_records(run_dir))
        if found:
            return found
        if proc.poll() is not None:
            raise RuntimeError(f"trainer exited with {proc.returncode} before the awaited step; see its log")
        time.sleep(0.05)
    raise TimeoutError(f"no awaited step within {timeout_s:.0f} s")


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def one_restart(config: Path, work: Path, devices: int, interval: int, cold: bool, label: str) -> dict:
    run_dir = work / label
    log = work / f"{label}.log"
    first = _spawn(config, run_dir, devices, log)
    try:
        _wait_for(first, run_dir, lambda rs: next((r for r in rs if r.get("step", 0) > interval), None))
    finally:
        _kill(first)  # a crash: no save, no cleanup
    if cold:
        shutil.rmtree(compile_cache.cache_dir(str(run_dir)), ignore_errors=True)
    before = len(_records(run_dir))
    start = time.monotonic()
    second = _spawn(config, run_dir, devices, log)
    try:
        record = _wait_for(second, run_dir, lambda rs: rs[before] if len(rs) > before else None)
        wall = time.monotonic() - start
    finally:
        _kill(second)
    return {
        "restart_to_first_step_s": wall,
        "first_step_time_s": record["step_time_s"],
        "compile_cache_hits": record.get("compile_cache_hits"),
        "resumed_at_step": record["step"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--stack", default="dev")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    stack = load_stack(args.stack)
    training = json.loads(stack.training.model_dump_json())
    par = training["parallelism"]
    devices = 1  # the mesh's size: the product of every ici and dcn axis
    for side in ("ici", "dcn"):
        for size in par[side].values():
            devices *= size
    training["parallelism"] = {
        "ici": {"data": 1, "fsdp": devices, "tensor": 1},
        "dcn": {"data": 1, "fsdp": 1, "tensor": 1},
    }
    interval = training["checkpoint"]["interval_steps"]
    results: dict[str, list[dict]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="restart-compile-") as tmp:
        work = Path(tmp)
        config = work / "config.json"
        config.write_text(json.dumps(training))
        for i in range(args.repeat):
            for kind in ("cold", "warm"):
                results[kind].append(one_restart(config, work, devices, interval, kind == "cold", f"{kind}{i}"))
    summary: dict[str, Any] = {
        kind: {
            "restart_to_first_step_s": statistics.median(r["restart_to_first_step_s"] for r in rs),
            "first_step_time_s": statistics.median(r["first_step_time_s"] for r in rs),
            "compile_cache_hits": [r["compile_cache_hits"] for r in rs],
        }
        for kind, rs in results.items()
    }
    summary["warm_over_cold"] = summary["warm"]["restart_to_first_step_s"] / summary["cold"]["restart_to_first_step_s"]
    summary["stack"], summary["devices"], summary["repeat"] = args.stack, devices, args.repeat
    summary["load_average"] = os.getloadavg()
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"stack {args.stack}: model on {devices} CPU devices, "
        f"{args.repeat} restart(s) each, load {summary['load_average'][0]:.1f}"
    )
    for kind in ("cold", "warm"):
        s = summary[kind]
        print(
            f"  {kind:4}  restart → first step {s['restart_to_first_step_s']:6.1f} s   first step (compile + step) "
            f"{s['first_step_time_s']:6.2f} s   cache hits {s['compile_cache_hits']}"
        )
    print(f"  warm / cold: {summary['warm_over_cold']:.2f}")


if __name__ == "__main__":
    main()

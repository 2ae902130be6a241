"""How long ``multislice status`` takes to answer for a 10,000-step run.

    uv run --frozen python benchmarks/status_time.py [--steps 10000] [--repeat 5] [--json]

Builds a synthetic run directory as the trainer writes one (tests/fakes/synthetic_run.py:
10,000 steps, a metrics and events object per 10-step sync window — 1,000 metrics objects —,
a checkpoint every 100 steps, a failure and a preemption, COMPLETE not yet written) in an
emulated Cloud Storage (fake-gcs-server, infra/emulated/gcs.py) and an ACTIVE 2-slice queued
resource in the loopback Cloud TPU API fake (tests/fakes/tpu_api.py), then runs
``multislice status --config-file <stack> --json`` as a fresh process ``--repeat`` times (after
one untimed run that fills a private bytecode cache, ``PYTHONPYCACHEPREFIX``, as a user's machine
has it from the previous command: without one, ``PYTHONDONTWRITEBYTECODE=1`` makes every process
compile every module it imports, about half of its time) and reports each wall time (spawn to exit:
interpreter, imports, the TPU API reads and the run directory reads), their median, the
objects the command read (``infra.status.progress``: the listings, every events object, the two
newest metrics objects), the CPU time (user + system) of each answer, and the load average.
On a shared machine compare runs at similar load.

Target (issue 12): the answer in ≤ 2 s for a 10,000-step run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET_S = 2.0
STACK = ROOT / "tests" / "stacks" / "Pulumi.emu.yaml"


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import yaml

    from infra.config import load_stack_file
    from infra.emulated.gcs import GcsServer
    from infra.status.progress import read_progress
    from infra.status.store import RunStore
    from tests.fakes.queued_resource import props_for, provider_for
    from tests.fakes.synthetic_run import Fault, SyntheticRun, upload
    from tests.fakes.tpu_api import FakeTpuApi

    with (
        tempfile.TemporaryDirectory() as tmp,
        GcsServer(Path(tmp) / "gcs", Path(tmp) / "gcs.log") as server,
        FakeTpuApi() as fake,
    ):
        os.environ.update(server.client_env())
        os.environ["MULTISLICE_TPU_API_ENDPOINT"] = fake.endpoint
        bucket = "status-benchmark"
        server.create_bucket(bucket)
        document = yaml.safe_load(STACK.read_text())
        document["config"]["multislice:bucket"] = {"name": bucket}
        document["config"]["multislice:training"]["steps"] = args.steps
        stack = Path(tmp) / "Pulumi.emu.yaml"
        stack.write_text(yaml.safe_dump(document))
        config = load_stack_file(stack)
        provider_for(fake).create(props_for(config))
        done = args.steps * 9 // 10
        run = SyntheticRun(
            total_steps=args.steps,
            steps_done=done,
            log_every=10,
            checkpoint_every=100,
            faults=[Fault("failure", args.steps // 3 + 5), Fault("preemption", args.steps // 2)],
        )
        objects = run.objects()
        upload(config.run_dir, objects)

        class Counting(RunStore):
            names: list[str] = []

            def read(self, names):
                Counting.names += names
                return super().read(names)

        read_progress(Counting(config.run_dir), args.steps)
        command = [sys.executable, "-m", "infra.cli", "status", "--config-file", str(stack), "--json"]
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        env["PYTHONPATH"] = str(ROOT)
        env["PYTHONPYCACHEPREFIX"] = str(
            Path(tmp) / "bytecode"
        )  # filled by the untimed run, as a user's machine has it
        first = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        if first.returncode != 0:
            print(first.stderr, file=sys.stderr)
            return 1
        answer = json.loads(first.stdout)
        times, cpu = [], []
        for _ in range(args.repeat):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=True)
            times.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)

    metrics_objects = sum(name.startswith("metrics/") for name in objects)
    result = {
        "steps": args.steps,
        "step_reported": answer["run"]["step"],
        "metrics_objects": metrics_objects,
        "events_objects": sum(name.startswith("events/") for name in objects),
        "objects_read": len(Counting.names),
        "metrics_objects_read": sum(name.startswith("metrics/") for name in Counting.names),
        "seconds": [round(t, 3) for t in times],
        "median_seconds": round(statistics.median(times), 3),
        "cpu_seconds": [round(t, 3) for t in cpu],
        "median_cpu_seconds": round(statistics.median(cpu), 3),
        "target_seconds": TARGET_S,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"multislice status --json for a {args.steps}-step run (step {result['step_reported']} reported): "
            f"{result['objects_read']} objects read of {metrics_objects} metrics + "
            f"{result['events_objects']} events objects "
            f"({result['metrics_objects_read']} metrics objects)"
        )
        print(
            f"wall time per answer (fresh process): {', '.join(f'{t:.2f}' for t in times)} s; "
            f"median {result['median_seconds']:.2f} s (target ≤ {TARGET_S:.1f} s)"
        )
        print(
            f"CPU time per answer (user + system, what an idle machine's wall time is close to): "
            f"median {result['median_cpu_seconds']:.2f} s"
        )
        print(f"load average {' '.join(str(x) for x in result['load_average'])} on {result['cpus']} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the emulated Cloud Storage costs the local emulation, in one run (issue 10's targets):

1. the wall time of ``multislice local up --stack dev --kill 1@50 --fresh`` with the run
   directory on the emulated Cloud Storage (this tree), against the same command of the tree
   just before it (the run directory a plain directory ``bucket/runs/<run>``), run side by
   side: the two alternate, ``--repeat`` times each. Target: ratio ≤ 1.25;
2. the bytes one metrics sync uploads at step 100 and at step 10,000 of a run: the trainer's
   ``training.metrics.run_log.RecordLog`` writing records shaped like the trainer's to a gs:// run
   on a fake-gcs-server, a sync every ``log_every_steps`` (10). Target: flat (ratio ≈ 1);
   for comparison, what rewriting one growing ``metrics.jsonl`` object (the earlier scheme)
   would upload at the same syncs.

    uv run --frozen python benchmarks/local_storage.py [--repeat 1] [--baseline REF] [--json]

``--baseline`` defaults to the parent of the commit that added ``infra/emulated/gcs.py``; its
tree is exported (``git archive``) into a temporary directory and run with this
virtualenv's Python. Each ``local up`` gets its own state directory. The machine's load
average is printed with the figures: on a shared machine, compare runs at similar load.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.emulated.gcs import GcsServer  # noqa: E402
from infra.emulated.gcs_clients import point_clients_at  # noqa: E402
from training.metrics.run_log import RecordLog  # noqa: E402
from training.run_dir import RunDir  # noqa: E402

UP = ["local", "up", "--stack", "dev", "--kill", "1@50", "--fresh"]
TARGET_WALL_RATIO = 1.25


def baseline_commit() -> str:
    added = subprocess.run(
        ["git", "log", "--format=%H", "--diff-filter=A", "--", "infra/emulated/gcs.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if not added:
        raise SystemExit("no commit adds infra/emulated/gcs.py here; give --baseline REF")
    return f"{added[-1]}^"


def export_tree(ref: str, target: Path) -> Path:
    archive = target / "tree.tar"
    with open(archive, "wb") as f:
        subprocess.run(["git", "archive", ref], cwd=ROOT, stdout=f, check=True)
    tree = target / "tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    return tree


def local_up(tree: Path, state_dir: Path) -> dict:
    """Run ``multislice local up`` of ``tree``; its wall time (s) and summary."""
    summary = state_dir / "summary.json"
    env = {**os.environ, "MULTISLICE_STATE_DIR": str(state_dir), "PYTHONPATH": str(tree)}
    for key in ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES"):
        env.pop(key, None)
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "infra.cli", *UP, "--summary-json", str(summary)],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    wall = time.monotonic() - start
    if result.returncode != 0:
        raise SystemExit(f"local up in {tree} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    data = json.loads(summary.read_text())
    return {
        "wall_s": round(wall, 2),
        "complete": data["complete"],
        "steps_lost": data["steps_lost"],
        "restarts": data["restarts"],
    }


def metrics_sync_bytes(steps: int, log_every: int, tmp: Path) -> dict:
    """Bytes uploaded per metrics sync of a ``steps``-step run on a gs:// run directory."""
    with GcsServer(tmp / "gcs", tmp / "fake-gcs-server.log") as server:
        server.create_bucket("bench-metrics")
        restore = point_clients_at(server.url)
        try:
            log = RecordLog(RunDir("gs://bench-metrics/runs/bench"), "metrics")
            per_sync: dict[int, int] = {}
            total = 0
            rewrite: dict[int, int] = {}
            for step in range(1, steps + 1):
                log.append(
                    {
                        "step": step,
                        "loss": 2.0 + 1.0 / step,
                        "grad_norm": 0.123456,
                        "learning_rate": 0.003 * (1 - step / steps),
                        "step_time_s": 0.1234,
                        "tokens_per_s": 16598.0,
                        "tflops_per_device": 0.01234,
                    }
                )
                if step % log_every == 0:
                    sent = log.sync()
                    total += sent
                    per_sync[step] = sent
                    rewrite[step] = total  # one growing object uploaded whole
            objects = len(RunDir("gs://bench-metrics/runs/bench").list("metrics/*"))
        finally:
            restore()
    return {"per_sync": per_sync, "rewrite": rewrite, "objects": objects}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--baseline", help="git ref of the directory-bucket emulation (default: see above)")
    parser.add_argument("--repeat", type=int, default=1, help="local up runs of each tree")
    parser.add_argument("--steps", type=int, default=10_000, help="steps of the metrics-sync measurement")
    parser.add_argument("--skip-wall", action="store_true", help="only the metrics-sync measurement")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out: dict = {"load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp_name:
        tmp = Path(tmp_name)
        sync = metrics_sync_bytes(args.steps, 10, tmp / "sync")
        early, late = sync["per_sync"][100], sync["per_sync"][args.steps]
        out["metrics_sync_bytes"] = {
            "step_100": early,
            f"step_{args.steps}": late,
            "ratio": round(late / early, 3),
            "objects": sync["objects"],
            "rewrite_step_100": sync["rewrite"][100],
            f"rewrite_step_{args.steps}": sync["rewrite"][args.steps],
        }
        if not args.skip_wall:
            ref = args.baseline or baseline_commit()
            baseline = export_tree(ref, tmp)
            runs: dict[str, list[dict]] = {"gcs": [], "directory": []}
            for i in range(args.repeat):
                runs["gcs"].append(local_up(ROOT, tmp / f"gcs-{i}"))
                runs["directory"].append(local_up(baseline, tmp / f"dir-{i}"))
            gcs_wall = min(r["wall_s"] for r in runs["gcs"])
            dir_wall = min(r["wall_s"] for r in runs["directory"])
            out["local_up"] = {
                "command": "multislice " + " ".join(UP),
                "baseline": ref,
                "runs": runs,
                "best_gcs_s": gcs_wall,
                "best_directory_s": dir_wall,
                "ratio": round(gcs_wall / dir_wall, 3),
            }
        out["load_average_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    m = out["metrics_sync_bytes"]
    print(f"load average before: {' '.join(f'{x:.1f}' for x in out['load_average'])}")
    print(
        f"metrics sync, bytes uploaded: step 100 {m['step_100']}, step {args.steps} {m[f'step_{args.steps}']} "
        f"(ratio {m['ratio']}, target ≈ 1; {m['objects']} objects); one rewritten file would upload "
        f"{m['rewrite_step_100']} and {m[f'rewrite_step_{args.steps}']}"
    )
    if "local_up" in out:
        u = out["local_up"]
        print(
            f"`{u['command']}` (best of {args.repeat}): emulated Cloud Storage {u['best_gcs_s']:.1f} s, "
            f"directory bucket ({u['baseline']}) {u['best_directory_s']:.1f} s: ratio {u['ratio']} "
            f"(target ≤ {TARGET_WALL_RATIO})"
        )
        for kind, results in u["runs"].items():
            for r in results:
                print(f"  {kind}: {r}")
    print(f"load average after: {' '.join(f'{x:.1f}' for x in out['load_average_after'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

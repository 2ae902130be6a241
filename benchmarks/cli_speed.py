"""How long the ``multislice`` commands that neither train nor evaluate the program take on
this machine, against their targets (issue 12: "every command that does not train or evaluate
the program returns in ≤ 1.5 s"; issue 77: ``status`` and ``local logs``, run in watch loops,
≤ 0.5 s, ``plan``, ``render`` and ``local status`` ≤ 0.7 s; ``check`` and ``diff`` evaluate the
program and have none: they are listed to compare).

    uv run --frozen python benchmarks/cli_speed.py [--repeat 5] [--busy 2] [--only plan status ...]
                                                   [--before DIR] [--json]

Each figure is a whole command as a user runs it (``python -m infra.cli`` in the checkout, a
fresh process: interpreter start, imports, work, exit): its wall time and its CPU time (user +
system, the operating system's account of the process and the children it waited for), the
median of ``--repeat`` runs taken in turns after one untimed run of each (which compiles the
bytecode a user's machine has cached; kept in a temporary ``PYTHONPYCACHEPREFIX`` even where
``PYTHONDONTWRITEBYTECODE`` is set, and fills the checkout's content cache,
``.multislice/cache``, as the user's previous command did). On a loaded machine the wall time
is the CPU time stretched by waiting for a core; on an idle one the two are close.

* ``--busy N`` runs N CPU-bound processes (``while True: pass``) beside the commands for the
  whole measurement, and stops them after: the commands as they answer under load.
* ``--before DIR`` times a second checkout (a clone at the commit before a change, with the same
  ``.venv`` linked in) in the same run, command by command in turns (A B, then B A), and prints
  the ratio this/before of each pair's figures (median): on a shared machine only ratios
  measured in one run compare.

The commands (``--only`` picks some by their first word(s): ``plan``, ``local status``, ...):
``local status`` and ``local logs`` find nothing run (a private ``MULTISLICE_STATE_DIR``);
``status`` reads a deployed emu stack (a 2-slice queued resource ACTIVE in the loopback Cloud
TPU API fake, tests/fakes/tpu_api.py, and a 1,000-step run in an emulated Cloud Storage,
tests/fakes/synthetic_run.py, as benchmarks/status_time.py builds them); ``diff`` compares the
working tree with ``HEAD``. The load average (1 min) is printed before and after. Exit 1 when a
command's median wall time is over its target (without ``--busy``: the targets are an unloaded
machine's), else 0.
tests/cli/test_light_imports.py checks what the light commands import (not their time).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LEGACY_TARGET_S = 1.5
STACK = ROOT / "tests" / "stacks" / "Pulumi.emu.yaml"
STATUS_STEPS = 1_000

#: name → (argv after ``multislice``, target in seconds or None). ``STATUS_STACK`` in an argv is
#: replaced by the deployed emu stack's file.
COMMANDS: dict[str, tuple[list[str], float | None]] = {
    "--help": (["--help"], LEGACY_TARGET_S),
    "local up --help": (["local", "up", "--help"], LEGACY_TARGET_S),
    "local down (nothing running)": (["local", "down"], LEGACY_TARGET_S),
    "local up --kill typo": (["local", "up", "--config-file", str(STACK), "--kill", "x"], LEGACY_TARGET_S),
    "local up --preempt out of range": (
        ["local", "up", "--config-file", str(STACK), "--preempt", "9@1"],
        LEGACY_TARGET_S,
    ),
    "plan": (["plan", "--stack", "dev"], 0.7),
    "plan --json": (["plan", "--stack", "dev", "--json"], 0.7),
    "render": (["render", "--stack", "dev"], 0.7),
    "render --config": (["render", "--stack", "dev", "--config"], 0.7),
    "status (deployed emu stack)": (["status", "--config-file", "STATUS_STACK", "--json"], 0.5),
    "local status (nothing run)": (["local", "status", "--stack", "dev"], 0.7),
    "local logs (nothing run)": (["local", "logs", "--stack", "dev"], 0.5),
    "check (evaluates the program)": (["check", "--stack", "dev"], None),
    "diff --against HEAD (evaluates it twice)": (["diff", "--stack", "dev", "--against", "HEAD"], None),
}


def timed(checkout: Path, argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run of ``multislice ARGV`` in ``checkout``."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "infra.cli", *argv],
        env={**env, "PYTHONPATH": str(checkout)},
        cwd=checkout,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, status, usage = os.wait4(proc.pid, 0)  # this child's own account (and its children's)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return wall, usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def spinning(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes beside the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def deployed_stack(tmp: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """The emu stack deployed in the loopback fakes with a run of :data:`STATUS_STEPS` steps in
    its bucket: its stack file and the environment that points ``status`` at the fakes."""
    import yaml

    from infra.config import load_stack_file
    from infra.emulated.gcs import GcsServer
    from tests.fakes.queued_resource import props_for, provider_for
    from tests.fakes.synthetic_run import Fault, SyntheticRun, upload
    from tests.fakes.tpu_api import FakeTpuApi

    with GcsServer(tmp / "gcs", tmp / "gcs.log") as server, FakeTpuApi() as fake:
        env = {**server.client_env(), "MULTISLICE_TPU_API_ENDPOINT": fake.endpoint}
        saved = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            bucket = "cli-speed"
            server.create_bucket(bucket)
            document = yaml.safe_load(STACK.read_text())
            document["config"]["multislice:bucket"] = {"name": bucket}
            document["config"]["multislice:training"]["steps"] = STATUS_STEPS
            stack = tmp / "Pulumi.emu.yaml"
            stack.write_text(yaml.safe_dump(document))
            config = load_stack_file(stack)
            provider_for(fake).create(props_for(config))
            run = SyntheticRun(
                total_steps=STATUS_STEPS,
                steps_done=STATUS_STEPS * 9 // 10,
                log_every=10,
                checkpoint_every=100,
                faults=[Fault("failure", STATUS_STEPS // 3 + 5), Fault("preemption", STATUS_STEPS // 2)],
            )
            upload(config.run_dir, run.objects())
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        yield stack, env


def selected(only: list[str]) -> dict[str, tuple[list[str], float | None]]:
    if not only:
        return COMMANDS
    chosen = {name: spec for name, spec in COMMANDS.items() if any(name.startswith(prefix) for prefix in only)}
    if not chosen:
        sys.exit(f"--only {' '.join(only)}: no such command (commands: {', '.join(COMMANDS)})")
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per command (median reported)")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes beside the commands")
    parser.add_argument("--only", nargs="*", default=[], help="the commands whose names start so")
    parser.add_argument("--before", type=Path, help="a second checkout, timed in turns with this one")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    commands = selected(args.only)
    checkouts = {"this": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    with tempfile.TemporaryDirectory(prefix="cli-speed-") as tmp, contextlib.ExitStack() as stack:
        # A user's Python keeps the bytecode it compiled (__pycache__); an environment with
        # PYTHONDONTWRITEBYTECODE set (CI images, sandboxes) would compile every module from
        # source on every run. Keep it in a temporary prefix, filled by the untimed runs.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
        env.update(MULTISLICE_STATE_DIR=str(Path(tmp) / "state"), PYTHONPYCACHEPREFIX=str(Path(tmp) / "bytecode"))
        envs = {name: env for name in commands}
        argvs = {name: argv for name, (argv, _) in commands.items()}
        if any("STATUS_STACK" in argv for argv in argvs.values()):
            status_stack, status_env = stack.enter_context(deployed_stack(Path(tmp)))
            for name, argv in argvs.items():
                if "STATUS_STACK" in argv:
                    argvs[name] = [str(status_stack) if a == "STATUS_STACK" else a for a in argv]
                    envs[name] = {**env, **status_env}
        for name in commands:  # untimed: bytecode compiled, caches filled
            for checkout in checkouts.values():
                timed(checkout, argvs[name], envs[name])
        stack.enter_context(spinning(args.busy))
        load_before = os.getloadavg()[0]
        wall: dict[str, dict[str, list[float]]] = {c: {name: [] for name in commands} for c in checkouts}
        cpu: dict[str, dict[str, list[float]]] = {c: {name: [] for name in commands} for c in checkouts}
        for turn in range(args.repeat):
            for name in commands:
                order = list(checkouts) if turn % 2 == 0 else list(reversed(checkouts))
                for which in order:
                    seconds, cpu_seconds = timed(checkouts[which], argvs[name], envs[name])
                    wall[which][name].append(seconds)
                    cpu[which][name].append(cpu_seconds)
        load_after = os.getloadavg()[0]
    median = statistics.median
    figures = {
        name: {which: {"wall_s": median(wall[which][name]), "cpu_s": median(cpu[which][name])} for which in checkouts}
        for name in commands
    }
    if args.before:
        for name in commands:
            figures[name]["ratio"] = {
                figure: median(a / b for a, b in zip(runs["this"][name], runs["before"][name], strict=True))
                for figure, runs in (("wall", wall), ("cpu", cpu))
            }
    if args.json:
        document = {
            "load_average_1min": [load_before, load_after],
            "cpus": os.cpu_count(),
            "busy": args.busy,
            "repeat": args.repeat,
            "checkouts": {name: str(path) for name, path in checkouts.items()},
            "figures": figures,
            "runs": {"wall_s": wall, "cpu_s": cpu},
        }
        print(json.dumps(document, indent=2))
        return
    print(
        f"load average (1 min) {load_before:.1f} before, {load_after:.1f} after; {os.cpu_count()} CPUs; "
        f"{args.busy} CPU-bound processes beside; median of {args.repeat} runs (wall / CPU seconds)"
    )
    for name, (_, target) in commands.items():
        this = figures[name]["this"]
        verdict = "" if target is None else f"  target {target} s: {'ok' if this['wall_s'] <= target else 'OVER'}"
        line = f"  {name:<42} {this['wall_s']:6.2f} / {this['cpu_s']:5.2f}"
        if args.before:
            before, ratio = figures[name]["before"], figures[name]["ratio"]
            line += f"   before {before['wall_s']:6.2f} / {before['cpu_s']:5.2f}"
            line += f"   ratio {ratio['wall']:.2f} / {ratio['cpu']:.2f}"
        print(line + verdict)
    over = [name for name, (_, target) in commands.items() if target and figures[name]["this"]["wall_s"] > target]
    sys.exit(1 if over and not args.busy else 0)  # the targets are for a machine without load


if __name__ == "__main__":
    main()

"""The README's test command, run again and again with CPU-bound processes beside it.

    python3 benchmarks/suite_under_load.py [--runs 3] [--busy 2] [--repeat-tests NODEID ...]
        [--repeat 20] [--together] [--log-dir DIR]

A suite that passes only on an idle machine fails for newcomers and for CI, whose 2 cores are
often shared. This starts ``--busy`` processes that spin (``python3 -c 'while True: pass'``: two
keep a 2-core machine's load at 2 before the tests add their own), then runs the README's test
command (``.venv-uv/bin/uv run --frozen pytest``, from the repository) ``--runs`` times in a row,
stopping at the first failure, and prints one line per run: its exit status, pytest's summary
line, its wall time and the load average over it. With ``--repeat-tests``, it runs the given tests
(pytest node ids) ``--repeat`` times in a row each instead, under the same load; with
``--together``, each of the ``--repeat`` runs is one pytest command of all of them (the README's
``-n 3`` runs them side by side, which loads the machine as the suite does). Every run's
output is kept in ``--log-dir`` (default: a new temporary directory). Exit 0 when every run
passed.

No timing is asserted: the wall times are printed for the record (docs/development.md, "Measured").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The README's test command, run in the repository.
TEST_COMMAND = [str(ROOT / ".venv-uv" / "bin" / "uv"), "run", "--frozen", "pytest"]
SPIN = [sys.executable, "-c", "while True: pass"]


def summary_line(output: str) -> str:
    """pytest's last summary line (``2033 passed, 2 skipped in 607.20s``), or the last line."""
    found = re.findall(r"^=*\s*(\d+ (?:passed|failed|error).*?)\s*=*$", output, re.M)
    lines = [line for line in output.splitlines() if line.strip()]
    return found[-1] if found else (lines[-1] if lines else "(no output)")


def run_once(command: list[str], log: Path) -> tuple[int, str, float, float]:
    """Run ``command`` in the repository, its output to ``log``; returns (status, summary, wall s, load)."""
    start, load_before = time.monotonic(), os.getloadavg()[0]
    with log.open("w") as out:
        status = subprocess.run(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    wall = time.monotonic() - start
    load = (load_before + os.getloadavg()[0]) / 2
    return status, summary_line(log.read_text(errors="replace")), wall, load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="Runs of the whole suite (default 3).")
    parser.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside it (default 2).")
    parser.add_argument("--repeat-tests", nargs="+", default=[], metavar="NODEID", help="Run these tests instead.")
    parser.add_argument("--repeat", type=int, default=20, help="Runs of each --repeat-tests test (default 20).")
    parser.add_argument("--together", action="store_true", help="Each repeat runs every --repeat-tests test at once.")
    parser.add_argument("--log-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="suite-under-load-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    if not args.repeat_tests:
        jobs = [(f"{i + 1}/{args.runs} suite", TEST_COMMAND) for i in range(args.runs)]
    elif args.together:
        named = f"{len(args.repeat_tests)} tests"
        jobs = [(f"{i + 1}/{args.repeat} {named}", [*TEST_COMMAND, *args.repeat_tests]) for i in range(args.repeat)]
    else:
        jobs = [
            (f"{i + 1}/{args.repeat} {test}", [*TEST_COMMAND, test])
            for test in args.repeat_tests
            for i in range(args.repeat)
        ]
    spinners = [subprocess.Popen(SPIN) for _ in range(args.busy)]
    print(f"{args.busy} CPU-bound process(es) beside each run on {os.cpu_count()} cores; logs in {log_dir}")
    failed = 0
    try:
        for index, (name, command) in enumerate(jobs):
            status, summary, wall, load = run_once(command, log_dir / f"run-{index + 1:03d}.log")
            print(f"{name}: exit {status}, {summary}, {wall:.0f} s wall, load {load:.1f}", flush=True)
            if status != 0:
                failed += 1
                break
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    print("every run passed" if not failed else f"stopped at the first failure (its log: {log_dir})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

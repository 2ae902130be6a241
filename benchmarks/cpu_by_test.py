"""Where the suite's CPU goes: each test's wall time and CPU, and a table of the largest.

    PYTHONPATH=benchmarks PYTEST_ADDOPTS="-p cpu_by_test" CPU_BY_TEST_DIR=/tmp/cpu \\
        .venv-uv/bin/uv run --frozen pytest
    python3 benchmarks/cpu_by_test.py /tmp/cpu [--top 40]

As a pytest plugin (``-p cpu_by_test``, this module on ``PYTHONPATH``), it appends one JSON line
per test to ``$CPU_BY_TEST_DIR/<worker pid>.jsonl``: the node id, the wall seconds of its
setup, call and teardown together, and the CPU seconds (user + system, ``getrusage``) of the
pytest worker itself (``self``: in-process JAX tests) and of the processes the test started and
reaped (``children``: a trainer, ``multislice local up`` with every emulated VM under it; a
process a test leaves unreaped is not counted). Run as a script, it prints the totals, the
modules by CPU and the ``--top`` tests by CPU.

On 2 cores the suite cannot take less than its CPU over 2: this shows which tests make that
floor (docs/development.md, "Measured").
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

#: The directory the plugin writes to (one file per pytest process).
DIR_ENV = "CPU_BY_TEST_DIR"


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Record ``item``'s wall time and CPU (setup, call and teardown)."""
    del nextitem
    started, (own0, children0) = time.monotonic(), _cpu()
    yield
    wall, (own1, children1) = time.monotonic() - started, _cpu()
    out = Path(os.environ.get(DIR_ENV) or "cpu-by-test")
    out.mkdir(parents=True, exist_ok=True)
    record = {"id": item.nodeid, "wall": wall, "self": own1 - own0, "children": children1 - children0}
    with (out / f"{os.getpid()}.jsonl").open("a") as f:
        f.write(json.dumps(record) + "\n")


def read(directory: Path) -> list[dict[str, Any]]:
    """Every record the plugin wrote under ``directory``."""
    return [json.loads(line) for path in sorted(directory.glob("*.jsonl")) for line in path.read_text().splitlines()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--top", type=int, default=40)
    args = parser.parse_args(argv)
    records = read(args.directory)
    if not records:
        parser.error(f"no records under {args.directory}: run the suite with the plugin first")
    own = sum(r["self"] for r in records)
    children = sum(r["children"] for r in records)
    total = own + children
    print(f"{len(records)} tests: {total:.0f} CPU-s ({own:.0f} in the workers, {children:.0f} in what they started)")
    modules: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0.0])
    for r in records:
        totals = modules[r["id"].split("::")[0]]
        totals[0] += r["self"] + r["children"]
        totals[1] += r["wall"]
        totals[2] += 1
    print(f"\n{'CPU-s':>7} {'wall s':>7} {'tests':>5}  module")
    for name, (cpu, wall, count) in sorted(modules.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{cpu:7.1f} {wall:7.1f} {count:5.0f}  {name}")
    print(f"\n{'CPU-s':>7} {'wall s':>7}  test")
    for r in sorted(records, key=lambda r: -(r["self"] + r["children"]))[: args.top]:
        print(f"{r['self'] + r['children']:7.1f} {r['wall']:7.1f}  {r['id']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

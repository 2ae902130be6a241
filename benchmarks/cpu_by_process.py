"""Where a command's CPU goes, by the kind of process: trainers, pytest workers, the emulated
systemd, the CLI, the emulated Cloud Storage, and the rest.

    python3 benchmarks/cpu_by_process.py [--acct FILE] [--top 25] [--commands 40] -- .venv-uv/bin/uv run --frozen pytest

benchmarks/cpu_by_test.py says which tests use the CPU; this says which processes do, the
short-lived ones included (a ``systemctl`` call, a ``python -c`` that reads JSON), which no
sampler sees. It turns on the kernel's BSD process accounting (``accton FILE``: the ``acct``
package, and root), runs the command, turns it off, and reads each ended process's user and
system CPU from the file (``dump-acct``; acct(5)). The accounting file names a process only by
its first 16 characters, so a thread beside the command lists ``/proc/<pid>/cmdline`` of every
new process ten times a second, and each record is named by its pid's command line (a process
that lived less than a tenth of a second may go unnamed: ``unseen``). A process that is still
running when the command ends is not counted. No timing is asserted: the table is for the record
(docs/development.md, "Measured").
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: Kinds of process, by a pattern of the command line (the first that matches).
KINDS = (
    ("pytest worker", r"exec\(eval\("),
    ("trainer (emulated VM)", r"bash \S+ run \S*python|-m training run"),
    ("standby and its attempts (emulated VM)", r"-m training\.standby\b"),
    ("trainer handoff (emulated VM)", r"-m training\.standby_handoff"),
    ("log shipper (emulated VM)", r"-m training\.log_shipping"),
    ("training completed-by", r"-m training completed-by"),
    ("trainer (tests.trainer_process)", r"-m tests\.trainer_process"),
    ("emulated Cloud Storage", r"fake-gcs-server"),
    ("emulated systemd", r"-m infra\.emulated\.systemd\b"),
    ("emulated systemctl", r"-m infra\.emulated\.systemctl"),
    ("multislice CLI", r"-m infra\.cli|bin/multislice "),
    ("lifeline", r"-m infra\.emulated\.lifeline"),
)


def command_lines(stop: threading.Event, seen: dict[int, str]) -> None:
    """Until ``stop``, add each new pid's command line to ``seen``."""
    while not stop.wait(0.1):
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in seen:
                continue
            try:
                raw = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            seen[int(entry.name)] = raw.replace(b"\0", b" ").decode(errors="replace").strip()


def kind(command: str | None, comm: str) -> str:
    """The kind of a process with this command line (None: never seen) and accounting name."""
    if command is None:
        return f"unseen ({comm})"
    for name, pattern in KINDS:
        if re.search(pattern, command):
            return name
    return "other: " + (command.split()[0].rsplit("/", 1)[-1] if command else comm)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--acct", type=Path, help="the accounting file (default: a new temporary one)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--commands",
        type=int,
        default=0,
        metavar="N",
        help="also the N command lines with most CPU (their first 100 characters, digits as #)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    acct = args.acct or Path(tempfile.mkdtemp(prefix="cpu-by-process-")) / "pacct"
    acct.touch()
    seen: dict[int, str] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=command_lines, args=(stop, seen), daemon=True)
    subprocess.run(["accton", str(acct)], check=True)
    watcher.start()
    try:
        code = subprocess.run(command, check=False).returncode
    finally:
        subprocess.run(["accton", "off"], check=True)
        stop.set()
        watcher.join()
    totals: dict[str, float] = collections.defaultdict(float)
    counts: collections.Counter[str] = collections.Counter()
    by_command: dict[str, float] = collections.defaultdict(float)
    command_counts: collections.Counter[str] = collections.Counter()
    dump = subprocess.run(["dump-acct", str(acct)], check=True, capture_output=True, text=True).stdout
    for line in dump.splitlines():
        fields = [field.strip() for field in line.split("|")]
        comm, user, system, pid = fields[0], float(fields[2]), float(fields[3]), int(fields[9])
        name = kind(seen.get(pid), comm)
        cpu = (user + system) / 100  # dump-acct prints clock ticks (AHZ = 100)
        totals[name] += cpu
        counts[name] += 1
        line_of = re.sub(r"\d+", "#", " ".join(seen.get(pid, f"({comm})").split()))[:100]
        by_command[line_of] += cpu
        command_counts[line_of] += 1
    print(f"exit {code}; {sum(totals.values()):.0f} CPU-s in {sum(counts.values())} processes (accounting: {acct})")
    print(f"{'CPU-s':>8} {'processes':>9}  kind")
    for name, cpu in sorted(totals.items(), key=lambda item: -item[1])[: args.top]:
        print(f"{cpu:8.1f} {counts[name]:9d}  {name}")
    if args.commands:
        print(f"\n{'CPU-s':>8} {'processes':>9}  command line")
        for line_of, cpu in sorted(by_command.items(), key=lambda item: -item[1])[: args.commands]:
            print(f"{cpu:8.1f} {command_counts[line_of]:9d}  {line_of}")
    return code


if __name__ == "__main__":
    sys.exit(main())

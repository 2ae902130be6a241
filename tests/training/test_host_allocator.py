"""training.host_allocator: the trainer's process gets glibc's huge-page tunable (and keeps a
user's own setting of it), by re-executing itself with the same PID and arguments."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from training import host_allocator

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "current,expected",
    [
        (None, "glibc.malloc.hugetlb=1"),
        ("", "glibc.malloc.hugetlb=1"),
        ("glibc.malloc.arena_max=2", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
        ("glibc.malloc.hugetlb_x=3", "glibc.malloc.hugetlb_x=3:glibc.malloc.hugetlb=1"),
    ],
)
def test_the_tunable_is_appended_to_the_environment(current, expected):
    env = {"PATH": "/bin"} | ({} if current is None else {"GLIBC_TUNABLES": current})
    assert host_allocator.with_tunable(env) == {"PATH": "/bin", "GLIBC_TUNABLES": expected}


@pytest.mark.parametrize("current", ["glibc.malloc.hugetlb=0", "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"])
def test_a_users_own_setting_of_the_tunable_is_kept(current):
    assert host_allocator.with_tunable({"GLIBC_TUNABLES": current}) is None


#: Prints a line as it starts (flushed, so a re-executed process prints it twice), then asks
#: for the tunable, then prints what it runs with.
PROBE = (
    "import os, sys; from training import host_allocator; "
    "print('start', os.getpid(), flush=True); "
    "host_allocator.reexec_with_tunable(); "
    "print('after', os.getpid(), os.environ.get('GLIBC_TUNABLES'), f'optimize={sys.flags.optimize}', *sys.argv[1:])"
)


def probe(env_tunables: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"} | {"PYTHONPATH": str(ROOT)}
    if env_tunables is not None:
        env["GLIBC_TUNABLES"] = env_tunables
    return subprocess.run(
        [sys.executable, "-O", "-c", PROBE, "--flag", "value"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.splitlines()


@pytest.mark.skipif(not host_allocator.glibc_has_tunable(), reason="needs glibc >= 2.35 on Linux")
def test_the_process_reexecutes_itself_with_the_tunable_keeping_pid_options_and_arguments():
    lines = probe(None)
    pid = lines[0].split()[1]
    assert lines == [f"start {pid}", f"start {pid}", f"after {pid} glibc.malloc.hugetlb=1 optimize=1 --flag value"]


def test_a_process_that_names_the_tunable_runs_on_without_reexecuting():
    lines = probe("glibc.malloc.hugetlb=0")
    pid = lines[0].split()[1]
    assert lines == [f"start {pid}", f"after {pid} glibc.malloc.hugetlb=0 optimize=1 --flag value"]

"""The trainer's host memory allocator: glibc's transparent-huge-page tunable.

XLA's CPU runtime allocates a step's buffers with ``malloc`` (``posix_memalign``) and frees
them when the step ends. glibc serves every allocation above its mmap threshold (at most
32 MiB on 64-bit; ``mallopt(3)`` ``M_MMAP_THRESHOLD``) with a fresh ``mmap`` and unmaps it on
``free``, so each step touches new pages: hundreds of thousands of page faults per step, and
the kernel zeroing every 4 KiB page (docs/model.md "Throughput": 700,000 faults per step of
the ~125M preset on CPU). The tunable ``glibc.malloc.hugetlb=1`` makes ``malloc`` advise
transparent huge pages (``madvise(MADV_HUGEPAGE)``) on those mappings and on heap growth
(glibc manual, "Memory Allocation Tunables":
https://www.gnu.org/software/libc/manual/html_node/Memory-Allocation-Tunables.html; new in
glibc 2.35), so the kernel backs them with 2 MiB pages where
``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``: 512 times fewer
faults. On an accelerator the step's buffers live in device memory; there the tunable touches
only the host's own large allocations (e.g. a checkpoint's host copies).

glibc reads ``GLIBC_TUNABLES`` once, when a process starts, so :func:`reexec_with_tunable`
replaces the process by itself with the tunable added; ``python -m training run`` calls it
before anything else. A ``GLIBC_TUNABLES`` that already names ``glibc.malloc.hugetlb`` (e.g.
``=0`` to turn it off) is left as it is.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping

#: The tunable and the value the trainer runs with.
TUNABLE = "glibc.malloc.hugetlb"
VALUE = "1"
#: The first glibc with ``glibc.malloc.hugetlb`` (glibc 2.35 NEWS).
MIN_GLIBC = (2, 35)


def with_tunable(env: Mapping[str, str]) -> dict[str, str] | None:
    """``env`` with ``glibc.malloc.hugetlb=1`` appended to ``GLIBC_TUNABLES`` (colon-separated
    ``name=value`` pairs), or None when ``GLIBC_TUNABLES`` already names that tunable."""
    current = env.get("GLIBC_TUNABLES", "")
    if any(item.partition("=")[0] == TUNABLE for item in current.split(":")):
        return None
    return {**env, "GLIBC_TUNABLES": f"{current}:{TUNABLE}={VALUE}" if current else f"{TUNABLE}={VALUE}"}


def glibc_has_tunable() -> bool:
    """Whether this process runs on glibc ≥ 2.35 (Linux; ``platform.libc_ver``)."""
    if sys.platform != "linux":
        return False
    lib, version = platform.libc_ver()
    try:
        parts = tuple(int(p) for p in version.split(".")[:2])
    except ValueError:
        return False
    return lib == "glibc" and parts >= MIN_GLIBC


def reexec_with_tunable() -> None:
    """Replace this process by itself (``os.execve``: same PID, same interpreter options and
    arguments, ``sys.orig_argv`` with the interpreter's absolute path first, so a virtual
    environment's interpreter finds its environment again) with :func:`with_tunable`'s
    environment; return at once when glibc lacks the tunable or the environment names it
    already. Call it before any thread or output exists."""
    env = with_tunable(os.environ)
    if env is None or not glibc_has_tunable():
        return
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)

"""An emulated node's mount rules: a node folder that a Pod sees non-executable, as a GKE TPU node's
Container-Optimized OS mounts ``/var``.

Facts:

* [Google] Container-Optimized OS, "Disks and file system overview"
  (https://cloud.google.com/container-optimized-os/docs/concepts/disks-and-filesystem): ``/home``
  and ``/var`` are "writable, non-executable, stateful"; of ``/var`` only ``/var/lib/google``,
  ``/var/lib/docker`` and ``/var/lib/toolbox`` are executable; ``/tmp`` is non-executable;
  ``/var/lib/cloud``, ``/etc`` and ``/mnt/disks`` are executable but stateless (tmpfs).
* [Linux] A ``hostPath`` volume is a bind mount of the node's folder into the container, and a bind
  mount keeps the per-mount flags of the mount it comes from (mount(8), "Bind mount operation": "the
  filesystem mount options maintained by the kernel will remain the same as those on the original
  mount point"). On a ``MS_NOEXEC`` mount execve(2) fails with ``EACCES`` and mmap(2) of a file with
  ``PROT_EXEC`` (a shared library's code) with ``EPERM``.

How the emulation does it (:func:`enter_noexec`): the emulated Pod's first process enters a mount
namespace of its own (unshare(2) ``CLONE_NEWNS``, with ``CLONE_NEWUSER`` when this machine's user is
not root: user_namespaces(7)), makes every mount in it private (nothing propagates back to this
machine: mount_namespaces(7)), bind-mounts each node folder onto itself and remounts that bind
``MS_NOEXEC``, keeping the flags its source has (a user namespace locks them: mount(2), ``EPERM``).
The kernel then refuses what a COS node refuses, to the Pod's processes alone; the namespace ends
with them. A machine that allows neither (no privilege, user namespaces off) cannot emulate the rule:
:func:`noexec_problem` says why, and the emulation says so instead of pretending.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import cache
from pathlib import Path

# unshare(2) and mount(2) flags (<sched.h>, <sys/mount.h>).
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_STRICTATIME = 16384, 1 << 18, 1 << 24
# statvfs(3) f_flag bits, and the mount(2) flag each one is.
_KEPT_FLAGS = {
    os.ST_RDONLY: MS_RDONLY,
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
}
ST_RELATIME = 4096  # <sys/statvfs.h>; not in Python's os module


class MountUnavailable(OSError):
    """This machine cannot mount a folder non-executable for a process (the reason in the message)."""


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise MountUnavailable(errno, f"{name}: {os.strerror(errno)}")


def _mount(source: str | None, target: str | None, flags: int) -> None:
    _libc_call(
        "mount",
        None if source is None else os.fsencode(source),
        None if target is None else os.fsencode(target),
        None,
        ctypes.c_ulong(flags),
        None,
    )


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_noexec(folders: Sequence[Path]) -> None:
    """Make ``folders`` non-executable for this process and every process it starts from now on
    (see the module docstring); nothing changes for any other process. Call it while this process
    has one thread (unshare(2) refuses ``CLONE_NEWUSER`` otherwise).

    Raises:
      MountUnavailable: the namespace or a mount was refused (no privilege, user namespaces off).
    """
    uid, gid = os.getuid(), os.getgid()
    try:
        if uid == 0:
            _libc_call("unshare", CLONE_NEWNS)
        else:
            _libc_call("unshare", CLONE_NEWUSER | CLONE_NEWNS)
            _write("/proc/self/setgroups", "deny")  # user_namespaces(7): before gid_map, unprivileged
            _write("/proc/self/uid_map", f"{uid} {uid} 1")
            _write("/proc/self/gid_map", f"{gid} {gid} 1")
        _mount(None, "/", MS_REC | MS_PRIVATE)
        for folder in folders:
            target = str(folder)
            kept = os.statvfs(target).f_flag
            flags = MS_REMOUNT | MS_BIND | MS_NOEXEC
            flags |= sum(ms for st, ms in _KEPT_FLAGS.items() if kept & st)
            if not kept & (os.ST_NOATIME | ST_RELATIME):
                flags |= MS_STRICTATIME
            _mount(target, target, MS_BIND)
            _mount(None, target, flags)
    except MountUnavailable:
        raise
    except OSError as err:
        raise MountUnavailable(err.errno, f"{err.strerror or err}") from err


#: The probe, run in a child of its own (a namespace, once entered, cannot be left).
_PROBE = """
import os, sys
from pathlib import Path
from infra.emulated.node_mounts import enter_noexec, MountUnavailable
folder = Path(sys.argv[1])
program = folder / "probe"
program.write_text("#!/bin/sh\\nexit 0\\n")
program.chmod(0o755)
try:
    enter_noexec([folder])
except MountUnavailable as err:
    print(err.strerror)
    sys.exit(0)
try:
    os.execv(str(program), [str(program)])
except PermissionError:
    print("ok")
"""


@cache
def noexec_problem() -> str | None:
    """None if this machine can mount a folder non-executable for an emulated Pod (tried once, in a
    child process, then remembered); else why it cannot (the namespace or the mount was refused).

    Raises:
      RuntimeError: the mount was made and the folder's program still ran (:func:`enter_noexec` is broken).
    """
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="multislice-noexec-") as folder:
        try:
            done = subprocess.run(
                [sys.executable, "-c", _PROBE, folder],
                env={**os.environ, "PYTHONPATH": str(root)},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"the probe did not run ({err})"
    answer = done.stdout.strip()
    if answer == "ok":
        return None
    if not answer:  # mounted, yet the program ran: a fault of this module, not of the machine
        raise RuntimeError(
            f"the noexec probe ran its program from the folder (status {done.returncode}): {done.stderr}"
        )
    return answer

"""The objects of a run directory (``gs://<bucket>/runs/<run>/`` or a local path), read from their
bytes: the one place where what another process, another VM or an earlier run wrote there is
decoded. Each caller then checks the value against what its writer writes, beside its own type:

* membership records ``membership/<epoch>.json`` (:mod:`training.membership`);
* heartbeats ``heartbeats/slice-S-worker-W.json`` (:mod:`training.heartbeats`);
* the ``COMPLETE`` marker (:mod:`training.checkpoint.completion`, ``infra/status/progress.py``,
  :mod:`training.workload`);
* the run's recorded ``TrainConfig`` (:mod:`training.checkpoint.manager`);
* each line of the run's logs ``events/``, ``metrics/`` (:mod:`training.metrics.run_log`), the goodput
  report (``infra/status/progress.py``) and a dataset's manifest (:mod:`training.data.manifest`).

Bounds: an object of at most :data:`MAX_OBJECT_BYTES` (the largest, a manifest of many shards, is a
few MB), nesting no deeper than Python's parser takes (past it, a ``RecursionError`` would escape
every caller's ``except ValueError``), integers of at most 4,300 digits (Python's own limit).

A local object's bytes (a run directory or a prepared dataset on a disk: another process may have
put anything at a name) are read by :func:`file_bytes`, the trainer's twin of
``infra/readers/files.py``'s ``read_bounded``: the file is opened ``O_NONBLOCK`` and judged by
``fstat`` on the open descriptor (:func:`open_regular`: opening a FIFO for reading waits for a
writer, reading ``/dev/zero`` never ends), and at most ``limit`` bytes are read. Its refusal,
:class:`UnreadableObject`, is both an ``OSError`` (what a failed read raises) and a ``ValueError``
(what a damaged object raises): each caller's existing handling of either words it.

The trainer ships to the VMs and imports nothing of ``infra/``; ``infra/`` reads these objects
through this module too (its own readers of outside bytes are ``infra/readers/``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

#: The most bytes of one object decoded, and of one local object read (see the module docstring).
MAX_OBJECT_BYTES = 64 << 20


#: What a file that is not a regular file is, by its ``stat`` mode.
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableObject(OSError, ValueError):
    """A local object that is there but cannot be read as one (the message says why: a FIFO, a
    directory, over the limit, or the OS's reason). An ``OSError`` and a ``ValueError`` alike (as
    ``io.UnsupportedOperation`` is): callers catch it where they catch a failed read or a damaged
    object."""


def open_regular(path: str | os.PathLike[str]) -> int:
    """A descriptor of the regular file ``path`` (symbolic links followed), opened ``O_NONBLOCK`` and
    judged by ``fstat`` on it; the caller closes it.

    Raises:
      FileNotFoundError: there is no file at ``path`` (or a folder of it is missing).
      NotADirectoryError: a folder of ``path`` is a file.
      UnreadableObject: not a regular file, or the OS refused it (its reason).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except ValueError:  # a NUL in the name
        raise FileNotFoundError(errno.ENOENT, "no such file (a NUL in its name)", repr(os.fspath(path))) from None
    except OSError as err:
        raise UnreadableObject(err.strerror or str(err)) from None
    try:
        mode = os.fstat(fd).st_mode
    except OSError as err:
        os.close(fd)
        raise UnreadableObject(err.strerror or str(err)) from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "a special file")
        raise UnreadableObject(f"{kind}, not a regular file")
    return fd


def file_bytes(path: str | os.PathLike[str], limit: int = MAX_OBJECT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (a file whose ``stat`` size
    is 0 but which has more is read no further either).

    Raises:
      FileNotFoundError: there is no file at ``path`` (or a folder of it is missing).
      NotADirectoryError: a folder of ``path`` is a file.
      UnreadableObject: not a regular file, over ``limit`` bytes, or the OS refused it (its reason).
    """
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise UnreadableObject(f"{size:,} bytes, over the {limit:,} read")
        chunks: list[bytes] = []
        length = 0
        while length <= limit:
            chunk = os.read(fd, limit + 1 - length)
            if not chunk:
                break
            chunks.append(chunk)
            length += len(chunk)
    except UnreadableObject:
        raise
    except OSError as err:
        raise UnreadableObject(err.strerror or str(err)) from None
    finally:
        os.close(fd)
    if length > limit:
        raise UnreadableObject(f"over {limit:,} bytes, the most read")
    return b"".join(chunks)


def json_record(data: bytes, limit: int = MAX_OBJECT_BYTES) -> Any:
    """The JSON value of an object's ``data`` (UTF-8 JSON, as every writer of the run directory
    writes it).

    Raises:
      ValueError: over ``limit`` bytes, not UTF-8 (``UnicodeDecodeError``), not JSON
        (``json.JSONDecodeError``), nested deeper than the parser takes, or an integer past
        Python's digit limit.
    """
    if len(data) > limit:
        raise ValueError(f"{len(data):,} bytes, over the {limit:,} a run-directory object may have")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested deeper than this reader takes") from None

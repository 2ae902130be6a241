"""A file's bytes read within bounds: the one way this package reads a file it did not write in this
process (a stack file, a local run's records).

:func:`read_bounded` refuses what is not a regular file before reading it (symbolic links followed):
opening a FIFO for reading waits for a writer and reading ``/dev/zero`` never ends, so the file is
opened ``O_NONBLOCK`` and judged by ``fstat`` on the open descriptor (a file replaced between a
check and the open is judged as it is opened). It reads at most ``limit`` bytes: a file whose size
``stat`` does not tell (``/proc`` files show 0) is read no further. What the OS refuses (a name too
long, a folder it may not search, a loop of links) is the same error with the OS's reason.

:func:`open_regular` is its first half, for a reader that reads part of a file (its first line, its
end, what was appended since the last read): the descriptor of a regular file, judged the same
way; the caller bounds what it reads and closes it.

Errors: :class:`FileNotFoundError` when there is no file (:class:`NotADirectoryError` when a folder
of its path is a file); :class:`UnreadableFile`, with the reason in words (``why``), for everything
else.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

#: What a file that is not a regular file is, by its ``stat`` mode (``stat.S_IS*``).
FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnreadableFile(OSError):
    """A file that is there but cannot be read as one: ``why`` says how; ``kind`` is a special
    file's kind, ``too_long`` True for a file over the limit, and ``size`` its size when ``stat``
    told it (None when the read found it)."""

    def __init__(self, why: str, kind: str | None = None, *, too_long: bool = False, size: int | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.kind = kind
        self.too_long = too_long
        self.size = size


def special_kind(mode: int) -> str | None:
    """What a ``stat`` mode is when it is not a regular file (``"a FIFO"``), or None."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in FILE_KINDS if test(mode)), "a special file")


def open_regular(path: Path | str) -> int:
    """A descriptor of the regular file ``path``, opened ``O_NONBLOCK`` (no wait for a FIFO's writer)
    and judged by ``fstat`` on it (see the module docstring); the caller closes it.

    Raises:
      FileNotFoundError: there is no file at ``path`` (or a folder of it is missing).
      NotADirectoryError: a folder of ``path`` is a file.
      UnreadableFile: not a regular file (``kind`` says what), or the OS refused it (its reason).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise
    except ValueError:  # a NUL in the name
        raise FileNotFoundError(errno.ENOENT, "no such file (a NUL in its name)", repr(str(path))) from None
    except OSError as err:
        raise UnreadableFile(err.strerror or str(err)) from None
    try:
        kind = special_kind(os.fstat(fd).st_mode)
    except OSError as err:
        os.close(fd)
        raise UnreadableFile(err.strerror or str(err)) from None
    if kind is not None:
        os.close(fd)
        raise UnreadableFile(f"{kind}, not a regular file", kind)
    return fd


def read_bounded(path: Path | str, limit: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (see the module docstring).

    Raises:
      FileNotFoundError: there is no file at ``path`` (or a folder of it is missing).
      NotADirectoryError: a folder of ``path`` is a file.
      UnreadableFile: not a regular file, over ``limit`` bytes, or the OS refused it (its reason).
    """
    fd = open_regular(path)
    try:
        info = os.fstat(fd)
        if info.st_size > limit:
            raise UnreadableFile(f"{info.st_size:,} bytes, over the {limit:,} read", too_long=True, size=info.st_size)
        chunks: list[bytes] = []
        length = 0
        while length <= limit:
            chunk = os.read(fd, limit + 1 - length)
            if not chunk:
                break
            chunks.append(chunk)
            length += len(chunk)
    except UnreadableFile:
        raise
    except OSError as err:
        raise UnreadableFile(err.strerror or str(err)) from None
    finally:
        os.close(fd)
    if length > limit:
        raise UnreadableFile(f"over {limit:,} bytes, the most read", too_long=True)
    return b"".join(chunks)

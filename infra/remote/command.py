"""The command line a worker's shell runs, from ``multislice exec -- CMD...``.

The words after ``--`` are joined with single spaces into one shell command line, as ssh(1)
joins its command arguments ("If a command is specified, it is executed on the remote host
instead of a login shell"; https://man.openbsd.org/ssh): ``multislice exec -- 'echo $HOSTNAME'``
expands ``$HOSTNAME`` on each worker, ``multislice exec -- echo $HOSTNAME`` here. The same line
goes to ``gcloud … ssh --command`` on Cloud TPU and to ``bash -c`` in an emulated VM.

``--background`` wraps it so that it outlives the connection, as the Multislice overview
recommends for long commands: ``nohup`` with standard input, output and error redirected
(ssh returns only once nothing holds the session's output open), output to a log file in the
worker's home directory, and the started process id printed.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from datetime import UTC, datetime

#: Directory (relative to the worker's home, where its shell starts) of ``--background`` logs.
BACKGROUND_DIR = "multislice-exec"


class EmptyCommand(ValueError):
    """No command was given after ``--``."""


def command_line(words: Sequence[str]) -> str:
    """The shell command line of ``words`` (joined with spaces, as ssh does).

    Raises:
      EmptyCommand: no words, or only blank ones.
    """
    line = " ".join(words).strip()
    if not line:
        raise EmptyCommand("no command: write it after --, e.g. multislice exec --stack dev -- hostname")
    return line


def background_log(stamp: str | None = None) -> str:
    """``multislice-exec/<UTC time>.log``: where a ``--background`` command's output goes on
    each worker (relative to its home directory)."""
    stamp = stamp or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{BACKGROUND_DIR}/{stamp}.log"


def in_background(line: str, log: str) -> str:
    """A command line that starts ``line`` detached (``nohup bash -c …``, stdin from
    /dev/null, stdout and stderr to ``log``) and prints ``started pid <pid>; output: <log>``."""
    quoted_log = shlex.quote(log)
    # The braces keep `&` to the nohup alone: `mkdir && nohup … &` would background the whole
    # list in a subshell that holds the session's output open until the command ends.
    return (
        f"mkdir -p {shlex.quote(log.rsplit('/', 1)[0]) if '/' in log else '.'} && "
        f"{{ nohup bash -c {shlex.quote(line)} > {quoted_log} 2>&1 < /dev/null & "
        f'echo "started pid $!; output: $PWD/"{quoted_log}; }}'
    )

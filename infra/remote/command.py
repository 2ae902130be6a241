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

:func:`run_once` puts a guard before a line that gcloud's TPU ssh may send more than once: that
ssh runs the whole remote command again whenever ssh exits 255, up to 10 times 5 s apart
(``AttemptRunWithRetries`` in gcloud's
``lib/googlecloudsdk/command_lib/compute/tpus/tpu_vm/ssh.py``, gcloud 528), and ssh exits 255
both when it cannot connect and when an established connection drops. The guard is the first
thing the worker's shell runs: it leaves a marker file, and refuses (exit
:data:`RERUN_REFUSED_EXIT`, one line naming why) when the marker is already there. A retry after
a failed connection (the command never started) runs the command; a retry after the command
started does not run it again.
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime

from infra import invocation

#: Directory (relative to the worker's home, where its shell starts) of ``--background`` logs.
BACKGROUND_DIR = "multislice-exec"
#: Directory (relative to the worker's home) of :func:`run_once`'s markers; markers older than
#: :data:`MARKER_DAYS` days are removed by later commands.
STARTED_DIR = f"{BACKGROUND_DIR}/.started"
MARKER_DAYS = 30
#: Exit status of a command that :func:`run_once`'s guard did not run again.
RERUN_REFUSED_EXIT = 75
#: The start of the line the guard prints when it refuses.
RERUN_REFUSED_MESSAGE = "multislice exec: this command already started on this worker"


class EmptyCommand(ValueError):
    """No command was given after ``--``."""


def command_line(words: Sequence[str]) -> str:
    """The shell command line of ``words`` (joined with spaces, as ssh does).

    Raises:
      EmptyCommand: no words, or only blank ones.
    """
    line = " ".join(words).strip()
    if not line:
        raise EmptyCommand(f"no command: write it after --, e.g. {invocation.command('exec --stack dev -- hostname')}")
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


def run_id(stamp: str | None = None) -> str:
    """A new id for one ``exec`` (``20261201T170315Z-1a2b3c4d``): UTC time and 8 random hex
    digits, so two calls in the same second differ."""
    stamp = stamp or datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{secrets.token_hex(4)}"


def run_once(line: str, marker: str) -> str:
    """``line`` behind a guard (see the module docstring): when
    ``multislice-exec/.started/<marker>`` exists in the worker's home the shell prints
    :data:`RERUN_REFUSED_MESSAGE` and the rest of the reason on stderr and exits
    :data:`RERUN_REFUSED_EXIT`; else it creates the file, removes markers older than
    :data:`MARKER_DAYS` days, and runs ``line`` (on the next line of the script, so ``line`` is
    parsed as written). A home where the marker cannot be written runs ``line`` unguarded.

    Raises:
      ValueError: ``marker`` is not made of letters, digits, ``.``, ``_`` and ``-``.
    """
    if not marker or not all(c.isascii() and (c.isalnum() or c in "._-") for c in marker):
        raise ValueError(f"marker {marker!r}: letters, digits, '.', '_' and '-' only")
    path = f"{STARTED_DIR}/{marker}"
    refusal = (
        f"{RERUN_REFUSED_MESSAGE} (ssh exited 255 after it started: a dropped connection, or the command's own "
        "exit status 255; gcloud retried the ssh); it was not run again. It may still be running; a long command "
        "belongs in --background"
    )
    return (
        f"if [ -e {path} ]; then echo {shlex.quote(refusal)} >&2; exit {RERUN_REFUSED_EXIT}; fi; "
        f"mkdir -p {STARTED_DIR} 2>/dev/null && : > {path} 2>/dev/null; "
        f"find {STARTED_DIR} -type f -mtime +{MARKER_DAYS} -delete 2>/dev/null\n{line}"
    )

"""gcloud for ``multislice exec``, whatever the backend: the executable, OpenSSH's tools, gcloud's
SSH key pair made once, and how a worker's ssh ended.

Before any ssh starts: :func:`require_ssh_tools` finds OpenSSH's ``ssh``, ``scp`` and
``ssh-keygen``, which gcloud requires (``Environment.RequireSSH`` in gcloud's
``lib/googlecloudsdk/command_lib/util/ssh/ssh.py``); :func:`ensure_ssh_key` makes gcloud's key pair
once, as gcloud would. Each gcloud ssh runs ``ssh-keygen`` when ``~/.ssh/google_compute_engine``
is missing (``Keys.EnsureKeysExist``; concurrent processes race on the same files: a second
``ssh-keygen`` asks to overwrite and, without a terminal, fails; a process that sees one file of
the pair written calls the pair broken, which ``--quiet`` does not repair): so the key first.
Two ``multislice exec`` at once race the same way, so :func:`ensure_ssh_key` makes the pair under
a lock file beside the key (:func:`key_lock_path`) and calls a pair broken only while it holds it.
The transport of each backend (``tpu-vm ssh`` to a queued resource's nodes, ``compute ssh`` to a
compute-engine stack's VMs) is the backend's own (:meth:`infra.backends.interface.Backend.exec_plan`).

``$MULTISLICE_GCLOUD`` names the gcloud to run (default ``gcloud`` on ``PATH``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infra.readers.files import open_regular
from infra.remote.command import RERUN_REFUSED_EXIT, RERUN_REFUSED_MESSAGE
from infra.remote.fanout import Outcome, describe_code
from infra.remote.selection import RemoteError

#: Environment variable naming the gcloud executable.
GCLOUD_ENV = "MULTISLICE_GCLOUD"
#: The OpenSSH programs gcloud requires before any ssh (``Environment.COMMANDS`` and
#: ``RequireSSH`` in gcloud's ``lib/googlecloudsdk/command_lib/util/ssh/ssh.py``).
SSH_TOOLS = ("ssh", "scp", "ssh-keygen")
#: gcloud's private key without ``--ssh-key-file`` (``Keys.DEFAULT_KEY_FILE``, same file); the
#: public key is this plus ``.pub``.
KEY_FILE = "~/.ssh/google_compute_engine"
#: The most of a key file's first line read (:func:`_key_file_state`): a key's first line is a PEM
#: header (under 40 bytes) or a public key (under 1 KB for RSA 4096); only whether it is blank counts.
KEY_LINE_BYTES = 4096
#: Seconds ``ssh-keygen`` may take.
KEYGEN_TIMEOUT_S = 60.0
#: Seconds a process waits for the key's lock (:func:`key_lock_path`) while another makes the
#: pair: longer than that one's ``ssh-keygen`` may take.
KEY_LOCK_TIMEOUT_S = KEYGEN_TIMEOUT_S + 30.0
#: Seconds between tries of the key's lock.
KEY_LOCK_POLL_S = 0.05


def gcloud_executable() -> str:
    """``$MULTISLICE_GCLOUD`` or ``gcloud``, resolved on ``PATH``.

    Raises:
      RemoteError: not found, or ``$MULTISLICE_GCLOUD`` names no executable (exit 2).
    """
    override = os.environ.get(GCLOUD_ENV)
    found = shutil.which(override or "gcloud")
    if found is not None:
        return found
    if override:
        raise RemoteError(f"{GCLOUD_ENV} is set to {override!r}, {_not_executable(override)}")
    raise RemoteError(
        "'gcloud' was not found on PATH: install the Google Cloud CLI "
        "(https://cloud.google.com/sdk/docs/install) with its alpha component, or set "
        f"{GCLOUD_ENV} to its path"
    )


def _not_executable(value: str) -> str:
    """Why ``$MULTISLICE_GCLOUD``'s ``value`` runs nothing, and what to set it to."""
    fix = "set it to the gcloud executable (e.g. ~/google-cloud-sdk/bin/gcloud), or unset it to run gcloud from PATH"
    path = Path(value)
    if os.sep not in value:
        return f"which is not on PATH: {fix}"
    if path.is_dir():
        inside = [p for p in (path / "bin" / "gcloud", path / "gcloud") if p.is_file() and os.access(p, os.X_OK)]
        return f"a directory: set it to the gcloud executable in it, {inside[0]}" if inside else f"a directory: {fix}"
    if path.is_file():
        return f"a file that is not executable: {fix}"
    return f"which {'is not a file' if path.exists() else 'does not exist'}: {fix}"


def require_ssh_tools() -> str:
    """The path of ``ssh-keygen``, once ``ssh``, ``scp`` and ``ssh-keygen`` are all on ``PATH``
    (gcloud looks them up the same way: ``files.FindExecutableOnPath`` in
    ``Environment.__init__``, then ``RequireSSH`` fails with "Your platform does not support
    SSH." when any is missing; gcloud's ``lib/googlecloudsdk/command_lib/util/ssh/ssh.py``).

    Raises:
      RemoteError: any of them missing (exit 2), named.
    """
    found = {name: shutil.which(name) for name in SSH_TOOLS}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise RemoteError(
            f"{', '.join(missing)} not found on PATH: gcloud's TPU ssh needs OpenSSH's ssh, scp and ssh-keygen; "
            "install the OpenSSH client (Debian and Ubuntu: openssh-client), then exec"
        )
    keygen = found["ssh-keygen"]
    assert keygen is not None
    return keygen


def key_paths() -> tuple[Path, Path]:
    """gcloud's private and public key files: :data:`KEY_FILE` with ``~`` expanded from
    ``$HOME``, and the same plus ``.pub`` (``Keys.__init__``: ``files.ExpandHomeDir``, then
    ``os.path.realpath``; gcloud's ``command_lib/util/ssh/ssh.py``)."""
    private = Path(os.path.realpath(os.path.expanduser(KEY_FILE)))
    return private, private.with_name(private.name + ".pub")


def key_lock_path(private: Path) -> Path:
    """The lock file beside the private key, ``<key>.lock`` (``~/.ssh/google_compute_engine.lock``):
    :func:`ensure_ssh_key` holds an exclusive ``flock`` on it while it checks and makes the pair.
    gcloud itself does not know it. It is left in place (removing it would let a process that
    waits on the old file and one that opens a new one both hold "the" lock)."""
    return private.with_name(private.name + ".lock")


def ensure_ssh_key(keygen: str) -> Path | None:
    """Make gcloud's key pair if neither file exists, the way ``tpu-vm ssh --quiet`` would, and
    return the private key's path; None when both files are already there.

    gcloud (``Keys.EnsureKeysExist`` and ``KeygenCommand.Build`` in its
    ``command_lib/util/ssh/ssh.py``): a file that is missing is absent, one that is empty or
    unreadable is broken; with both absent it creates the key's directory with mode 0700 (after
    a prompt that ``--quiet`` answers yes) and runs ``ssh-keygen -N '' -t rsa -f <key>`` — ``-N
    ''`` (no passphrase) because ``--quiet`` sets ``core/disable_prompts``, so
    ``console_io.CanPrompt()`` is false. A broken pair it offers to delete, and ``--quiet``
    declines (``RemoveKeyFilesIfPermittedOrFail``: ``PromptContinue(default=False,
    cancel_on_no=True)``), so every worker would fail: it is refused here first.

    Unless both files are there, the pair is checked and made under an exclusive ``flock`` of
    :func:`key_lock_path` (``~/.ssh/google_compute_engine.lock``, made in the key's directory,
    mode 0600), waited for up to :data:`KEY_LOCK_TIMEOUT_S` (90 s) while another process holds
    it: so a second ``multislice exec`` that finds the private key written and not yet its
    ``.pub`` waits for the first one's ``ssh-keygen`` to end, then checks again, and calls the
    pair broken only when no other process is making it.

    Raises:
      RemoteError: one file of the pair missing, empty or unreadable, with no other process
        making the pair (exit 2); ``ssh-keygen`` failed or timed out, the directory cannot be
        made, the lock file cannot be opened or locked, or the lock is still held by another
        process after :data:`KEY_LOCK_TIMEOUT_S` (the lock file named) (exit 1).
    """
    private, public = key_paths()
    if all(_key_file_state(path) == "present" for path in (private, public)):
        return None
    try:
        private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as err:
        raise RemoteError(f"cannot make {private}: {err.strerror or err}; nothing was run", 1) from None
    with _key_lock(key_lock_path(private)):
        return _make_key_pair(keygen, private, public)


@contextmanager
def _key_lock(lock: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` of ``lock`` (made if missing), trying every
    :data:`KEY_LOCK_POLL_S` for up to :data:`KEY_LOCK_TIMEOUT_S`; closing the file releases it
    (and so does the end of the process, however it ends).

    Raises:
      RemoteError: the file cannot be opened or locked, or another process held it throughout
        (exit 1).
    """
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as err:
        raise RemoteError(f"cannot open {lock}: {err.strerror or err}; nothing was run", 1) from None
    try:
        deadline = time.monotonic() + KEY_LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RemoteError(
                        f"another process (a multislice exec making gcloud's SSH key) held {lock} for "
                        f"{KEY_LOCK_TIMEOUT_S:.0f} s; nothing was run: let it end, then exec",
                        1,
                    ) from None
                _wait_for_holder(lock)
            except OSError as err:
                raise RemoteError(f"cannot lock {lock}: {err.strerror or err}; nothing was run", 1) from None
        yield
    finally:
        os.close(fd)


def _wait_for_holder(lock: Path) -> None:
    """Wait before the next try of ``lock``, which another process holds."""
    del lock
    time.sleep(KEY_LOCK_POLL_S)


def _make_key_pair(keygen: str, private: Path, public: Path) -> Path | None:
    """:func:`ensure_ssh_key`'s check and ``ssh-keygen``, with the key's lock held."""
    states = {path: _key_file_state(path) for path in (private, public)}
    if all(state == "present" for state in states.values()):
        return None
    if any(state != "absent" for state in states.values()):
        words = {"present": "exists", "absent": "is missing", "broken": "is empty or unreadable"}
        described = ", ".join(f"{path} {words[state]}" for path, state in states.items())
        raise RemoteError(
            f"gcloud's SSH key files are broken ({described}); gcloud --quiet will not replace them: restore the "
            f"missing one, or remove both so that a new pair is made, then exec"
        )
    argv = [keygen, "-N", "", "-t", "rsa", "-f", str(private)]
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=KEYGEN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(
            f"ssh-keygen did not make {private} within {KEYGEN_TIMEOUT_S:.0f} s; nothing was run", 1
        ) from None
    except OSError as err:
        raise RemoteError(f"cannot make {private}: {err.strerror or err}; nothing was run", 1) from None
    if proc.returncode != 0 or _key_file_state(public) != "present":
        lines = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        why = lines[-1] if lines else f"exit {proc.returncode}"
        raise RemoteError(f"ssh-keygen could not make {private} ({why}); nothing was run", 1)
    return private


def _key_file_state(path: Path) -> str:
    """``present``, ``absent`` or ``broken`` (empty or unreadable), as gcloud's
    ``Keys._WarnOrReadFirstKeyLine`` tells them (a present file has a non-blank first line): a
    regular file (``open_regular``: a FIFO is broken, not waited on) of whose first line at most
    :data:`KEY_LINE_BYTES` are read."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return "absent"
    except OSError:
        return "broken"
    try:
        first = os.read(fd, KEY_LINE_BYTES).split(b"\n", 1)[0]
    except OSError:
        return "broken"
    finally:
        os.close(fd)
    return "present" if first.decode("utf-8", errors="replace").strip() else "broken"


def credentials_error(stderr: str) -> bool:
    """gcloud's stderr says its credentials cannot be used (see :func:`check_deployed`)."""
    return any(
        text in stderr
        for text in (
            "gcloud auth login",
            "You do not currently have an active account selected",
            "There was a problem refreshing",
            "There was a problem reauthenticating",
        )
    )


def last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["gcloud failed with no message"])[-1]


def rerun_refused(outcome: Outcome) -> bool:
    """The worker's command was not run again by :func:`~infra.remote.command.run_once`'s guard:
    its status is :data:`~infra.remote.command.RERUN_REFUSED_EXIT` and its output holds the
    guard's line.

    Raises:
      OSError: the worker's log cannot be read (other than missing).
    """
    if outcome.code != RERUN_REFUSED_EXIT:
        return False
    try:
        with open(outcome.log_path, encoding="utf-8", errors="replace") as log:
            return any(RERUN_REFUSED_MESSAGE in line for line in log)
    except FileNotFoundError:
        return False


def describe(outcome: Outcome) -> str:
    """How a Cloud TPU worker ended, for the failure line: ``exit 3``, or for a command the guard
    did not run again ``exit 75: ssh failed after the command started (a dropped connection, or
    the command's own 255); not run again``.

    Raises:
      OSError: the worker's log cannot be read (other than missing).
    """
    code = describe_code(outcome.code)
    if rerun_refused(outcome):
        why = "ssh failed after the command started (a dropped connection, or the command's own 255)"
        return f"{code}: {why}; not run again"
    return code

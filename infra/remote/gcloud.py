"""``multislice exec`` on Cloud TPU: one ``gcloud … tpu-vm ssh`` per selected worker, through IAP.

The TPU VMs have no external IPs, so SSH reaches them through Identity-Aware Proxy TCP
forwarding (https://cloud.google.com/iap/docs/using-tcp-forwarding): the stack's firewall must
admit IAP's range on port 22, which ``multislice:network.iapSsh: true`` does
(``infra.components.network``). gcloud 528's GA ``compute tpus tpu-vm ssh`` has no
``--tunnel-through-iap`` (its GA command class sets ``_ENABLE_IAP = False``; the flag is
refused as "available in one or more alternate release tracks"); the alpha track has it
(https://cloud.google.com/sdk/gcloud/reference/alpha/compute/tpus/tpu-vm/ssh), so each worker
gets::

    gcloud alpha compute tpus tpu-vm ssh <node> --zone=<zone> --project=<project> \\
        --worker=<w> --tunnel-through-iap --quiet --command=<line>

``<node>`` is the slice's node id (``StackConfig.node_ids``: ``<queued resource id>-<slice>``
for a multislice queued resource, the id itself for one slice); ``--worker`` takes one index
(https://cloud.google.com/sdk/gcloud/reference/compute/tpus/tpu-vm/ssh); ``--quiet`` (a
gcloud-wide flag) answers every prompt with its default, since no one can answer one per
worker. ``<line>`` is the command behind :func:`infra.remote.command.run_once`'s guard, because
gcloud's TPU ssh sends the whole command again whenever ssh exits 255.

Before any ssh starts: :func:`require_ssh_tools` finds OpenSSH's ``ssh``, ``scp`` and
``ssh-keygen``, which gcloud requires (``Environment.RequireSSH`` in gcloud's
``lib/googlecloudsdk/command_lib/util/ssh/ssh.py``); :func:`check_deployed` reads the queued
resource with ``gcloud compute tpus queued-resources describe`` (the same credentials the ssh
uses) and refuses a stack that is not deployed or not ACTIVE, or credentials gcloud cannot use;
:func:`ensure_ssh_key` makes gcloud's key pair once, as gcloud would.

Why the key first, and one worker per node first: each ``tpu-vm ssh`` prepares its node
(``PrepareNodeForSSH`` in gcloud's ``lib/googlecloudsdk/command_lib/compute/tpus/tpu_vm/ssh.py``):
it runs ``ssh-keygen`` when ``~/.ssh/google_compute_engine`` is missing
(``Keys.EnsureKeysExist``; concurrent processes race on the same files: a second ``ssh-keygen``
asks to overwrite and, without a terminal, fails; a process that sees one file of the pair
written calls the pair broken, which ``--quiet`` does not repair), then adds the public key to
the node's ``ssh-keys`` metadata unless it is there or in the project's metadata
(``AddSSHKeyIfNeeded``: an UpdateNode, waited for; only an HTTP 409 from it is ignored), and
only then connects (``AttemptRunWithRetries``, which prints ``SSH: Attempting to connect to
worker W...`` first). So :func:`targets` starts the first selected worker of each node at once
and the node's other workers once it has printed that line (:data:`READY_MARKER`), when the key
is on the node and theirs finds it there.

``$MULTISLICE_GCLOUD`` names the gcloud to run (default ``gcloud`` on ``PATH``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from infra.remote.command import RERUN_REFUSED_EXIT, RERUN_REFUSED_MESSAGE, run_id, run_once
from infra.remote.fanout import Outcome, Target, describe_code
from infra.remote.selection import RemoteError, Worker

#: Environment variable naming the gcloud executable.
GCLOUD_ENV = "MULTISLICE_GCLOUD"
#: The ssh command group: alpha, the track whose ``tpu-vm ssh`` has ``--tunnel-through-iap``.
SSH_COMMAND = ("alpha", "compute", "tpus", "tpu-vm", "ssh")
#: Seconds the ``describe`` of :func:`check_deployed` may take.
DESCRIBE_TIMEOUT_S = 120.0
#: The OpenSSH programs gcloud requires before any ssh (``Environment.COMMANDS`` and
#: ``RequireSSH`` in gcloud's ``lib/googlecloudsdk/command_lib/util/ssh/ssh.py``).
SSH_TOOLS = ("ssh", "scp", "ssh-keygen")
#: gcloud's private key without ``--ssh-key-file`` (``Keys.DEFAULT_KEY_FILE``, same file); the
#: public key is this plus ``.pub``.
KEY_FILE = "~/.ssh/google_compute_engine"
#: Seconds ``ssh-keygen`` may take.
KEYGEN_TIMEOUT_S = 60.0
#: The status line gcloud's TPU ssh prints once the node is prepared (key on the node), before
#: each connection attempt: ``'{}: Attempting to connect to worker {}...'.format('SSH', worker)``
#: (``AttemptRunWithRetries`` in gcloud's ``command_lib/compute/tpus/tpu_vm/ssh.py``).
READY_MARKER = "Attempting to connect to worker"


def gcloud_executable() -> str:
    """``$MULTISLICE_GCLOUD`` or ``gcloud``, resolved on ``PATH``.

    Raises:
      RemoteError: not found (exit 2).
    """
    name = os.environ.get(GCLOUD_ENV) or "gcloud"
    found = shutil.which(name)
    if found is None:
        raise RemoteError(
            f"{name!r} was not found on PATH: install the Google Cloud CLI "
            "(https://cloud.google.com/sdk/docs/install) with its alpha component, or set "
            f"{GCLOUD_ENV} to its path"
        )
    return found


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

    Raises:
      RemoteError: one file of the pair missing, empty or unreadable (exit 2); ``ssh-keygen``
        failed or timed out, or the directory cannot be made (exit 1).
    """
    private, public = key_paths()
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
        private.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
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
    ``Keys._WarnOrReadFirstKeyLine`` tells them (a present file has a non-blank first line)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "present" if f.readline().strip() else "broken"
    except FileNotFoundError:
        return "absent"
    except OSError:
        return "broken"


def ssh_argv(gcloud: str, config, worker: Worker, line: str) -> list[str]:
    """The gcloud argument list that runs ``line`` on ``worker`` (see the module docstring)."""
    return [
        gcloud,
        *SSH_COMMAND,
        worker.node,
        f"--zone={config.zone}",
        f"--project={config.project}",
        f"--worker={worker.worker}",
        "--tunnel-through-iap",
        "--quiet",
        f"--command={line}",
    ]


def describe_argv(gcloud: str, config) -> list[str]:
    """``gcloud compute tpus queued-resources describe <id> --zone --project --format=json``."""
    return [
        gcloud,
        "compute",
        "tpus",
        "queued-resources",
        "describe",
        config.queued_resource_id,
        f"--zone={config.zone}",
        f"--project={config.project}",
        "--format=json",
    ]


def check_deployed(gcloud: str, config) -> dict:
    """The stack's queued resource as gcloud describes it, if it is ACTIVE.

    gcloud without usable credentials fails with a message that names ``gcloud auth login``
    (``AuthenticationException`` and ``ReauthenticationException`` in gcloud's
    ``lib/googlecloudsdk/core/credentials/exceptions.py``: no active account, a token that does
    not refresh, reauthentication); that is refused with the command to run.

    Raises:
      RemoteError: not deployed (NOT_FOUND: one line naming the stack and ``pulumi up``), not
        ACTIVE, no usable credentials (naming ``gcloud auth login``; exit 2), or gcloud failed
        (its last error line; exit 1).
    """
    stack, qr = config.stack, config.queued_resource_id
    where = f"projects/{config.project}/locations/{config.zone}"
    try:
        proc = subprocess.run(
            describe_argv(gcloud, config), capture_output=True, text=True, timeout=DESCRIBE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(
            f"gcloud did not describe queued resource {qr} within {DESCRIBE_TIMEOUT_S:.0f} s; nothing was run", 1
        ) from None
    if proc.returncode != 0:
        error = last_error(proc.stderr)
        if credentials_error(proc.stderr):
            reason = error.split(") ", 1)[1] if error.startswith("ERROR: (") and ") " in error else error
            raise RemoteError(
                f"gcloud has no usable credentials ({reason.rstrip('.')}): run `gcloud auth login` (or `gcloud config "
                f"set account ACCOUNT` for an account already logged in), then exec; nothing was run"
            )
        if "NOT_FOUND" in error or "not found" in error.lower():
            raise RemoteError(
                f"stack {stack} is not deployed: queued resource {qr} not found in {where} (deleted once its run "
                f"completed, or never created); run `pulumi up --stack {stack}` first"
            )
        raise RemoteError(f"gcloud could not describe queued resource {qr} in {where}: {error}; nothing was run", 1)
    try:
        described = json.loads(proc.stdout)
        state = (described.get("state") or {}).get("state") or "STATE_UNSPECIFIED"
    except (ValueError, AttributeError):
        raise RemoteError(
            f"gcloud described queued resource {qr} in a form not understood: {proc.stdout[:200]!r}", 1
        ) from None
    if state != "ACTIVE":
        raise RemoteError(
            f"stack {stack}'s queued resource {qr} is {state}, not ACTIVE: its VMs are not all up; "
            f"see `multislice status --stack {stack}`"
        )
    return described


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


def targets(gcloud: str, config, workers: Sequence[Worker], line: str, run: str | None = None) -> list[Target]:
    """One :class:`~infra.remote.fanout.Target` per worker: its ``gcloud … ssh`` process, whose
    command is ``line`` behind :func:`~infra.remote.command.run_once`'s guard (marker
    ``<run>-slice-S-worker-W``; ``run`` defaults to a new :func:`~infra.remote.command.run_id`).
    The first worker of each node starts at once; the node's others start after it, on
    :data:`READY_MARKER` (see the module docstring)."""
    run = run or run_id()
    first: dict[str, int] = {}
    result = []
    for index, w in enumerate(workers):
        leader = first.setdefault(w.node, index)
        guarded = run_once(line, f"{run}-slice-{w.slice_id}-worker-{w.worker}")
        result.append(
            Target(
                w.slice_id,
                w.worker,
                ssh_argv(gcloud, config, w, guarded),
                after=None if leader == index else leader,
                ready_marker=READY_MARKER,
            )
        )
    return result


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

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

Before any ssh starts (and before gcloud's key pair is made once:
:func:`infra.remote.gcloud.ensure_ssh_key`): :func:`check_deployed` reads the queued resource
with ``gcloud compute tpus queued-resources describe`` (the same credentials the ssh uses) and
refuses a stack that is not deployed or not ACTIVE, or credentials gcloud cannot use.

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
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from infra import invocation
from infra.remote.command import run_id, run_once
from infra.remote.fanout import Target
from infra.remote.gcloud import credentials_error, last_error
from infra.remote.selection import RemoteError, Worker

#: The ssh command group: alpha, the track whose ``tpu-vm ssh`` has ``--tunnel-through-iap``.
SSH_COMMAND = ("alpha", "compute", "tpus", "tpu-vm", "ssh")
#: Seconds the ``describe`` of :func:`check_deployed` may take.
DESCRIBE_TIMEOUT_S = 120.0
#: The status line gcloud's TPU ssh prints once the node is prepared (key on the node), before
#: each connection attempt: ``'{}: Attempting to connect to worker {}...'.format('SSH', worker)``
#: (``AttemptRunWithRetries`` in gcloud's ``command_lib/compute/tpus/tpu_vm/ssh.py``).
READY_MARKER = "Attempting to connect to worker"


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
    from training.run_objects import json_record  # jax-free; here, not above: the program never imports it

    try:
        described = json_record(proc.stdout.encode())  # 64 MiB, nesting bounded: else a ValueError
        state = (described.get("state") or {}).get("state") or "STATE_UNSPECIFIED"
    except (ValueError, AttributeError):
        raise RemoteError(
            f"gcloud described queued resource {qr} in a form not understood: {proc.stdout[:200]!r}", 1
        ) from None
    if state != "ACTIVE":
        raise RemoteError(
            f"stack {stack}'s queued resource {qr} is {state}, not ACTIVE: its VMs are not all up; "
            f"see `{invocation.command('status', stack)}`"
        )
    return described


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

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
worker. Before any ssh starts, :func:`check_deployed` reads the queued resource with
``gcloud compute tpus queued-resources describe`` (the same credentials the ssh uses) and
refuses a stack that is not deployed or not ACTIVE.

``$MULTISLICE_GCLOUD`` names the gcloud to run (default ``gcloud`` on ``PATH``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence

from infra.remote.fanout import Target
from infra.remote.selection import RemoteError, Worker

#: Environment variable naming the gcloud executable.
GCLOUD_ENV = "MULTISLICE_GCLOUD"
#: The ssh command group: alpha, the track whose ``tpu-vm ssh`` has ``--tunnel-through-iap``.
SSH_COMMAND = ("alpha", "compute", "tpus", "tpu-vm", "ssh")
#: Seconds the ``describe`` of :func:`check_deployed` may take.
DESCRIBE_TIMEOUT_S = 120.0


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

    Raises:
      RemoteError: not deployed (NOT_FOUND: one line naming the stack and ``pulumi up``), not
        ACTIVE, or gcloud failed (its last error line).
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
        error = _last_error(proc.stderr)
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


def _last_error(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or ["gcloud failed with no message"])[-1]


def targets(gcloud: str, config, workers: Sequence[Worker], line: str) -> list[Target]:
    """One :class:`~infra.remote.fanout.Target` per worker: its ``gcloud … ssh`` process."""
    return [Target(w.slice_id, w.worker, ssh_argv(gcloud, config, w, line)) for w in workers]

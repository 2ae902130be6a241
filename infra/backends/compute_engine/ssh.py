"""``multislice exec`` on the compute-engine backend: one ``gcloud compute ssh`` per selected
VM, through IAP.

The VMs have no external IPs (as on Cloud TPU), so SSH goes through Identity-Aware Proxy TCP
forwarding (https://cloud.google.com/iap/docs/using-tcp-forwarding), admitted by
``multislice:network.iapSsh: true``. Each worker gets::

    gcloud compute ssh <instance> --zone=<zone> --project=<project> --tunnel-through-iap \\
        --quiet --command=<line>

Read in the installed gcloud 528, ``lib/surface/compute/ssh.py`` (GA ``Ssh``): ``[USER@]INSTANCE``
positional; ``--zone`` (``flags.AddZoneFlag``); ``--command`` ("A command to run on the virtual
machine"; split on spaces and handed to ssh(1), which joins its words with spaces again);
``--tunnel-through-iap`` in GA (``iap_tunnel.AddSshTunnelArgs``, when ``SupportIAP()``, i.e. in
Google's default universe); ``--quiet`` and ``--project`` are gcloud-wide. ``<instance>`` is
the slice's VM of that worker index (:func:`infra.backends.compute_engine.instance_groups.workers_of`).

Unlike ``tpu-vm ssh``, ``compute ssh`` does not send the command again: an ssh exit 255 raises
``ssh.CommandError`` (``Run``: "Errors from SSH itself result in an ssh.CommandError"). The
command still goes behind :func:`infra.remote.command.run_once`'s guard, so a command is never
run twice on a worker whatever the client does.

The key: ``compute ssh`` makes gcloud's key pair when missing (``ssh_helper.Run`` →
``Keys.EnsureKeysExist``, as ``tpu-vm ssh``), so :func:`infra.remote.gcloud.ensure_ssh_key`
makes it once first. Without OS Login it then puts the public key in the **project's**
metadata (``EnsureSSHKeyExists`` → ``EnsureSSHKeyIsInProject``, a read-modify-write of the
project's ``commonInstanceMetadata`` with ``SetCommonInstanceMetadata``; on failure it falls
back to the instance's metadata), prints ``Waiting for SSH key to propagate.`` and polls the VM
until the key works (gcloud's ``command_lib/compute/ssh_utils.py``). One write serves every VM
of the project, and concurrent writes of the same metadata race, so :func:`targets` starts the
first selected worker of the whole stack at once and the others once it is connected: its
command line first prints :data:`READY_MARKER` on the VM (bounded, as every gate:
:data:`infra.remote.fanout.GATE_TIMEOUT_S`).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from infra import invocation
from infra.remote.command import run_id, run_once
from infra.remote.fanout import Target
from infra.remote.selection import Worker
from infra.vm_contract import TRAINER_UNIT

#: The ssh command group (GA).
SSH_COMMAND = ("compute", "ssh")
#: The line the first worker's command prints on its VM once connected (then the others start).
READY_MARKER = "multislice exec: connected to"


def reset_refusal(stack: str) -> str:
    """What ``multislice reset`` says on the compute-engine backend (exit 2; nothing is sent):
    docs/compute-engine.md section 5 finds no documented equivalent of ResetQueuedResource for a
    multi-host slice on Compute Engine."""
    return (
        f"stack {stack} uses multislice:backend: compute-engine, which has no reset: Compute Engine documents no "
        "equivalent of ResetQueuedResource for a multi-host slice (docs/compute-engine.md, section 5); nothing was "
        f"sent. To restart the trainer on every VM run `{invocation.command('exec', stack)} -- sudo systemctl restart "
        f"{TRAINER_UNIT}` (it restarts the release the VM booted: a release from a later `pulumi up` reaches "
        "running VMs through their release watch); to replace the VMs, `pulumi destroy` and `pulumi up` the stack"
    )


def ssh_argv(gcloud: str, config, instance: str, line: str) -> list[str]:
    """The gcloud argument list that runs ``line`` on ``instance`` (see the module docstring)."""
    return [
        gcloud,
        *SSH_COMMAND,
        instance,
        f"--zone={config.zone}",
        f"--project={config.project}",
        "--tunnel-through-iap",
        "--quiet",
        f"--command={line}",
    ]


def targets(
    gcloud: str, config, workers: Sequence[Worker], instances: dict[int, list[str]], line: str, run: str | None = None
) -> list[Target]:
    """One :class:`~infra.remote.fanout.Target` per worker: ``gcloud compute ssh`` to
    ``instances[slice][worker]`` running ``line`` behind the guard (marker
    ``<run>-slice-S-worker-W``). The first target starts at once and prints
    :data:`READY_MARKER` first; the others start after it (see the module docstring)."""
    run = run or run_id()
    result = []
    for index, w in enumerate(workers):
        instance = instances[w.slice_id][w.worker]
        own = line
        if index == 0 and len(workers) > 1:
            own = f"echo {shlex.quote(f'{READY_MARKER} {instance}')} >&2\n{line}"
        guarded = run_once(own, f"{run}-slice-{w.slice_id}-worker-{w.worker}")
        result.append(
            Target(
                w.slice_id,
                w.worker,
                ssh_argv(gcloud, config, instance, guarded),
                after=None if index == 0 else 0,
                ready_marker=READY_MARKER if index == 0 else None,
            )
        )
    return result

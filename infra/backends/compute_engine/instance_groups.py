"""The VMs of a ``multislice:backend: compute-engine`` stack: one zonal managed instance group
per slice, named ``StackConfig.node_ids[i]`` (docs/compute-engine.md), read with gcloud::

    gcloud compute instance-groups managed list-instances <group> --zone=<zone> \\
        --project=<project> --format=json

(``lib/surface/compute/instance_groups/managed/list_instances.py`` in the installed gcloud 528:
GA, a zonal group's ``instanceGroupManagers.ListManagedInstances``; it needs
``compute.instanceGroupManagers.list``, which Compute Viewer has.) ``--format=json`` prints the
API's ``ManagedInstance`` objects (``compute_v1_messages.ManagedInstance``): ``name`` ("always
exists even if the instance has not yet been created"), ``instanceStatus`` (the instance's
status, e.g. ``RUNNING``; "empty when the instance does not exist") and ``currentAction``
(``NONE`` when "the instance is running, and the managed instance group does not have any
scheduled actions for this instance"; ``CREATING``, ``RECREATING``, ``DELETING``, …).

A group that does not exist fails with ``Could not fetch resource:`` and `` - The resource
'…/instanceGroupManagers/<group>' was not found`` on its next line (``RaiseToolException`` /
``ConstructList`` in gcloud's ``api_lib/compute/utils.py``).

Worker order: each VM takes as its worker index the index of its own name among its group's
instance names sorted (the compute-engine boot, docs/compute-engine.md's design in
``infra/startup``); :func:`workers_of` numbers them the same way, so ``--worker W`` here is
``TPU_WORKER_ID=W`` on the VM.

``$MULTISLICE_GCLOUD`` names the gcloud (as for ``exec`` on Cloud TPU, :mod:`infra.remote.gcloud`).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from infra import invocation
from infra.remote.gcloud import credentials_error, last_error
from infra.remote.selection import RemoteError

#: Seconds one ``list-instances`` may take.
LIST_TIMEOUT_S = 120.0
#: An instance that is up: its status (``InstanceStatusValueValuesEnum``) and the group's action.
RUNNING, NO_ACTION = "RUNNING", "NONE"


@dataclass(frozen=True)
class ManagedInstance:
    """One VM of a group: its name, status (``""`` when it does not exist yet) and the group's
    current action on it."""

    name: str
    status: str
    action: str

    @property
    def up(self) -> bool:
        """Running, with nothing scheduled on it by the group."""
        return self.status == RUNNING and self.action == NO_ACTION


def list_argv(gcloud: str, config, group: str) -> list[str]:
    """The argument list of the module docstring."""
    return [
        gcloud,
        "compute",
        "instance-groups",
        "managed",
        "list-instances",
        group,
        f"--zone={config.zone}",
        f"--project={config.project}",
        "--format=json",
    ]


def list_group(gcloud: str, config, group: str) -> list[ManagedInstance] | None:
    """The instances of ``group`` sorted by name; None when the group does not exist.

    Raises:
      RemoteError: gcloud without usable credentials (exit 2), failed or answered in a form not
        understood (exit 1).
    """
    where = f"projects/{config.project}/zones/{config.zone}"
    try:
        proc = subprocess.run(
            list_argv(gcloud, config, group), capture_output=True, text=True, timeout=LIST_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise RemoteError(
            f"gcloud did not list instance group {group} within {LIST_TIMEOUT_S:.0f} s; nothing was run", 1
        ) from None
    if proc.returncode != 0:
        if credentials_error(proc.stderr):
            raise RemoteError(
                f"gcloud has no usable credentials ({last_error(proc.stderr)}): run `gcloud auth login` (or `gcloud "
                "config set account ACCOUNT` for an account already logged in); nothing was run"
            )
        if "was not found" in proc.stderr:
            return None
        raise RemoteError(f"gcloud could not list instance group {group} in {where}: {last_error(proc.stderr)}", 1)
    from training.run_objects import json_record  # jax-free; here, not above: the program never imports it

    try:
        listed = json_record((proc.stdout or "[]").encode())  # 64 MiB, nesting bounded: else a ValueError
        instances = [
            ManagedInstance(str(item["name"]), str(item.get("instanceStatus") or ""), str(item.get("currentAction")))
            for item in listed
        ]
    except (ValueError, KeyError, TypeError):
        raise RemoteError(
            f"gcloud listed instance group {group} in a form not understood: {proc.stdout[:200]!r}", 1
        ) from None
    return sorted(instances, key=lambda instance: instance.name)


def workers_of(config, slice_id: int, instances: list[ManagedInstance] | None) -> list[str]:
    """The instance names of slice ``slice_id`` in worker order, when its group has every VM of
    the slice up (see the module docstring).

    Raises:
      RemoteError: the group is missing, or has not all its VMs up (exit 2).
    """
    group, wanted = config.node_ids[slice_id], config.workers_per_slice
    if instances is None:
        raise RemoteError(
            f"stack {config.stack} is not deployed: instance group {group} (slice {slice_id}) not found in "
            f"projects/{config.project}/zones/{config.zone}; run `pulumi up --stack {config.stack}` first"
        )
    up = [instance for instance in instances if instance.up]
    if len(instances) != wanted or len(up) != wanted:
        listed = ", ".join(f"{i.name} {i.status or 'not created'}/{i.action}" for i in instances) or "none"
        raise RemoteError(
            f"stack {config.stack}'s instance group {group} (slice {slice_id}) has {len(up)} of {wanted} VMs running "
            f"({listed}): its slice is not up; see `{invocation.command('status', config.stack)}`"
        )
    return [instance.name for instance in instances]

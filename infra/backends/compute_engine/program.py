"""The compute-engine backend's part of the program: the slices' typed inputs from a stack
(:func:`compute_engine_inputs`) and their declaration (:func:`declare`)."""

from __future__ import annotations

from typing import Any

import pulumi

from infra import startup, vm_contract as contract
from infra.backends.compute_engine import machine, tpu_env
from infra.backends.compute_engine.inputs import ComputeEngineInputs
from infra.backends.compute_engine.slices import ComputeEngineSlices
from infra.config import StackConfig


def compute_engine_inputs(
    config: StackConfig,
    script: startup.RenderedScript,
    *,
    network: pulumi.Input[str],
    subnetwork: pulumi.Input[str],
    service_account: pulumi.Input[str],
    tags: list[str],
    replaces_queued_resource: pulumi.Input[bool] = False,
) -> ComputeEngineInputs:
    """The Compute Engine slices' inputs for a ``multislice:backend: compute-engine`` stack.

    One group per slice, named as the queued resource's nodes are (``config.node_ids``); the
    template's metadata holds the startup script and the run directory as on the queued
    resource (:func:`infra.vm_contract.node_metadata`, never the delete-on-complete key:
    not on this backend). The machine type and topology come from the catalog
    (:mod:`infra.accelerators`). ``replaces_queued_resource``: the stack's last deployment used
    the queued-resource backend (:func:`backend_gate`). Pure: equal configs give equal inputs.
    """
    accelerator = config.accelerator
    machine_type = accelerator.machine_type
    if machine_type is None:  # the config refuses such a stack (Generation.backends); a guard
        raise ValueError(f"Compute Engine offers no machine type for {config.accelerator_type}")
    return ComputeEngineInputs(
        stack=config.stack,
        project=config.project,
        zone=config.zone,
        region=config.region,
        group_names=tuple(config.node_ids),
        machine_type=machine_type,
        topology=accelerator.topology,
        accelerator_type=config.accelerator_type,
        generation=accelerator.generation.name,
        vms_per_slice=config.workers_per_slice,
        capacity=config.capacity,
        reservation_name=config.reservation_name,
        max_run_duration_seconds=config.compute_engine.max_run_duration,
        boot_disk_size_gb=machine.boot_disk_size_gb(
            accelerator.generation.name, config.compute_engine.boot_disk_size_gb
        ),
        tpu_environment=tpu_env.on_tpu(
            tpu_env.static_environment(accelerator.topology, accelerator.hosts, accelerator.chips_per_host)
        ),
        network=network,
        subnetwork=subnetwork,
        service_account=service_account,
        tags=tuple(tags),
        labels=dict(sorted(config.resource_labels.items())),
        metadata=contract.node_metadata(
            startup_script=script.text,
            run_dir=config.run_dir,
            queued_resource_name=config.queued_resource_name,
            delete_on_complete=False,
        ),
        replaces_queued_resource=replaces_queued_resource,
    )


def declare(
    config: StackConfig,
    script: startup.RenderedScript,
    *,
    network: Any,
    service_account: pulumi.Input[str],
    replaces_queued_resource: pulumi.Input[bool],
    opts: pulumi.ResourceOptions,
) -> dict[str, Any]:
    """The stack's :class:`~infra.backends.compute_engine.slices.ComputeEngineSlices` (logical name
    ``slices``) on the stack's network (``network``: the :class:`~infra.components.network.Network`
    component). Returns its stack output ``instanceGroupNames`` (the groups, in slice order)."""
    slices = ComputeEngineSlices(
        "slices",
        compute_engine_inputs(
            config,
            script,
            network=network.network,
            subnetwork=network.subnetwork,
            service_account=service_account,
            tags=[network.tag],
            replaces_queued_resource=replaces_queued_resource,
        ),
        opts=opts,
    )
    return {"instanceGroupNames": slices.group_names}

"""The queued-resource backend's part of the program: the queued resource's typed inputs from a
stack (:func:`queued_resource_inputs`) and its declaration (:func:`declare`)."""

from __future__ import annotations

from typing import Any

import pulumi

from infra import startup, vm_contract as contract
from infra.backends.queued_resource.provider import QueuedResource, QueuedResourceInputs
from infra.config import StackConfig
from training.warning_text import emit, no_action


def reservation_path(config: StackConfig) -> str | None:
    """The QR's ``reservation_name`` for ``capacity: reserved``.

    A short name becomes ``projects/<project>/locations/<zone>/reservations/<name>``; without
    a name it is ``.../reservations/-`` (any reservation of the project in the zone), as
    ``gcloud compute tpus queued-resources create --reserved`` sends it (gcloud's
    ``queued_resource_util.CreateReservationName``).
    """
    if config.capacity != "reserved":
        return None
    name = config.reservation_name or "-"
    if "/" in name:
        return name
    return f"projects/{config.project}/locations/{config.zone}/reservations/{name}"


def queued_resource_inputs(
    config: StackConfig,
    script: startup.RenderedScript,
    *,
    network: pulumi.Input[str],
    subnetwork: pulumi.Input[str],
    service_account: pulumi.Input[str],
    tags: pulumi.Input[list[str]],
) -> QueuedResourceInputs:
    """The QR's inputs for a stack (some values may be Outputs of the other components).

    ``metadata`` holds the startup script, the run directory and, with ``deleteOnComplete``,
    the QR's own name (:func:`infra.vm_contract.node_metadata`); ``trainer`` (the
    TrainConfig as a plain object) and the sha256 values describe the script so ``pulumi
    preview --diff`` shows which key changed while the script's own diff is hidden. Pure:
    equal configs give equal inputs. ``config`` is already valid (its capacity is one the
    ``tpu_v2`` API can express: :data:`infra.backends.queued_resource.provider.inputs.CAPACITY_TYPES`).
    """
    settings = config.queued_resource
    return QueuedResourceInputs(
        project=config.project,
        zone=config.zone,
        queued_resource_id=config.queued_resource_id,
        node_id=None if config.slices > 1 else config.queued_resource_id,
        node_id_prefix=config.queued_resource_id if config.slices > 1 else None,
        accelerator_type=config.accelerator_type,
        runtime_version=config.effective_runtime_version,
        slices=config.slices,
        capacity=config.capacity,
        reservation_name=reservation_path(config),
        network=network,
        subnetwork=subnetwork,
        service_account=service_account,
        tags=tags,
        labels=dict(sorted(config.resource_labels.items())),
        metadata=contract.node_metadata(
            startup_script=script.text,
            run_dir=config.run_dir,
            queued_resource_name=config.queued_resource_name,
            delete_on_complete=config.delete_on_complete,
        ),
        # None values are dropped: the engine stores no nulls, so previews compare like with like.
        # A command (multislice:workload) is described by its command, env and steps instead.
        trainer=config.workload.description()
        if config.workload is not None
        else config.training.model_dump(mode="json", exclude_none=True),
        run_dir=config.run_dir,
        bundle_sha256=script.bundle_sha256,
        startup_script_sha256=script.sha256,
        requirements_sha256=script.requirements_sha256,
        startup_script_bytes=script.size_bytes,
        release_files=dict(script.files) or None,
        wait_for=settings.wait_for,
        create_timeout_seconds=settings.create_timeout,
        delete_timeout_seconds=settings.delete_timeout,
        valid_until_seconds=settings.valid_until,
    )


def _require_ready(args: list[Any]) -> None:
    ready, message, deleted_on_complete = args
    if deleted_on_complete:  # gone because its run completed (deleteOnComplete): say why nothing is created
        emit(no_action(f"queued resource {message}", "its run is complete"), pulumi.log.warn)
        return
    if ready is False and not pulumi.runtime.is_dry_run():  # a preview only shows the plan
        # The QR exists and is recorded in the stack (create returned); fail the update so
        # nobody mistakes a still-queued request for a running job.
        raise pulumi.RunError(message or "the queued resource is not ready")


def declare(
    config: StackConfig,
    script: startup.RenderedScript,
    *,
    network: Any,
    service_account: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> dict[str, Any]:
    """The stack's ``QueuedResource`` (logical name ``queued-resource``) on the stack's network
    (``network``: the :class:`~infra.components.network.Network` component); an update fails
    while the QR is not ready (:func:`_require_ready`). Returns its stack outputs:
    ``queuedResourceName``, ``queuedResourceState``, ``nodeNames``."""
    inputs = queued_resource_inputs(
        config,
        script,
        network=network.network,
        subnetwork=network.subnetwork,
        service_account=service_account,
        tags=[network.tag],
    )
    queued_resource = QueuedResource("queued-resource", inputs, opts=opts)
    pulumi.Output.all(queued_resource.ready, queued_resource.statusMessage, queued_resource.deletedOnComplete).apply(
        _require_ready
    )
    return {
        "queuedResourceName": queued_resource.queuedResourceName,
        "queuedResourceState": queued_resource.state,
        "nodeNames": queued_resource.nodeNames,
    }

"""The Pulumi program: StackConfig → project APIs, network, bucket, service account, TPU slices.

``pulumi up -s <stack>`` reads ``stacks/Pulumi.<stack>.yaml`` through :mod:`infra.config`
(every validation error names its key, before any resource exists), renders the startup
script (:mod:`infra.startup`) and declares (each component takes its own args object, built
here from the StackConfig by :func:`component_args`; the queued resource's inputs by
:func:`queued_resource_inputs`, the Compute Engine slices' by :func:`compute_engine_inputs`)::

    ProjectServices   tpu, compute, storage, iam, ... APIs enabled (everything depends on it)
    Network           VPC + subnetwork + Cloud NAT + firewall (tag-scoped, IAP-only SSH)
    CheckpointBucket  regional, private, lifecycle rules; protected on prod
    ServiceAccount    the VMs' service account: bucket objects, logs, metrics; with deleteOnComplete
                      a custom role of tpu.nodes.delete (worker 0 deletes the QR when the run is done)
    ReleaseRecord     the release every VM boot runs, in the bucket
    QueuedResource    multislice:backend queued-resource (default): the Multislice QR
                      (dynamic provider, infra/queued_resource/)
    ComputeEngineSlices  multislice:backend compute-engine: workload policy, instance template,
                      one managed instance group per slice (infra/compute_engine/)

The first five are components of :mod:`infra.components`; the provider package never sees the
StackConfig either: it gets a :class:`~infra.queued_resource.QueuedResourceInputs` (and the
Compute Engine component a :class:`~infra.compute_engine.ComputeEngineInputs`).

Before any resource is registered, the program reads what the stack deployed last (a
``StackReference`` to the stack itself) and refuses a change of ``multislice:backend`` unless
the stack confirms it (:mod:`infra.backend_change`; :func:`backend_gate`): the first resource
(``ProjectServices``, on which everything depends) depends on that check.

Exports: backend (``multislice:backend``), bucketUrl, bucketOnDestroy (what ``pulumi destroy``
does with the bucket), runDir, checkpointPath, serviceAccountEmail, networkName,
subnetworkName, networkTag, loggingFilter, sshHint, startupScriptBytes, startupScriptSha256,
bundleSha256; on the queued-resource backend queuedResourceName, queuedResourceState and
nodeNames; on the compute-engine backend instanceGroupNames (the slices' managed instance
groups, in slice order).

Errors: a stack that cannot work stops ``pulumi preview``/``up`` with one message naming the
key (:func:`main` raises it as ``pulumi.RunError``). The Python language host prints a
``RunError`` as its message alone and any other exception as "Program failed with an unhandled
exception" plus a traceback (``pulumi-language-python-exec`` in
https://github.com/pulumi/pulumi/tree/master/sdk/python/cmd; ``pulumi.RunError``'s docstring:
"a clean exit rather than the usual verbose unhandled error logic").

Tests evaluate :func:`define` under ``pulumi.runtime.set_mocks``; ``pulumi up`` runs this file
as ``__main__``, through the repository's ``__main__.py`` (Pulumi.yaml has no ``main``: the
queued resource's provider starts in the program's directory and must find ``.venv`` there;
docs/deploying.md, "How the Pulumi CLI starts the provider"). tests/program/test_program.py also
runs it the way the language host does. There is no code path that only works under mocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from infra import config as stack_config, planner, startup
from infra.backend_change import BackendChangeRefused, check_backend_change, deployed_backend
from infra.components.network import Network, NetworkArgs
from infra.components.release import ReleaseRecord, ReleaseRecordArgs
from infra.components.service_account import ServiceAccount, ServiceAccountArgs, data_bucket
from infra.components.services import ProjectServices, ServicesArgs
from infra.components.storage import BucketArgs, CheckpointBucket
from infra.compute_engine import ComputeEngineInputs, ComputeEngineSlices
from infra.config import StackConfig
from infra.config.dataset import check_dataset
from infra.logs.filter import logging_filter  # the filter `multislice logs` builds on
from infra.queued_resource import QueuedResource, QueuedResourceInputs
from infra.startup import contract
from infra.startup.workload import WorkloadError


def load_config() -> StackConfig:
    """The running stack's StackConfig, from the engine's config map."""
    return stack_config.from_pulumi_config(pulumi.get_stack(), stack_config.pulumi_config_map())


def ssh_hint(config: StackConfig) -> str:
    """How to reach worker 0 of slice 0: SSH is open only through IAP TCP forwarding, and only
    with ``multislice:network.iapSsh`` (gcloud's GA ``tpu-vm ssh`` has no
    ``--tunnel-through-iap``; its alpha track has:
    https://cloud.google.com/sdk/gcloud/reference/alpha/compute/tpus/tpu-vm/ssh; docs/exec-and-reset.md).

    On the compute-engine backend worker 0 is the first VM, by name, of slice 0's group (the
    order ``boot.sh`` gives the workers): ``gcloud compute instance-groups managed
    list-instances`` names it (its ``name`` field, the command's default table's first column)
    and GA ``gcloud compute ssh`` has ``--tunnel-through-iap`` (``iap_tunnel.AddSshTunnelArgs``
    in the installed SDK's ``lib/surface/compute/ssh.py``)."""
    journal = "--command='sudo journalctl -u google-startup-scripts.service -f'"
    if config.backend == "compute-engine":
        where = f"--zone={config.zone} --project={config.project}"
        first = (
            f"$(gcloud compute instance-groups managed list-instances {config.node_ids[0]} {where} "
            "--format='value(name)' --sort-by=name --limit=1)"
        )
        command = f"gcloud compute ssh {first} {where} --tunnel-through-iap {journal}"
    else:
        command = (
            f"gcloud alpha compute tpus tpu-vm ssh {config.node_ids[0]} --worker=0 --zone={config.zone} "
            f"--project={config.project} --tunnel-through-iap {journal}"
        )
    if config.network.iap_ssh:
        return command
    return f"SSH is closed (set multislice:network.iapSsh: true and run pulumi up), then: {command}"


@dataclass(frozen=True)
class ComponentArgs:
    """The args of each component, derived from one StackConfig."""

    services: ServicesArgs
    network: NetworkArgs
    bucket: BucketArgs
    service_account: ServiceAccountArgs
    release_record: ReleaseRecordArgs


def component_args(config: StackConfig, script: startup.RenderedScript) -> ComponentArgs:
    """Each component's own args: only the keys it reads (names and labels via infra.naming);
    the release record's from ``script``, the stack's rendered startup script."""
    return ComponentArgs(
        services=ServicesArgs(project=config.project),
        network=NetworkArgs(stack=config.stack, project=config.project, region=config.region, settings=config.network),
        bucket=BucketArgs(
            stack=config.stack,
            project=config.project,
            location=config.bucket_location,
            run_name=config.effective_run_name,
            labels=config.resource_labels,
            protect=config.bucket_protected,
            soft_delete_days=config.bucket_soft_delete_days,
            settings=config.bucket,
        ),
        service_account=ServiceAccountArgs(
            stack=config.stack,
            project=config.project,
            data_bucket=data_bucket(config.training.data.source, config.bucket_name),
            delete_on_complete=config.delete_on_complete,  # always off on compute-engine (the config's)
            compute_engine=config.backend == "compute-engine",
        ),
        release_record=ReleaseRecordArgs(
            stack=config.stack,
            run_dir=config.run_dir,
            release_id=script.release_id,
            release=script.release,
            workload_source=script.workload_source,
            workload_source_object=script.workload_source_object,
        ),
    )


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
    the QR's own name (:func:`infra.startup.contract.node_metadata`); ``trainer`` (the
    TrainConfig as a plain object) and the sha256 values describe the script so ``pulumi
    preview --diff`` shows which key changed while the script's own diff is hidden. Pure:
    equal configs give equal inputs. ``config`` is already valid (its capacity is one the
    ``tpu_v2`` API can express: :data:`infra.queued_resource.inputs.CAPACITY_TYPES`).
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
    resource (:func:`infra.startup.contract.node_metadata`, never the delete-on-complete key:
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


@dataclass(frozen=True)
class BackendCheck:
    """What :func:`backend_gate` found: the warning of a confirmed change (None: unchanged or a
    new stack) and the backend the stack's last deployment used (None: never deployed)."""

    warning: str | None
    deployed: str | None


def check_backend(outputs: Any, config: StackConfig) -> BackendCheck:
    """:func:`infra.backend_change.check_backend_change` of the stack's last ``outputs``; a
    confirmed change is warned once (``pulumi preview`` prints it).

    Raises:
      pulumi.RunError: the backend changes without ``multislice:allowBackendChange`` (the
        message names ``multislice:backend``).
    """
    outputs = dict(outputs or {})
    try:
        warning = check_backend_change(
            outputs,
            wanted=config.backend,
            stack=config.stack,
            confirmed=config.allow_backend_change,
        )
    except BackendChangeRefused as err:
        raise pulumi.RunError(str(err)) from None
    if warning is not None:
        pulumi.log.warn(warning)
    return BackendCheck(warning, deployed_backend(outputs))


def backend_gate(config: StackConfig) -> pulumi.Output[BackendCheck]:
    """:func:`check_backend` of what the stack deployed last, read through a ``StackReference``
    to the stack itself (``<organization>/<project>/<stack>``; a program may read its own
    stack's last outputs: https://github.com/pulumi/pulumi/issues/3722)."""
    name = f"{pulumi.get_organization()}/{pulumi.get_project()}/{pulumi.get_stack()}"
    reference = pulumi.StackReference(name)
    return reference.outputs.apply(lambda outputs: check_backend(outputs, config))


@dataclass
class Environment:
    """What :func:`define` declared (for tests and for readers): ``queued_resource`` on the
    queued-resource backend, ``slices`` on the compute-engine one (the other is None)."""

    services: ProjectServices
    network: Network
    bucket: CheckpointBucket
    service_account: ServiceAccount
    queued_resource: QueuedResource | None
    script: startup.RenderedScript
    exports: dict[str, Any]
    slices: ComputeEngineSlices | None = None


def _require_ready(args: list[Any]) -> None:
    ready, message, deleted_on_complete = args
    if deleted_on_complete:  # gone because its run completed (deleteOnComplete): say why nothing is created
        pulumi.log.warn(f"queued resource {message}")
        return
    if ready is False and not pulumi.runtime.is_dry_run():  # a preview only shows the plan
        # The QR exists and is recorded in the stack (create returned); fail the update so
        # nobody mistakes a still-queued request for a running job.
        raise pulumi.RunError(message or "the queued resource is not ready")


def define(config: StackConfig, script: startup.RenderedScript | None = None) -> Environment:
    """Declare the whole environment of ``config`` and export its outputs.

    ``config`` is already valid: :func:`load_config` raises ``infra.config.StackConfigError``
    (naming the key) before any resource is registered; so does the check of a prepared
    dataset's manifest against the model (:func:`infra.config.dataset.check_dataset`), which
    warns instead when the manifest cannot be read.

    Raises:
      infra.config.StackConfigError: the model's vocabulary is smaller than the dataset's (or
        the tensor axis does not divide it), or the dataset's manifest is not valid.
      infra.startup.StartupScriptTooLarge: the script exceeds one metadata value.
    """
    # The prepared dataset's manifest against the model (raises StackConfigError naming the key);
    # the plan prices the vocabulary the VMs will train, while the stack is declared as written.
    checked = check_dataset(config)
    if checked.warning is not None:
        pulumi.log.warn(checked.warning)
    for advisory in planner.advisories(checked.config) if config.workload is None else []:  # the trainer's plan
        pulumi.log.warn(advisory)
    for warning in config.catalog_warnings:  # what multislice:allowUnlisted let through
        pulumi.log.warn(warning)
    for warning in config.deprecation_warnings:  # a former key still read, named with its new one
        pulumi.log.warn(warning)
    script = script if script is not None else startup.render(config)

    args = component_args(config, script)
    # Nothing is registered before the backend check passes: everything depends on the APIs.
    check = backend_gate(config)
    services = ProjectServices("apis", args.services, opts=pulumi.ResourceOptions(depends_on=check.apply(lambda _: [])))
    after_apis = pulumi.ResourceOptions(depends_on=[services])
    network = Network("network", args.network, opts=after_apis)
    bucket = CheckpointBucket("checkpoints", args.bucket, opts=after_apis)
    # Logical name "identity" kept from before the rename: it is part of existing stacks' URNs.
    service_account = ServiceAccount("identity", args.service_account, bucket=bucket.name, opts=after_apis)
    release = ReleaseRecord("release", args.release_record, bucket=bucket.name, opts=after_apis)  # what every boot runs

    # The VMs boot into the script at once: NAT, firewall, bucket grants must exist first.
    after_all = pulumi.ResourceOptions(depends_on=[services, network, bucket, service_account, release])
    queued_resource: QueuedResource | None = None
    slices: ComputeEngineSlices | None = None
    tpu_exports: dict[str, Any]
    if config.backend == "compute-engine":
        slices = ComputeEngineSlices(
            "slices",
            compute_engine_inputs(
                config,
                script,
                network=network.network,
                subnetwork=network.subnetwork,
                service_account=service_account.email,
                tags=[network.tag],
                replaces_queued_resource=check.apply(lambda found: found.deployed == "queued-resource"),
            ),
            opts=after_all,
        )
        tpu_exports = {"instanceGroupNames": slices.group_names}
    else:
        inputs = queued_resource_inputs(
            config,
            script,
            network=network.network,
            subnetwork=network.subnetwork,
            service_account=service_account.email,
            tags=[network.tag],
        )
        queued_resource = QueuedResource("queued-resource", inputs, opts=after_all)
        pulumi.Output.all(
            queued_resource.ready, queued_resource.statusMessage, queued_resource.deletedOnComplete
        ).apply(_require_ready)
        tpu_exports = {
            "queuedResourceName": queued_resource.queuedResourceName,
            "queuedResourceState": queued_resource.state,
            "nodeNames": queued_resource.nodeNames,
        }

    exports: dict[str, Any] = {
        "backend": config.backend,
        "bucketUrl": bucket.url,
        "bucketOnDestroy": bucket.on_destroy,
        "runDir": bucket.run_dir,
        "checkpointPath": bucket.run_dir.apply(lambda d: f"{d}/checkpoints"),
        **tpu_exports,
        "serviceAccountEmail": service_account.email,
        "networkName": network.network_name,
        "subnetworkName": network.subnetwork_name,
        "networkTag": network.tag,
        "loggingFilter": logging_filter(config),
        "sshHint": ssh_hint(config),
        "startupScriptBytes": script.size_bytes,
        "startupScriptSha256": script.sha256,
        "bundleSha256": script.bundle_sha256,
    }
    for key, value in exports.items():
        pulumi.export(key, value)
    return Environment(services, network, bucket, service_account, queued_resource, script, exports, slices)


#: Errors that mean "this stack cannot work as configured": shown as their message alone.
USER_ERRORS: tuple[type[Exception], ...] = (
    stack_config.StackConfigError,
    startup.StartupScriptTooLarge,
    WorkloadError,
)


def main() -> Environment:
    """What ``pulumi preview``/``up`` runs: :func:`define` of the running stack.

    Raises:
      pulumi.RunError: the stack's config is invalid or its startup script too large; the
        message is the error's own (every line names its key), without a traceback.
    """
    try:
        return define(load_config())
    except USER_ERRORS as err:
        raise pulumi.RunError(str(err)) from None


if __name__ == "__main__":
    main()

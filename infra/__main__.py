"""The Pulumi program: StackConfig → project APIs, network, bucket, service account, TPU slices.

``pulumi up -s <stack>`` reads ``stacks/Pulumi.<stack>.yaml`` through :mod:`infra.config`
(every validation error names its key, before any resource exists), renders the startup
script (:mod:`infra.startup`) and declares (each component takes its own args object, built
here from the StackConfig by :func:`component_args`; the slices are the stack's backend's, which
builds their typed inputs itself: :meth:`infra.backends.interface.Backend.declare`)::

    ProjectServices   compute, storage, iam, ... and the backend's APIs enabled (everything depends on it)
    Network           VPC + subnetwork + Cloud NAT + firewall (tag-scoped, IAP-only SSH)
    CheckpointBucket  regional, private, lifecycle rules; protected on prod
    ServiceAccount    the VMs' service account: bucket objects, logs, metrics; with deleteOnComplete
                      a custom role of tpu.nodes.delete (worker 0 deletes the QR when the run is done)
    ReleaseRecord     the release every VM boot runs, in the bucket
    the slices        the backend's (infra/backends/, keyed by multislice:backend): on queued-resource
                      (default) the Multislice QR (a dynamic provider); on compute-engine a workload
                      policy, an instance template and one managed instance group per slice

The first five are components of :mod:`infra.components`; the backends' resources never see the
StackConfig either: each takes its typed inputs (``QueuedResourceInputs``, ``ComputeEngineInputs``).

Before any resource is registered, the program reads what the stack deployed last (a
``StackReference`` to the stack itself) and refuses a change of ``multislice:backend`` unless
the stack confirms it (:mod:`infra.backends.change`; :func:`backend_gate`): the first resource
(``ProjectServices``, on which everything depends) depends on that check.

Exports: backend (``multislice:backend``), bucketUrl, bucketOnDestroy (what ``pulumi destroy``
does with the bucket), runDir, checkpointPath, serviceAccountEmail, networkName,
subnetworkName, networkTag, loggingFilter, sshHint, startupScriptBytes, startupScriptSha256,
bundleSha256; on the queued-resource backend queuedResourceName, queuedResourceState and
nodeNames; on the compute-engine backend instanceGroupNames (the slices' managed instance
groups, in slice order); on the gke backend clusterOnDestroy (what ``pulumi destroy`` does with
the cluster), clusterName, clusterLocation, nodePoolNames, jobSetName and namespace.

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
from infra.backends.change import BackendChangeRefused, check_backend_change, deployed_backend
from infra.backends.operations import backend_of
from infra.components.apis import apis_for
from infra.components.network import Network, NetworkArgs
from infra.components.release import ReleaseRecord, ReleaseRecordArgs
from infra.components.service_account import ServiceAccount, ServiceAccountArgs, data_bucket
from infra.components.services import ProjectServices, ServicesArgs
from infra.components.storage import BucketArgs, CheckpointBucket
from infra.config import StackConfig
from infra.config.dataset import check_dataset
from infra.logs.filter import logging_filter  # the filter `multislice logs` builds on
from infra.startup.workload import WorkloadError
from training.warning_text import WarningText, emit


def load_config() -> StackConfig:
    """The running stack's StackConfig, from the engine's config map."""
    return stack_config.from_pulumi_config(pulumi.get_stack(), stack_config.pulumi_config_map())


def ssh_hint(config: StackConfig) -> str:
    """How to reach worker 0 of slice 0 (the backend's command:
    :meth:`infra.backends.interface.Backend.ssh_command`): SSH is open only through IAP TCP
    forwarding, and only with ``multislice:network.iapSsh`` (docs/exec-and-reset.md)."""
    command = backend_of(config).ssh_command(config)
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
        services=ServicesArgs(project=config.project, apis=apis_for(config.backend_spec.apis)),
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
            delete_on_complete=config.delete_on_complete,  # the backend's answer (its spec)
            reads_instance_groups=config.backend_spec.vm_reads_instance_groups,
            recreates_slices=config.backend_spec.slice_watch_recreates(config),
            extra_project_roles=config.backend_spec.node_project_roles,
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


@dataclass(frozen=True)
class BackendCheck:
    """What :func:`backend_gate` found: the warning of a confirmed change (None: unchanged or a
    new stack) and the backend the stack's last deployment used (None: never deployed)."""

    warning: WarningText | None
    deployed: str | None


def check_backend(outputs: Any, config: StackConfig) -> BackendCheck:
    """:func:`infra.backends.change.check_backend_change` of the stack's last ``outputs``; a
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
        emit(warning, pulumi.log.warn)
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
    """What :func:`define` declared (for tests and for readers); the slices are the backend's
    (their outputs among ``exports``)."""

    services: ProjectServices
    network: Network
    bucket: CheckpointBucket
    service_account: ServiceAccount
    script: startup.RenderedScript
    exports: dict[str, Any]


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
        emit(checked.warning, pulumi.log.warn)
    for advisory in planner.advisories(checked.config) if config.workload is None else []:  # the trainer's plan
        emit(advisory, pulumi.log.warn)
    for warning in config.catalog_warnings:  # what multislice:allowUnlisted let through
        emit(warning, pulumi.log.warn)
    for warning in config.deprecation_warnings:  # a former key still read, named with its new one
        emit(warning, pulumi.log.warn)
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
    tpu_exports = backend_of(config).declare(
        config,
        script,
        network=network,
        service_account=service_account.email,
        deployed=check.apply(lambda found: found.deployed),
        opts=after_all,
    )

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
    return Environment(services, network, bucket, service_account, script, exports)


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

"""The Pulumi program: StackConfig → project APIs, network, bucket, identity, queued resource.

``pulumi up -s <stack>`` reads ``stacks/Pulumi.<stack>.yaml`` through :mod:`infra.config`
(every validation error names its key, before any resource exists), renders the startup
script (:mod:`infra.startup`) and declares::

    ProjectServices   tpu, compute, storage, iam, ... APIs enabled (everything depends on it)
    Network           VPC + subnetwork + Cloud NAT + firewall (tag-scoped, IAP-only SSH)
    CheckpointBucket  regional, private, lifecycle rules; protected on prod
    Identity          the VMs' service account: bucket objects, logs, metrics; nothing else
    QueuedResource    the Multislice QR (dynamic provider, infra/queued_resource.py)

Exports: bucketUrl, runDir, checkpointPath, queuedResourceName, queuedResourceState,
nodeNames, serviceAccountEmail, networkName, subnetworkName, networkTag, loggingFilter,
sshHint, startupScriptBytes, startupScriptSha256, bundleSha256.

Tests evaluate :func:`define` under ``pulumi.runtime.set_mocks``; ``pulumi up`` runs this file
as ``__main__``. There is no code path that only works under mocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi

from infra import config as stack_config
from infra import planner
from infra import startup
from infra.config import StackConfig
from infra.identity import Identity
from infra.network import Network
from infra.queued_resource import QueuedResource, check_provisionable, queued_resource_props
from infra.services import ProjectServices
from infra.storage import CheckpointBucket


def load_config() -> StackConfig:
    """The running stack's StackConfig, from the engine's config map."""
    return stack_config.from_pulumi_config(pulumi.get_stack(), stack_config.pulumi_config_map())


def logging_filter(config: StackConfig) -> str:
    """Cloud Logging filter for the VM logs of this stack's nodes (every worker of every slice;
    the trainer's lines start with ``[slice S worker W]``). TPU VM logs have the monitored
    resource type ``tpu_worker`` with labels project_id, zone, node_id, worker_id."""
    nodes = " OR ".join(f'"{node}"' for node in config.node_ids)
    return (
        'resource.type="tpu_worker"'
        f' AND resource.labels.project_id="{config.project}"'
        f' AND resource.labels.zone="{config.zone}"'
        f" AND resource.labels.node_id=({nodes})"
    )


def ssh_hint(config: StackConfig) -> str:
    """How to reach worker 0 of slice 0 (SSH is open only through IAP TCP forwarding)."""
    return (
        f"gcloud compute tpus tpu-vm ssh {config.node_ids[0]} --worker=0 --zone={config.zone} "
        f"--project={config.project} --tunnel-through-iap "
        "--command='sudo journalctl -u google-startup-scripts.service -f'"
    )


@dataclass
class Environment:
    """What :func:`define` declared (for tests and for readers)."""

    services: ProjectServices
    network: Network
    bucket: CheckpointBucket
    identity: Identity
    queued_resource: QueuedResource
    script: startup.RenderedScript
    exports: dict[str, Any]


def _require_ready(args: list[Any]) -> None:
    ready, message = args
    if ready is False and not pulumi.runtime.is_dry_run():  # a preview only shows the plan
        # The QR exists and is recorded in the stack (create returned); fail the update so
        # nobody mistakes a still-queued request for a running job.
        raise pulumi.RunError(message or "the queued resource is not ready")


def define(config: StackConfig, script: startup.RenderedScript | None = None) -> Environment:
    """Declare the whole environment of ``config`` and export its outputs.

    Raises:
      infra.config.StackConfigError: the stack cannot be provisioned (e.g. best-effort
        capacity), naming the key, before any resource is registered.
      infra.startup.StartupScriptTooLarge: the script exceeds one metadata value.
    """
    check_provisionable(config)
    for advisory in planner.advisories(config):  # predicted DCN-bound or over HBM (multislice plan)
        pulumi.log.warn(advisory)
    script = script if script is not None else startup.render(config)

    services = ProjectServices("apis", config)
    after_apis = pulumi.ResourceOptions(depends_on=[services])
    network = Network("network", config, opts=after_apis)
    bucket = CheckpointBucket("checkpoints", config, opts=after_apis)
    identity = Identity("identity", config, bucket=bucket.name, opts=after_apis)

    props = queued_resource_props(
        config,
        script,
        network=network.network,
        subnetwork=network.subnetwork,
        service_account=identity.email,
        tags=[network.tag],
    )
    queued_resource = QueuedResource(
        "queued-resource",
        props,
        # The VMs boot into the script at once: NAT, firewall, bucket grants must exist first.
        opts=pulumi.ResourceOptions(depends_on=[services, network, bucket, identity]),
    )
    pulumi.Output.all(queued_resource.ready, queued_resource.statusMessage).apply(_require_ready)

    exports: dict[str, Any] = {
        "bucketUrl": bucket.url,
        "runDir": bucket.run_dir,
        "checkpointPath": bucket.run_dir.apply(lambda d: f"{d}/checkpoints"),
        "queuedResourceName": queued_resource.queuedResourceName,
        "queuedResourceState": queued_resource.state,
        "nodeNames": queued_resource.nodeNames,
        "serviceAccountEmail": identity.email,
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
    return Environment(services, network, bucket, identity, queued_resource, script, exports)


if __name__ == "__main__":
    define(load_config())

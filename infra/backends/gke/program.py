"""The gke backend's part of the program: the names a stack's GKE objects get, the typed inputs of
its slices and workload (:func:`gke_inputs`, :func:`workload_inputs`), and their declaration
(:func:`declare`).
The names its objects get: :mod:`~infra.backends.gke.names`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pulumi

from infra import startup
from infra.backends.gke import kueue
from infra.backends.gke.jobset import jobset, startup_config_map_name
from infra.backends.gke.names import (
    cluster_location,
    cluster_name,
    jobset_name,
    kubernetes_service_account,
    pod_labels,
)
from infra.backends.gke.node_pools import slice_node_pool
from infra.backends.gke.slices import GkeInputs, GkeSlices
from infra.backends.gke.workload import GkeWorkload, WorkloadInputs
from infra.config import StackConfig

#: How many times JobSet recreates every Job after a failed Pod (``failurePolicy.maxRestarts``):
#: each preemption or node failure of a spot run is one; the trainer resumes each time from the
#: newest checkpoint. Our choice (xpk's ``--max-restarts`` defaults to 0, which ends a run at its
#: first preemption).
MAX_RESTARTS = 100


def run_jobset(config: StackConfig, script: startup.RenderedScript) -> dict[str, Any]:
    """The run's JobSet for ``script``'s release, in the stack's LocalQueue with
    ``multislice:gke.queuedProvisioning`` (:func:`~infra.backends.gke.kueue.queued_jobset`).

    Raises:
      ValueError: the workload's ``env`` sets what GKE or the Pod sets (naming the key).
    """
    name = jobset_name(config)
    made = jobset(
        name=name,
        namespace=config.gke.namespace,
        shape=slice_node_pool(config.accelerator),
        slices=config.slices,
        image=config.gke.image,
        startup_config_map=startup_config_map_name(name, script.release_id),
        run_dir=config.run_dir,
        env=dict(config.workload.env) if config.workload is not None else {},
        service_account=kubernetes_service_account(config),
        max_restarts=MAX_RESTARTS,
        labels=pod_labels(config),
    )
    if not config.gke.queued_provisioning:
        return made
    return kueue.queued_jobset(made, queue=name, max_run_duration_s=kueue.run_duration_s(config.gke.max_run_duration))


def run_queues(config: StackConfig) -> tuple[dict[str, Any], ...]:
    """The stack's Kueue objects (:func:`~infra.backends.gke.kueue.queue_objects`, named after the JobSet) with
    ``multislice:gke.queuedProvisioning``; none without."""
    if not config.gke.queued_provisioning:
        return ()
    shape = slice_node_pool(config.accelerator)
    return tuple(
        kueue.queue_objects(name=jobset_name(config), namespace=config.gke.namespace, shape=shape, slices=config.slices)
    )


def gke_inputs(
    config: StackConfig,
    *,
    network: Any,
    subnetwork: Any,
    service_account: pulumi.Input[str],
) -> GkeInputs:
    """The cluster's and node pools' inputs (``service_account``: the stack's Google service
    account's email; its resource id is ``projects/<project>/serviceAccounts/<email>``, the form
    ``serviceaccount.IAMMember`` takes)."""
    project = config.project
    return GkeInputs(
        stack=config.stack,
        project=project,
        zone=config.zone,
        cluster_name=cluster_name(config),
        pool_names=tuple(config.node_ids),
        shape=slice_node_pool(config.accelerator),
        capacity=config.capacity,
        settings=config.gke,
        network=network,
        subnetwork=subnetwork,
        service_account_email=service_account,
        service_account_id=pulumi.Output.from_input(service_account).apply(
            lambda email: f"projects/{project}/serviceAccounts/{email}"
        ),
        kubernetes_service_account=kubernetes_service_account(config),
        reservation_name=config.reservation_name,
        max_run_duration_seconds=config.gke.max_run_duration,
        labels=dict(sorted(config.resource_labels.items())),
        generation=config.accelerator.generation.name,
    )


def workload_inputs(
    config: StackConfig,
    script: startup.RenderedScript,
    *,
    cluster: pulumi.Input[str],
    dns_endpoint: pulumi.Input[str],
    service_account: pulumi.Input[str],
) -> WorkloadInputs:
    """The workload's inputs: the JobSet of :func:`run_jobset`, the release's startup script and the Kueue
    objects of :func:`run_queues`."""
    return WorkloadInputs(
        project=config.project,
        cluster_name=cluster,
        location=cluster_location(config),
        dns_endpoint=dns_endpoint,
        settings=config.gke,
        kubernetes_service_account=kubernetes_service_account(config),
        google_service_account_email=service_account,
        jobset=run_jobset(config, script),
        startup_script=script.text,
        release_id=script.release_id,
        queues=run_queues(config),
    )


def cluster_on_destroy(config: StackConfig) -> str:
    """What ``pulumi destroy`` does to the stack's cluster, as the ``bucketOnDestroy`` output says it of
    the bucket (pulumi-gcp's refusal of a protected cluster: "Cannot destroy cluster because
    deletion_protection is set to true. Set it to false to proceed with cluster deletion")."""
    settings = config.gke
    if settings.cluster is not None:
        return f"kept: cluster {settings.cluster} is not the stack's (its node pools {', '.join(config.node_ids)} go)"
    name = cluster_name(config)
    if settings.deletion_protection:
        return (
            f"refused: cluster {name} has deletion protection; set multislice:gke.deletionProtection: false, "
            "run pulumi up, then pulumi destroy"
        )
    return f"deleted: cluster {name}, its system pool and its node pools"


def declare(
    config: StackConfig,
    script: startup.RenderedScript,
    *,
    network: Any,
    service_account: pulumi.Input[str],
    opts: pulumi.ResourceOptions,
) -> dict[str, Any]:
    """The stack's :class:`~infra.backends.gke.slices.GkeSlices` (logical name ``slices``) on the
    stack's network, then its :class:`~infra.backends.gke.workload.GkeWorkload` (``workload``) in
    that cluster. Returns the stack outputs ``clusterOnDestroy`` (:func:`cluster_on_destroy`),
    ``clusterName``, ``clusterLocation``, ``nodePoolNames``, ``jobSetName`` and ``namespace``.

    Raises:
      ValueError: what either component refuses, before any resource is registered.
    """
    inputs = gke_inputs(config, network=network.network, subnetwork=network.subnetwork, service_account=service_account)
    # The JobSet once; its cluster and endpoint filled in when the slices answer them.
    work = workload_inputs(config, script, cluster="", dns_endpoint="", service_account=service_account)
    from infra.backends.gke import slices as slices_lib, workload as workload_lib

    slices_lib.check(inputs)
    workload_lib.check(work)  # both refusals before the first resource
    slices = GkeSlices("slices", inputs, opts=opts)
    workload = GkeWorkload(
        "workload",
        dataclasses.replace(work, cluster_name=slices.cluster_name, dns_endpoint=slices.dns_endpoint),
        opts=pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[slices])),
    )
    return {
        "clusterOnDestroy": cluster_on_destroy(config),
        "clusterName": slices.cluster_name,
        "clusterLocation": slices.cluster_location,
        "nodePoolNames": slices.pool_names,
        "jobSetName": workload.jobset_name,
        "namespace": workload.namespace,
    }

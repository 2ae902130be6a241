"""The gke backend's spec: ``multislice:gke``, the keys the backend refuses, and what its Pods boot.

* the Pod: a container runs the stack's startup script, the same release the VMs boot, verified the
  same way; ``boot_identity.sh`` takes the Pod's place from the environment GKE and the JobSet give
  it (``TPU_WORKER_ID``, ``MEGASCALE_SLICE_ID``, ``MULTISLICE_RUN_DIR``: docs/gke.md section 4), and
  the boot runs the trainer in the foreground (no systemd in a container): the container's status
  is the trainer's, and JobSet's failure policy restarts the run (docs/gke.md section 5);
* a new release replaces the JobSet (its ``spec.replicatedJobs`` is immutable), so no Pod watches
  the release record; lines go to the ``k8s_container`` resource (docs/gke.md section 8);
* capacity: the node pool's modes (:data:`~infra.backends.gke.node_pools.CAPACITIES`); a node pool
  runs GKE's node image, so a stack names no TPU software version.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

from infra.accelerators import Generation
from infra.backends.gke import kueue, versions
from infra.backends.gke.cluster import KUEUE_VERSION, MAX_RUN_DURATION_S, GkeSettings, check_cluster_location
from infra.backends.gke.node_pools import CAPACITIES, NodePoolError, slice_node_pool
from infra.backends.spec import BackendSpec
from infra.durations import format_duration
from training.validation import invalid

#: [Google] "Plan TPUs in GKE": "To use a TPU type in your GKE workload, your cluster must be in a
#: supported region for that type"; its table was not readable (docs/gke.md), so the zones are the
#: catalog's Cloud TPU and Compute Engine zones of the generation.
ZONES_SOURCE = (
    'https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus ("your cluster must be in a supported '
    'region for that type"); zones: the Cloud TPU and Compute Engine zones of the catalog'
)


#: What GKE gives a TPU Pod's environment (docs/gke.md section 4; infra/backends/gke/jobset.py):
#: a workload may not set these.
GKE_INJECTED_ENV = frozenset(
    {
        "TPU_WORKER_ID",
        "TPU_WORKER_HOSTNAMES",
        "TPU_SKIP_MDS_QUERY",
        "TPU_TOPOLOGY",
        "TPU_ACCELERATOR_TYPE",
        "TPU_HOST_BOUNDS",
        "TPU_CHIPS_PER_HOST_BOUNDS",
        "TPU_RUNTIME_METRICS_PORTS",
        "VBAR_CONTROL_SERVICE_URL",
    }
)


def injected_env_refusal(name: str) -> str | None:
    """Why a workload's ``env`` may not set ``name`` on GKE (None: it may)."""
    if name not in GKE_INJECTED_ENV:
        return None
    return (
        "GKE sets it in every TPU Pod (its webhook or the TPU device plugin, docs/gke.md section 4), and a Pod's "
        "own value would hide GKE's: remove it"
    )


class GkeSpec(BackendSpec):
    """``multislice:backend: gke`` (module docstring)."""

    name = "gke"
    summary = "a JobSet on TPU node pools"
    settings_key = "multislice:gke"
    settings_field = "gke"
    settings_model = GkeSettings
    capacities = CAPACITIES
    capacity_source = "GKE node pools"
    service = "Google Kubernetes Engine"
    catalog_qualifier = " on GKE"
    sole_offer_reason = "GKE offers no generation that Compute Engine lacks"
    has_runtime_version = False
    capacity_noun = "node pools"
    #: "Enable the Google Kubernetes Engine API" (GKE's Multislice and TPU pages' first step:
    #: https://cloud.google.com/kubernetes-engine/docs/how-to/tpus); its TPU node pools draw Compute
    #: Engine quota, not the Cloud TPU API's (same page).
    apis = ("container.googleapis.com",)
    #: The nodes run as the stack's service account: beside every stack's log and metric writing, what
    #: [Google] Cluster Toolkit's TPU blueprints grant their node pools' account (``examples/gke-tpu-v6e``'s
    #: ``node_pool_service_account`` at 1047080): the node agents read metrics and write resource metadata,
    #: and a Pod's image may come from the project's Artifact Registry. Its ``storage.objectViewer`` is
    #: granted on the checkpoint bucket alone, as on every backend.
    node_project_roles = (
        "roles/monitoring.viewer",
        "roles/stackdriver.resourceMetadata.writer",
        "roles/artifactregistry.reader",
    )
    worker_noun = "Pods"
    capacity_plural = True
    boot_identity = "boot_identity.sh"
    identity_source = "environment"
    log_resource = "k8s_container"
    supervisor = "container"
    #: A node pool's ``reservationAffinity``, sent as written (``node_pools.node_config``): Compute Engine's form.
    reservation_forms = ("compute",)

    def zones(self, gen: Generation) -> tuple[tuple[str, ...], str]:
        return tuple(dict.fromkeys(gen.zones + gen.compute_engine_zones)), ZONES_SOURCE

    def check_keys(self, config: Any) -> None:
        """Refuse ``multislice:runtimeVersion``, a slice GKE cannot give as a Multislice node pool
        (a generation without TPU node pools, or one VM per slice:
        :func:`~infra.backends.gke.node_pools.slice_node_pool`), and a workload ``env`` name GKE sets
        (:data:`GKE_INJECTED_ENV`), naming the key."""
        if config.runtime_version is not None:
            raise invalid(
                "multislice:runtimeVersion",
                "configures the TPU software version a queued resource boots; GKE node pools run GKE's node image: "
                "remove it (or set multislice:backend: queued-resource)",
            )
        try:
            slice_node_pool(config.accelerator)
        except NodePoolError as err:
            key, _, why = str(err).partition(": ")
            raise invalid(key, why) from None
        for name in sorted(config.workload.env if config.workload is not None else ()):
            why = injected_env_refusal(name)
            if why is not None:
                raise invalid(f"multislice:workload.env.{name}", why)
        _check_cluster_keys(config)

    def check_capacity(self, config: Any) -> None:
        """Refuse flex-start on a generation GKE's flex-start takes no TPU of, a pinned
        ``multislice:gke.version`` below what the generation and capacity need
        (:mod:`~infra.backends.gke.versions`), and ``multislice:gke.queuedProvisioning`` on another capacity
        than flex-start (:func:`~infra.backends.gke.kueue.capacity_refusal`), naming the key."""
        gen = config.accelerator.generation.name
        if config.capacity == "flex-start" and gen in versions.NO_FLEX_START:
            raise invalid(
                "multislice:capacity",
                f'flex-start on GKE takes no TPU {gen} ("TPU v3 and v4 are not supported": '
                f"{versions.CAPACITY_FLOORS['flex-start'][1]}): use spot, on-demand or reserved, or TPU v5e, v5p, v6e "
                "or TPU7x",
            )
        try:
            versions.check_version(config.gke.version, gen, config.capacity)
        except ValueError as err:
            key, _, why = str(err).partition(": ")
            raise invalid(key, why) from None
        if (why := kueue.capacity_refusal(config.gke.queued_provisioning, config.capacity)) is not None:
            raise invalid("multislice:gke.queuedProvisioning", why)

    def capacity_plan(self, config: Any) -> str | None:
        """One line for ``multislice plan`` and ``status``: how each slice's pool gets and keeps its
        nodes, the cluster around them, and until when they are billed."""
        settings, vms = config.gke, config.accelerator.hosts
        if config.capacity == "flex-start":
            how = (
                f"each pool autoscales from 0 to its {vms} VMs when the JobSet's Pods ask, for at most "
                f"{format_duration(settings.max_run_duration or MAX_RUN_DURATION_S)} (GKE deletes them then); "
                "auto-repair off"
            )
            if settings.queued_provisioning:
                how = how.replace(
                    "when the JobSet's Pods ask",
                    f"when Kueue {KUEUE_VERSION}'s one ProvisioningRequest for every slice is granted (queued "
                    "provisioning: all slices or none)",
                )
            elif config.slices > 1:
                how += (
                    "; the pools scale up apart, so slices may wait billed for each other: a slice that gets its "
                    "nodes first is billed, and its maximum run duration runs, until the last one has its nodes "
                    "(multislice:gke.queuedProvisioning: true asks for every slice at once)"
                )
        else:
            source = {
                "spot": " (Spot: GKE may preempt them; JobSet restarts the run)",
                "reserved": " from any reservation",
            }
            if config.reservation_name:
                source["reserved"] = f" from reservation {config.reservation_name}"
            how = f"each pool holds its {vms} VMs{source.get(config.capacity, '')}; GKE repairs a failed node"
        if settings.cluster is not None:
            cluster = f"in the existing cluster {settings.cluster}"
        else:
            system = settings.system_pool
            ranges = (
                f"Pods and Services in the subnetwork's ranges {settings.pod_range} and {settings.service_range}"
                if settings.pod_range is not None
                else "Pods and Services in ranges GKE adds to the subnetwork"
            )
            kind = (
                f"regional cluster (control plane in {config.zone.rsplit('-', 1)[0]}; "
                if settings.regional
                else ("zonal cluster (")
            )
            cluster = (
                f"in a new {kind}REGULAR channel, no minor or node upgrades until end of support; a system pool of "
                f"{system.min_nodes}-{system.max_nodes} {system.machine_type}; {ranges}; deletion protection "
                f"{'on: pulumi destroy fails until it is off' if settings.deletion_protection else 'off'})"
            )
        billed = "the reservation is paid for either way" if config.capacity == "reserved" else "billed while they run"
        return f"capacity: {config.capacity} node pools {cluster}: {how}; {billed}, until pulumi destroy"

    def refuse_settings(self, changed: list[str], backend: str) -> Exception:
        return invalid(self.settings_key, f"configures the gke backend; this stack's multislice:backend is {backend}")

    def describe_deployment(self, outputs: Mapping[str, Any]) -> str:
        pools = outputs.get("nodePoolNames") or []
        return f"the node pools {', '.join(map(str, pools)) or '(unnamed)'}, their TPU VMs and the run's JobSet"


def _check_ranges(settings: Any, network: Any, project: str) -> None:
    """A new cluster's Pod and Service ranges: named ranges need a reused subnetwork (the one the stack
    makes has no secondary range), and a Shared VPC subnetwork of another project needs them: GKE would
    otherwise add ranges to a subnetwork of the host project, whose subnets Shared VPC leaves to the host
    project's network admins (https://cloud.google.com/vpc/docs/shared-vpc: the host project holds the
    network and its subnets). Cluster Toolkit's ``gke-cluster`` always names them (``pods_ip_range_name``,
    ``services_ip_range_name``)."""
    if settings.pod_range is not None and not network.reuses_network:
        raise invalid(
            "multislice:gke.podRange",
            "names a secondary range of a reused subnetwork (multislice:network.existingSubnetwork), and the "
            "subnetwork the stack makes has none: remove podRange and serviceRange, or reuse a subnetwork",
        )
    host = network.host_project(project)
    if settings.pod_range is None and host != project:
        raise invalid(
            "multislice:gke.podRange",
            f"is required on the Shared VPC subnetwork of project {host}: a new cluster would add its Pod and "
            "Service ranges to a subnetwork of another project, which Shared VPC leaves to that project's "
            "network admins; create two secondary ranges there and name them (podRange, serviceRange)",
        )


#: ``multislice:gke`` keys that configure the cluster a stack makes, by field name.
NEW_CLUSTER_KEYS = {
    "control_plane_cidr": "controlPlaneCidr",
    "version": "version",
    "regional": "regional",
    "deletion_protection": "deletionProtection",
    "system_pool": "systemPool",
    "jobset_version": "jobSetVersion",
    "pod_range": "podRange",
    "service_range": "serviceRange",
}


def _check_cluster_keys(config: Any) -> None:
    """The keys of an existing cluster only with one, a new cluster's only without, an existing
    cluster in the stack's region, and a new cluster's control plane outside the stack's subnet;
    one message naming the key (before any resource exists, for every command)."""
    settings = config.gke
    if settings.cluster is None:
        if settings.cluster_location is not None:
            raise invalid(
                "multislice:gke.clusterLocation",
                "is the location of an existing cluster and applies only with multislice:gke.cluster; a cluster the "
                "stack makes is in its zone (gcp:zone), or its region with multislice:gke.regional: remove it, or "
                "name the cluster",
            )
        network = config.network
        _check_ranges(settings, network, config.project)
        cidr = settings.control_plane_cidr
        if cidr is not None and network.existing_network is None:
            if ipaddress.IPv4Network(cidr).overlaps(ipaddress.IPv4Network(network.subnet_cidr)):
                raise invalid(
                    "multislice:gke.controlPlaneCidr",
                    f"{cidr} overlaps the stack's subnetwork {network.subnet_cidr} (multislice:network.subnetCidr): "
                    "the control plane's range must not overlap any range of the cluster's VPC",
                )
        return
    if settings.install_jobset:
        raise invalid(
            "multislice:gke.installJobSet",
            f"is true and multislice:gke.cluster names an existing cluster ({settings.cluster}): the stack would own "
            "that cluster's JobSet controller and CRD, and pulumi destroy would delete them with every JobSet of every "
            "team on it; install JobSet there once, outside the stack (docs/gke.md section 5), and remove this key",
        )
    for field, key in NEW_CLUSTER_KEYS.items():
        if field in settings.model_fields_set:
            raise invalid(
                f"multislice:gke.{key}",
                f"configures the cluster the stack makes, and multislice:gke.cluster names an existing one "
                f"({settings.cluster}), which the stack does not change: remove it",
            )
    try:
        check_cluster_location(settings.cluster_location or config.zone, config.zone)
    except ValueError as err:
        key, _, why = str(err).partition(": ")
        raise invalid(key, why) from None


SPEC = GkeSpec()

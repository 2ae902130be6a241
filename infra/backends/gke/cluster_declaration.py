"""A new cluster's arguments (``gcp.container.Cluster``): what :mod:`infra.backends.gke.cluster`'s
module docstring states about names, private nodes, upgrades, regional control planes, deletion
protection and Workload Identity, as the args pulumi-gcp takes."""

from __future__ import annotations

from typing import Any

from infra.backends.gke.cluster import CLUSTER_NAME, region_of, workload_pool

#: The release channel of a new cluster (module docstring).
RELEASE_CHANNEL = "REGULAR"
#: The daily maintenance window's start, GMT ("HH:MM"; Cluster Toolkit's ``maintenance_start_time``).
MAINTENANCE_START = "09:00"
#: The maintenance exclusion of a new cluster: Cluster Toolkit's TPU blueprints' own (name, start time,
#: scope, end behaviour).
MAINTENANCE_EXCLUSION = {
    "exclusion_name": "no-minor-or-node-upgrades-indefinite",
    "start_time": "2025-12-01T00:00:00Z",
    "exclusion_options": {"scope": "NO_MINOR_OR_NODE_UPGRADES", "end_time_behavior": "UNTIL_END_OF_SUPPORT"},
}


def cluster_args(
    *,
    name: str,
    project: str,
    zone: str,
    network: Any,
    subnetwork: Any,
    labels: dict[str, str],
    control_plane_cidr: str | None = None,
    version: str | None = None,
    deletion_protection: bool = False,
    pod_range: str | None = None,
    service_range: str | None = None,
    regional: bool = False,
) -> dict[str, Any]:
    """The args of a new Standard cluster (``gcp.container.Cluster``) in ``zone`` (``regional``: in its
    region, its nodes in ``zone``; module docstring): VPC-native,
    private nodes, private IP endpoint, DNS-based endpoint, Workload Identity, the stack's labels, no
    default node pool (the system pool and the slices' pools are added beside it), the ``REGULAR``
    channel with ``version`` as its minimum when given, the maintenance window and exclusion of the
    module docstring, and ``deletion_protection`` explicitly. Pods and Services take their IPs from the
    subnetwork's secondary ranges ``pod_range`` and ``service_range`` when named (the Container API's
    ``IPAllocationPolicy.clusterSecondaryRangeName``: "an existing secondary range associated with the
    cluster subnetwork"), else from ranges GKE adds to the subnetwork.

    Raises:
      ValueError: ``name`` is not a GKE cluster name.
    """
    if not CLUSTER_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not a GKE cluster name (gcloud container clusters create --help)")
    private: dict[str, Any] = {"enable_private_nodes": True, "enable_private_endpoint": True}
    if control_plane_cidr is not None:
        private["master_ipv4_cidr_block"] = control_plane_cidr
    return {
        "name": name,
        "project": project,
        "location": region_of(zone) if regional else zone,
        **({"node_locations": [zone]} if regional else {}),
        "network": network,
        "subnetwork": subnetwork,
        "networking_mode": "VPC_NATIVE",
        "ip_allocation_policy": (
            {"cluster_secondary_range_name": pod_range, "services_secondary_range_name": service_range}
            if pod_range is not None and service_range is not None
            else {}
        ),
        "private_cluster_config": private,
        "control_plane_endpoints_config": {"dns_endpoint_config": {"allow_external_traffic": True}},
        "workload_identity_config": {"workload_pool": workload_pool(project)},
        "remove_default_node_pool": True,
        "initial_node_count": 1,
        "resource_labels": dict(labels),
        "deletion_protection": deletion_protection,
        "release_channel": {"channel": RELEASE_CHANNEL},
        **({"min_master_version": version} if version is not None else {}),
        "maintenance_policy": {
            "daily_maintenance_window": {"start_time": MAINTENANCE_START},
            "maintenance_exclusions": [MAINTENANCE_EXCLUSION],
        },
    }

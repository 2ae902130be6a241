"""The gke backend's cluster and the Pods' identity: ``multislice:gke`` (:class:`GkeSettings`; a
stack key once the backend is registered, not before), the args of a new cluster
(:func:`cluster_args`), and the Workload Identity binding that lets the Pods' Kubernetes service
account act as the stack's Google service account.

Facts ([Google] unless marked; docs/gke.md sections 1 and 7):

* Cluster names: "may contain only lowercase alphanumerics and '-', must start with a letter and end
  with an alphanumeric, and must be no longer than 40 characters" (gcloud 528, ``container clusters
  create --help``).
* A cluster's nodes are in zones of its own region: "All zones must be in the same region as the
  cluster's master(s)" (``clusters create --node-locations``); a slice's pool is in the stack's zone,
  so an existing cluster in another region cannot take it.
* Private nodes: "no public IP addresses on the cluster nodes" (``--enable-private-nodes``), on a
  VPC-native cluster; the control plane is reached over its DNS-based endpoint ("DNS-based control
  plane access is recommended", ``--enable-dns-access``), and its IP endpoint is private
  (``--enable-private-endpoint``). ``--master-ipv4-cidr`` "should be used in conjunction with" private
  nodes: it is sent when ``multislice:gke.controlPlaneCidr`` is set.
* Workload Identity: the only workload pool accepted is ``PROJECT_ID.svc.id.goog``
  (``--workload-pool``); the Google service account grants ``roles/iam.workloadIdentityUser`` to
  ``serviceAccount:PROJECT_ID.svc.id.goog[NAMESPACE/KSA]`` and the Kubernetes service account carries
  ``iam.gke.io/gcp-service-account: GSA_EMAIL`` (Google's kubernetes-engine-samples).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from pydantic import Field, field_validator

from infra.durations import Duration
from infra.subnets import check_subnet_range
from training.validation import StrictModel

#: gcloud 528's rule for a cluster name (module docstring).
CLUSTER_NAME = re.compile(r"^[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?$")
#: A Kubernetes namespace or service account name: an RFC 1123 DNS label (Kubernetes' "Object
#: Names and IDs": at most 63 lowercase alphanumerics or '-', starting and ending alphanumeric).
DNS_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
#: The longest a node may run, seconds: "up to seven days" (GKE's flex-start provisioning mode page;
#: docs/gke.md section 3).
MAX_RUN_DURATION_S = 7 * 24 * 3600
#: The annotation that binds a Kubernetes service account to a Google one.
GSA_ANNOTATION = "iam.gke.io/gcp-service-account"
WORKLOAD_IDENTITY_ROLE = "roles/iam.workloadIdentityUser"
#: The JobSet release a stack installs by default: [Google] GKE's dynamic-slicing page asks for
#: v0.10.1 or later for Multislice, and [third-party] xpk pins it (docs/gke.md section 5).
JOBSET_VERSION = "v0.10.1"
#: The Pods' default image: what the boot runs before its own Python exists (bash, curl, xz,
#: tar, sha256sum, flock, and a python3 with pip to install uv; docs/vm-boot.md). [third-party]
#: Docker's official ``python`` image: ``3.12/bookworm/Dockerfile`` is ``FROM buildpack-deps:bookworm``
#: and installs pip; buildpack-deps' ``bookworm/curl`` adds curl and its ``bookworm`` adds xz-utils
#: (docker-library/python, docker-library/buildpack-deps).
DEFAULT_IMAGE = "python:3.12-bookworm"


class GkeSettings(StrictModel):
    """``multislice:gke``: where a ``multislice:backend: gke`` stack's slices and Pods go (docs/gke.md)."""

    model_config = StrictModel.model_config | {"populate_by_name": True}

    cluster: str | None = Field(
        default=None,
        description="An existing GKE Standard cluster to add the node pools to (default: the stack makes one).",
    )
    cluster_location: str | None = Field(
        default=None,
        alias="clusterLocation",
        description="The existing cluster's zone or region (default: the stack's zone).",
    )
    namespace: str = Field(default="default", description="The Kubernetes namespace of the run's JobSet.")
    max_run_duration: Duration | None = Field(
        default=None,
        alias="maxRunDuration",
        description="How long each node may run (≤ 7d; default: GKE's, seven days for flex-start).",
    )
    control_plane_cidr: str | None = Field(
        default=None,
        alias="controlPlaneCidr",
        description="A /28 for a new cluster's control plane (gcloud's --master-ipv4-cidr); default: none sent.",
    )

    install_jobset: bool = Field(
        default=True,
        alias="installJobSet",
        description="Install the JobSet controller (jobSetVersion's release manifests); false if the cluster runs one.",
    )
    image: str = Field(
        default=DEFAULT_IMAGE,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}$",
        description=f"The Pods' container image (default {DEFAULT_IMAGE}): bash, curl, xz and python3 with pip.",
    )
    jobset_version: str = Field(
        default=JOBSET_VERSION,
        alias="jobSetVersion",
        pattern=r"^v[0-9]+\.[0-9]+\.[0-9]+$",
        description=f"The JobSet release installed (default {JOBSET_VERSION}: GKE's Multislice minimum, xpk's pin).",
    )

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str | None) -> str | None:
        if value is not None and not CLUSTER_NAME.match(value):
            raise ValueError(
                f"{value!r} is not a GKE cluster name: lowercase letters, digits and '-', starting with a letter, "
                "ending with a letter or digit, at most 40 characters (gcloud container clusters create --help)"
            )
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not DNS_LABEL.match(value):
            raise ValueError(
                f"{value!r} is not a Kubernetes namespace name: at most 63 lowercase letters, digits or '-', "
                "starting and ending with a letter or digit"
            )
        return value

    @field_validator("max_run_duration")
    @classmethod
    def _run_duration(cls, value: int | None) -> int | None:
        if value is not None and value > MAX_RUN_DURATION_S:
            raise ValueError(
                f"{value}s is longer than 7d ({MAX_RUN_DURATION_S} s): GKE's flex-start nodes run seven days at most"
            )
        return value

    @field_validator("control_plane_cidr")
    @classmethod
    def _cidr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            network = ipaddress.IPv4Network(value)
        except ValueError as err:
            raise ValueError(f"{value!r} is not an IPv4 CIDR range: {err}") from None
        try:
            check_subnet_range(value)  # the ranges Google Cloud accepts in a VPC, private ones only
        except ValueError as err:
            raise ValueError(f"{value!r} must be a private /28 (gcloud's --master-ipv4-cidr): {err}") from None
        if network.prefixlen != 28:
            raise ValueError(f"{value!r} must be a private /28 (gcloud's --master-ipv4-cidr)")
        return value


def region_of(zone: str) -> str:
    """The region of a zone: ``us-east5-a`` → ``us-east5``."""
    return zone.rsplit("-", 1)[0]


def check_cluster_location(location: str, zone: str) -> None:
    """Refuse an existing cluster (zonal or regional ``location``) outside ``zone``'s region.

    Raises:
      ValueError: naming ``multislice:gke.clusterLocation``, the cluster's region and the zone's.
    """
    is_region = location.count("-") == 1
    if (location if is_region else region_of(location)) == region_of(zone):
        return
    where = f"region {location}" if is_region else f"zone {location} (region {region_of(location)})"
    raise ValueError(
        f"multislice:gke.clusterLocation: the cluster is in {where}, and the stack's zone {zone} (gcp:zone) is in "
        f"region {region_of(zone)}: a cluster's node pools stay in its own region, so name a cluster in "
        f"{region_of(zone)}, or leave multislice:gke.cluster unset to make one"
    )


def workload_pool(project: str) -> str:
    """The cluster's Workload Identity pool."""
    return f"{project}.svc.id.goog"


def workload_identity_member(project: str, namespace: str, service_account: str) -> str:
    """The IAM member of a Kubernetes service account, as the Google service account's
    :data:`WORKLOAD_IDENTITY_ROLE` binding names it."""
    return f"serviceAccount:{workload_pool(project)}[{namespace}/{service_account}]"


def cluster_args(
    *,
    name: str,
    project: str,
    zone: str,
    network: Any,
    subnetwork: Any,
    labels: dict[str, str],
    control_plane_cidr: str | None = None,
) -> dict[str, Any]:
    """The args of a new zonal Standard cluster (``gcp.container.Cluster``) in ``zone``: VPC-native,
    private nodes, private IP endpoint, DNS-based endpoint, Workload Identity, the stack's labels, no
    default node pool (the slices' pools are added beside it).

    Raises:
      ValueError: ``name`` is not a GKE cluster name.
    """
    if not CLUSTER_NAME.match(name):
        raise ValueError(f"{name!r} is not a GKE cluster name (gcloud container clusters create --help)")
    private: dict[str, Any] = {"enable_private_nodes": True, "enable_private_endpoint": True}
    if control_plane_cidr is not None:
        private["master_ipv4_cidr_block"] = control_plane_cidr
    return {
        "name": name,
        "project": project,
        "location": zone,
        "network": network,
        "subnetwork": subnetwork,
        "networking_mode": "VPC_NATIVE",
        "ip_allocation_policy": {},
        "private_cluster_config": private,
        "control_plane_endpoints_config": {"dns_endpoint_config": {"allow_external_traffic": True}},
        "workload_identity_config": {"workload_pool": workload_pool(project)},
        "remove_default_node_pool": True,
        "initial_node_count": 1,
        "resource_labels": dict(labels),
    }

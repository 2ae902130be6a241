"""The gke backend's cluster and the Pods' identity: ``multislice:gke`` (:class:`GkeSettings`; a
stack key once the backend is registered, not before), the facts a new cluster is declared by (its
args: :func:`infra.backends.gke.cluster_declaration.cluster_args`), and the Workload Identity
binding that lets the Pods' Kubernetes service account act as the stack's Google service account.

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
* Upgrades ([Google] Cluster Toolkit's TPU blueprints, ``examples/gke-consumption-options/*/gke-tpu-7x``
  and ``gke-tpu-v6e``; Container API v1): the ``REGULAR`` release channel, a daily maintenance window at
  09:00 GMT (``modules/scheduler/gke-cluster``'s default), and one maintenance exclusion of scope
  ``NO_MINOR_OR_NODE_UPGRADES`` ("excludes all minor upgrades for the cluster, and also exclude all node
  pool upgrades. Only control plane patches are allowed") until the minor version's end of support
  (``UNTIL_END_OF_SUPPORT``): no upgrade recreates a multi-host pool mid-run.
* Regional or zonal: a regional cluster's control plane is replicated across zones of its region and
  stays available through a zone's outage and its own upgrades ("Regional clusters"; "Use regional
  clusters to run your production workloads", "Creating a zonal cluster"); Standard node pools take
  the zones they run in (``node_locations``, all in the cluster's region), by default every zone of a
  regional cluster; a regional cluster cannot become zonal later, and takes more regional quota. A
  zonal cluster's ``node_locations`` omits its own zone (pulumi-gcp's ``Cluster.node_locations``), so
  it is sent only for a regional one. Cluster Toolkit's ``gke-cluster`` defaults to regional
  (``cluster_availability_type = "REGIONAL"``).
* Deletion protection: pulumi-gcp's ``deletion_protection`` defaults to true, and a destroy "will only
  succeed if this field is false" in state; it is sent explicitly, false unless the stack asks for it
  (``multislice:gke.deletionProtection``; Cluster Toolkit's ``deletion_protection`` defaults to false).
* A system pool ([Google] Cluster Toolkit's ``gke-cluster`` always adds one, ``e2-standard-4`` by
  default, autoscaled, and its TPU blueprints leave it untainted; [third-party] xpk makes a CPU default
  pool): the JobSet controller, kube-dns and GKE's own Pods run there, never on TPU nodes, which carry
  ``google.com/tpu=present:NoSchedule`` (:mod:`~infra.backends.gke.node_pools`). Its machine type is therefore a
  Compute Engine machine type and not a TPU one (:mod:`~infra.backends.gke.machine_types`).
* Workload Identity: the only workload pool accepted is ``PROJECT_ID.svc.id.goog``
  (``--workload-pool``); the Google service account grants ``roles/iam.workloadIdentityUser`` to
  ``serviceAccount:PROJECT_ID.svc.id.goog[NAMESPACE/KSA]`` and the Kubernetes service account carries
  ``iam.gke.io/gcp-service-account: GSA_EMAIL`` (Google's kubernetes-engine-samples).
"""

from __future__ import annotations

import ipaddress
import re

from pydantic import Field, field_validator, model_validator

from infra.backends.gke import machine_types, versions
from infra.backends.gke.image_reference import check_image
from infra.durations import Duration
from infra.subnets import check_subnet_range
from training.validation import ConfigBool, StrictModel

#: gcloud 528's rule for a cluster name (module docstring).
CLUSTER_NAME = re.compile(r"^[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?$")
#: A Kubernetes namespace or service account name: an RFC 1123 DNS label (Kubernetes' "Object
#: Names and IDs": at most 63 lowercase alphanumerics or '-', starting and ending alphanumeric).
#: A subnetwork secondary range's name (RFC 1035, as the Compute API's ``rangeName`` takes it).
RANGE_NAME = re.compile(r"^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
#: The longest a node may run, seconds: "up to seven days" (GKE's flex-start provisioning mode page;
#: docs/gke.md section 3).
MAX_RUN_DURATION_S = 7 * 24 * 3600
#: The shortest, seconds: flex-start nodes come from Dynamic Workload Scheduler, whose run durations
#: are 10 minutes to 7 days ("About resize requests in a MIG", the compute-engine backend's
#: ``MIN_RUN_DURATION``); GKE documents no other floor.
MIN_RUN_DURATION_S = 600
#: A GKE cluster location: a region (``us-east5``) or a zone (``us-east5-a``, or an AI zone
#: ``us-central1-ai1a``), as the config's ``gcp:zone`` is checked.
LOCATION = re.compile(r"[a-z]+-[a-z]+[0-9]+(?:-(?:[a-z]|ai[0-9]+[a-z]?))?")
#: Namespaces Kubernetes, GKE or the JobSet controller own: Kubernetes reserves the ``kube-``
#: prefix ("Avoid creating namespaces with the prefix kube-, since it is reserved for Kubernetes
#: system namespaces": Kubernetes' "Namespaces" page); GKE runs its managed components in
#: ``gke-*`` and Managed Service for Prometheus in ``gmp-system``/``gmp-public``; JobSet's release
#: manifests install into ``jobset-system`` (docs/gke.md section 5), Kueue's into ``kueue-system`` (its
#: ``config/default/kustomization.yaml``).
RESERVED_NAMESPACES = {
    "jobset-system": "the JobSet controller",
    "kueue-system": "Kueue",
    "gmp-system": "GKE",
    "gmp-public": "GKE",
}
RESERVED_NAMESPACE_PREFIXES = {"kube-": "Kubernetes", "gke-": "GKE"}
#: The annotation that binds a Kubernetes service account to a Google one.
GSA_ANNOTATION = "iam.gke.io/gcp-service-account"
WORKLOAD_IDENTITY_ROLE = "roles/iam.workloadIdentityUser"
#: The JobSet release a stack installs by default: [Google] GKE's dynamic-slicing page asks for
#: v0.10.1 or later for Multislice, and [third-party] xpk pins it (docs/gke.md section 5).
JOBSET_VERSION = "v0.10.1"
#: The oldest release ``multislice:gke.jobSetVersion`` may install, and the oldest controller an existing
#: cluster may run (:func:`infra.backends.gke.workload.check_jobset_controller`): the stack's JobSet is
#: written for v0.10.1's API (its failure policy's named rules with ``onJobFailureReasons``, checked against
#: v0.10.1's CRD by tests/backends/gke/test_jobset_schema.py), and GKE asks for v0.10.1 or later for
#: Multislice (the line above).
JOBSET_FLOOR = JOBSET_VERSION
#: The Kueue release a stack with ``multislice:gke.queuedProvisioning`` installs in a cluster it makes, and the
#: oldest an existing cluster may run: [Google] Cluster Toolkit's ``modules/management/kubectl-apply`` defaults
#: to it at v1.95.0 (``kueue.version`` "0.17.1"), and its queues are checked against that release's CRDs
#: (tests/data/kueue-v0.17.1; :mod:`infra.backends.gke.kueue`).
KUEUE_VERSION = "v0.17.1"
#: The Pods' default image: what the boot runs before its own Python exists (bash, curl, xz,
#: tar, sha256sum, flock, and a python3 with pip to install uv; docs/vm-boot.md). [third-party]
#: Docker's official ``python`` image: ``3.12/bookworm/Dockerfile`` is ``FROM buildpack-deps:bookworm``
#: and installs pip; buildpack-deps' ``bookworm/curl`` adds curl and its ``bookworm`` adds xz-utils
#: (docker-library/python, docker-library/buildpack-deps).
DEFAULT_IMAGE = "python:3.12-bookworm"
#: The system pool's defaults: machine type and autoscaling bounds (module docstring).
SYSTEM_POOL_MACHINE_TYPE = "e2-standard-4"
SYSTEM_POOL_MIN_NODES = 1
SYSTEM_POOL_MAX_NODES = 3


class SystemPoolSettings(StrictModel):
    """``multislice:gke.systemPool``: a new cluster's CPU node pool for the cluster's own workloads (keys by
    their stack-file names only, as every key of ``multislice:gke``)."""

    machine_type: str = Field(
        default=SYSTEM_POOL_MACHINE_TYPE,
        alias="machineType",
        description=f"Its machine type (default {SYSTEM_POOL_MACHINE_TYPE}): a Compute Engine one, not a TPU one.",
    )
    min_nodes: int = Field(
        default=SYSTEM_POOL_MIN_NODES,
        alias="minNodes",
        ge=1,
        le=1000,
        description=f"Fewest nodes (default {SYSTEM_POOL_MIN_NODES}; at least 1: the JobSet controller's webhooks "
        "refuse every JobSet while it runs nowhere).",
    )
    max_nodes: int = Field(
        default=SYSTEM_POOL_MAX_NODES,
        alias="maxNodes",
        ge=1,
        le=1000,
        description=f"Most nodes (default {SYSTEM_POOL_MAX_NODES}).",
    )

    @field_validator("machine_type")
    @classmethod
    def _machine_type(cls, value: str) -> str:
        return machine_types.check_system_machine_type(value, SYSTEM_POOL_MACHINE_TYPE)

    @model_validator(mode="after")
    def _bounds(self) -> SystemPoolSettings:
        if self.max_nodes < self.min_nodes:
            raise ValueError(f"maxNodes {self.max_nodes} is below minNodes {self.min_nodes}")
        return self


class GkeSettings(StrictModel):
    """``multislice:gke``: where a ``multislice:backend: gke`` stack's slices and Pods go (docs/gke.md). Keys by
    their stack-file names only: a snake_case spelling (``deletion_protection``) is an unknown key that names
    the camelCase one."""

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
    version: str | None = Field(
        default=None,
        description="A new cluster's minimum GKE version (1.35 or 1.35.0-gke.N); default: the REGULAR channel's.",
    )
    regional: ConfigBool = Field(
        default=False,
        description="Make the new cluster regional: its control plane replicated in the zone's region, its nodes "
        "still in the stack's zone (default false: a zonal control plane; docs/gke.md section 11).",
    )
    deletion_protection: ConfigBool = Field(
        default=False,
        alias="deletionProtection",
        description="Refuse to delete a new cluster (pulumi destroy fails until it is false in state).",
    )
    system_pool: SystemPoolSettings = Field(
        default_factory=SystemPoolSettings,
        alias="systemPool",
        description="A new cluster's CPU node pool for the JobSet controller and cluster services.",
    )

    pod_range: str | None = Field(
        default=None,
        alias="podRange",
        description="The secondary range of a reused subnetwork a new cluster's Pods take their IPs from (default: GKE "
        "adds one; required on a Shared VPC subnetwork of another project, beside serviceRange).",
    )
    service_range: str | None = Field(
        default=None,
        alias="serviceRange",
        description="The secondary range of a reused subnetwork a new cluster's Services take their IPs from.",
    )
    install_jobset: ConfigBool | None = Field(
        default=None,
        alias="installJobSet",
        description="Install the JobSet controller (jobSetVersion's release manifests) in the cluster the stack makes "
        "(default: true there; never in an existing cluster, whose JobSet every team on it shares).",
    )
    queued_provisioning: ConfigBool = Field(
        default=False,
        alias="queuedProvisioning",
        description="Ask for every slice's flex-start capacity at once (GKE's queued provisioning through Kueue "
        f"{KUEUE_VERSION}); flex-start only (default false: each pool scales up on its own; docs/gke.md section 3).",
    )
    image: str = Field(
        default=DEFAULT_IMAGE,
        description=f"The Pods' container image (default {DEFAULT_IMAGE}): bash, curl, xz and python3 with pip.",
    )
    jobset_version: str = Field(
        default=JOBSET_VERSION,
        alias="jobSetVersion",
        pattern=r"^v[0-9]+\.[0-9]+\.[0-9]+$",
        description=f"The JobSet release installed (default {JOBSET_VERSION}: GKE's Multislice minimum, xpk's pin; "
        f"{JOBSET_FLOOR} or later).",
    )

    @property
    def installs_jobset(self) -> bool:
        """Whether the stack installs (and owns) the JobSet controller: in a cluster it makes, unless
        ``installJobSet: false``; never in an existing one (refused there: ``infra.backends.gke.spec``)."""
        return self.cluster is None and self.install_jobset is not False

    @field_validator("pod_range", "service_range")
    @classmethod
    def _range_name(cls, value: str | None) -> str | None:
        if value is not None and not RANGE_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a subnetwork secondary range name: a lowercase letter, then up to 62 lowercase "
                "letters, digits or '-', not ending with '-' (the Compute API's SubnetworkSecondaryRange.rangeName)"
            )
        return value

    @model_validator(mode="after")
    def _both_ranges(self) -> GkeSettings:
        if (self.pod_range is None) != (self.service_range is None):
            missing = "serviceRange" if self.service_range is None else "podRange"
            raise ValueError(f"podRange and serviceRange are named together (both or neither): set {missing} too")
        return self

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, value: str | None) -> str | None:
        if value is not None and not CLUSTER_NAME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a GKE cluster name: lowercase letters, digits and '-', starting with a letter, "
                "ending with a letter or digit, at most 40 characters (gcloud container clusters create --help)"
            )
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str) -> str:
        return check_image(value)

    @field_validator("jobset_version")
    @classmethod
    def _jobset_floor(cls, value: str) -> str:
        if release(value) < release(JOBSET_FLOOR):
            raise ValueError(
                f"{value} is below {JOBSET_FLOOR}, the oldest JobSet release the stack's JobSet is written for (its "
                f"failure policy's named rules; GKE asks for {JOBSET_FLOOR} or later for Multislice: docs/gke.md "
                f"section 5): use {JOBSET_FLOOR} or later"
            )
        return value

    @field_validator("cluster_location")
    @classmethod
    def _location(cls, value: str | None) -> str | None:
        if value is not None and not LOCATION.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a GKE cluster location: a region (us-east5) or a zone (us-east5-a), as "
                "gcloud container clusters list shows it"
            )
        return value

    @field_validator("version")
    @classmethod
    def _version(cls, value: str | None) -> str | None:
        if value is not None:
            versions.parse(value)  # its message says what a version looks like
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not DNS_LABEL.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Kubernetes namespace name: at most 63 lowercase letters, digits or '-', "
                "starting and ending with a letter or digit"
            )
        owner = reserved_namespace(value)
        if owner is not None:
            raise ValueError(f"{value!r} is {owner}'s namespace; the stack would declare and own it: pick another")
        return value

    @field_validator("max_run_duration")
    @classmethod
    def _run_duration(cls, value: int | None) -> int | None:
        if value is not None and value > MAX_RUN_DURATION_S:
            raise ValueError(
                f"{value}s is longer than 7d ({MAX_RUN_DURATION_S} s): GKE's flex-start nodes run seven days at most"
            )
        if value is not None and value < MIN_RUN_DURATION_S:
            raise ValueError(
                f"{value}s is shorter than 10 minutes ({MIN_RUN_DURATION_S} s): Dynamic Workload Scheduler, which "
                "provisions flex-start nodes, takes run durations of 10 minutes to 7 days, as for compute-engine"
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


def release(version: str) -> tuple[int, ...]:
    """A JobSet release ``v0.10.1`` as ``(0, 10, 1)`` (the field's pattern has checked its form)."""
    return tuple(int(part) for part in version.removeprefix("v").split("."))


def reserved_namespace(name: str) -> str | None:
    """Who owns namespace ``name`` (:data:`RESERVED_NAMESPACES`), or None when a stack may use it."""
    if name in RESERVED_NAMESPACES:
        return RESERVED_NAMESPACES[name]
    return next((owner for prefix, owner in RESERVED_NAMESPACE_PREFIXES.items() if name.startswith(prefix)), None)


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

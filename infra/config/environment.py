"""The environment keys of a stack: ``multislice:network`` and ``multislice:bucket`` (each
backend's own key, such as ``multislice:queuedResource``, is its settings model in
:mod:`infra.backends`).

Their defaults give a complete environment around the slices (a VPC with NAT and firewall,
a regional checkpoint bucket).
GCP naming rules come from the Compute Engine and Cloud Storage references cited on each
check (:mod:`infra.naming` holds the rules themselves).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from infra import naming
from infra.durations import Duration, parse_duration  # noqa: F401 (part of this module's API)
from infra.subnets import (  # noqa: F401 (part of this module's API)
    PROHIBITED_SUBNET_RANGES,
    VALID_SUBNET_RANGES,
    check_subnet_range,
)
from training.validation import ConfigBool, StrictModel, invalid

#: A network or subnetwork given as a path: https://cloud.google.com/compute/docs/naming-resources
_GCE_PATH = re.compile(
    r"^projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/(global|regions/[a-z0-9-]+)/(networks|subnetworks)/[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
)
#: A Cloud Storage location as written: a region, a dual-region or a multi-region.
_LOCATION = re.compile(r"^[A-Za-z]+(?:-[A-Za-z]+[0-9]+|[0-9]*)$")


def _project_of(path: str | None) -> str | None:
    """The project of a ``projects/<p>/...`` path; None for a bare name."""
    return path.split("/")[1] if path and path.startswith("projects/") else None


def _gce_name_or_path(value: str | None, what: str) -> str | None:
    if value is None or naming.GCE_NAME.fullmatch(value) or _GCE_PATH.fullmatch(value):
        return value
    raise ValueError(
        f"{value!r} is not a {what} name (lowercase letters, digits, hyphens; starts with a letter; "
        f"at most 63 characters) or a projects/<project>/.../{what}s/<name> path"
    )


class _Settings(StrictModel):
    """The keys are read by their stack-file names only (``existingNetwork``, not ``existing_network``:
    a snake_case spelling is an unknown key that names the camelCase one)."""


class NetworkSettings(_Settings):
    """``multislice:network``: the VPC the TPU VMs live in.

    By default a custom-mode VPC with one subnetwork in the zone's region (Private Google
    Access on), a Cloud Router with Cloud NAT and the firewall rules are created. The VMs have
    no external IPs, and their startup script downloads Python and the trainer's wheels from
    the internet, so they need egress: Cloud NAT provides it.

    ``existingNetwork`` + ``existingSubnetwork`` reuse a VPC instead: the firewall rules are
    created in it, and the stack must say how its VMs reach the internet: ``nat: true``
    creates a Cloud Router + Cloud NAT for the subnetwork, ``nat: false`` states that the
    network already provides egress (its own Cloud NAT, a proxy). Without ``nat`` a reused
    network is refused: VMs that cannot build their environment would boot-loop silently.

    Shared VPC: a network given as ``projects/<host>/global/networks/<name>`` in another
    project is a Shared VPC host network. Firewall rules, the Cloud Router and NAT of a
    network live in the network's own project (https://cloud.google.com/vpc/docs/shared-vpc:
    the host project holds the network, its subnets and its firewall rules), so they are
    created in ``<host>`` (:meth:`host_project`), and a subnetwork given by name is looked up
    there. The subnetwork must be in the network's project and the zone's region (checked by
    ``StackConfig``, which knows both).

    ``iapSsh: true`` adds the one SSH ingress rule: TCP port 22 from Identity-Aware Proxy's
    TCP-forwarding range only (``multislice exec`` tunnels through IAP, the VMs having no
    external IPs); off by default, when nothing admits SSH.
    """

    mtu: int = Field(
        default=8896,
        ge=1300,
        le=8896,
        description="VPC MTU in bytes; 8896 (the largest GCE allows) carries DCN traffic in fewer packets. "
        "Source: https://cloud.google.com/vpc/docs/mtu",
    )
    existing_network: str | None = Field(
        default=None, alias="existingNetwork", description="Reuse this VPC (name or path)."
    )
    existing_subnetwork: str | None = Field(
        default=None,
        alias="existingSubnetwork",
        description="Reuse this subnetwork of the VPC (name or path), in the zone's region.",
    )
    subnet_cidr: str = Field(
        default="10.130.0.0/20", alias="subnetCidr", description="Primary range of the created subnetwork."
    )
    nat: ConfigBool | None = Field(
        default=None, description="Cloud Router + NAT; default: on for a created VPC, off for a reused one."
    )
    iap_ssh: ConfigBool = Field(
        default=False,
        alias="iapSsh",
        description="Admit SSH to the TPU VMs through Identity-Aware Proxy TCP forwarding: a firewall rule from "
        "IAP's range 35.235.240.0/20 on TCP port 22 only (https://cloud.google.com/iap/docs/using-tcp-forwarding); "
        "`multislice exec` needs it. Off: no SSH ingress at all.",
    )

    @field_validator("existing_network")
    @classmethod
    def _network_name(cls, value: str | None) -> str | None:
        return _gce_name_or_path(value, "network")

    @field_validator("existing_subnetwork")
    @classmethod
    def _subnetwork_name(cls, value: str | None) -> str | None:
        return _gce_name_or_path(value, "subnetwork")

    @field_validator("subnet_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        return check_subnet_range(value)

    @model_validator(mode="after")
    def _reuse_is_complete(self) -> NetworkSettings:
        if (self.existing_network is None) != (self.existing_subnetwork is None):
            missing = "existingSubnetwork" if self.existing_subnetwork is None else "existingNetwork"
            raise invalid(missing, "existingNetwork and existingSubnetwork are set together (reuse both or neither)")
        if self.existing_network is not None:
            for key, field in (("subnetCidr", "subnet_cidr"), ("mtu", "mtu")):
                if field in self.model_fields_set:
                    raise invalid(key, "only applies to a network created here; remove it when reusing existingNetwork")
            if self.nat is None:
                raise invalid(
                    "nat",
                    "required when reusing existingNetwork: the TPU VMs have no external IPs and their startup "
                    "script downloads Python and wheels from the internet; true creates a Cloud Router and Cloud "
                    "NAT for the subnetwork, false states that the network already provides egress (its own "
                    "Cloud NAT or a proxy)",
                )
        return self

    @property
    def reuses_network(self) -> bool:
        return self.existing_network is not None

    @property
    def creates_nat(self) -> bool:
        """Whether a Cloud Router + NAT is created: ``nat``, or true for a created network."""
        return self.nat if self.nat is not None else not self.reuses_network

    def host_project(self, project: str) -> str:
        """The project holding the network (and its firewall rules, router and NAT): the
        project of an ``existingNetwork`` path, else ``project`` (the stack's ``gcp:project``)."""
        return (_project_of(self.existing_network) if self.existing_network else None) or project

    def network_path(self, project: str) -> str | None:
        """``projects/<host>/global/networks/<name>`` of a reused network, else None."""
        if self.existing_network is None:
            return None
        if "/" in self.existing_network:
            return self.existing_network
        return f"projects/{project}/global/networks/{self.existing_network}"

    def subnetwork_path(self, project: str, region: str) -> str | None:
        """``projects/<host>/regions/<region>/subnetworks/<name>`` of a reused subnetwork (a bare
        name is in the network's project and the zone's region), else None."""
        if self.existing_subnetwork is None:
            return None
        if "/" in self.existing_subnetwork:
            return self.existing_subnetwork
        return f"projects/{self.host_project(project)}/regions/{region}/subnetworks/{self.existing_subnetwork}"


class BucketSettings(_Settings):
    """``multislice:bucket``: the checkpoint bucket.

    Location: ``location``, else the Cloud Storage location of the TPU zone's region
    (:mod:`infra.bucket_location`: not every TPU region is a storage location).

    Destroy: without ``forceDestroy``, ``pulumi destroy`` leaves the bucket and its objects in
    the project (Pulumi's ``retainOnDelete``); ``adopt: true`` makes the next ``pulumi up``
    import that bucket instead of creating one of the same name
    (``infra.components.storage.bucket_options``).

    Lifecycle: objects under ``runs/`` move to Nearline after ``nearlineAfterDays`` (Orbax keeps
    rewriting the newest checkpoints, so only old ones age) and are deleted after
    ``deleteAfterDays`` when set; incomplete multipart uploads are aborted after a day.

    Soft delete (``softDeleteDays``; GCS allows 0 or 7–90 days and keeps a deleted object
    restorable, and billed at its storage class's rate, for that long:
    https://cloud.google.com/storage/docs/soft-delete): by default 7 days on production stacks
    (``prod``, ``prod-*``: a checkpoint deleted by mistake can be restored) and 0 elsewhere,
    because Orbax deletes every superseded checkpoint, and each one then stays billed for the
    retention period (docs/deploying.md estimates the cost).
    """

    name: str | None = Field(default=None, description="Bucket name; default '<project>-<stack>-ckpt'.")
    location: str | None = Field(
        default=None, description="Cloud Storage location (region, dual- or multi-region); default: the TPU region's."
    )
    force_destroy: ConfigBool = Field(
        default=False,
        alias="forceDestroy",
        description="`pulumi destroy` deletes the bucket and its objects; else it keeps both (retainOnDelete).",
    )
    adopt: ConfigBool = Field(
        default=False,
        description="Import the existing bucket of this name (kept by an earlier `pulumi destroy`) instead of "
        "creating it.",
    )
    protect: ConfigBool | None = Field(
        default=None, description="Pulumi `protect`; default: on for stacks named prod or prod-*."
    )
    nearline_after_days: int | None = Field(default=30, ge=1, alias="nearlineAfterDays")
    delete_after_days: int | None = Field(default=None, ge=1, alias="deleteAfterDays")
    soft_delete_days: int | None = Field(default=None, ge=0, le=90, alias="softDeleteDays")

    @field_validator("name")
    @classmethod
    def _bucket_name(cls, value: str | None) -> str | None:
        if value is not None and (
            not naming.BUCKET_NAME.fullmatch(value) or value.startswith("goog") or "google" in value
        ):
            raise ValueError(
                f"{value!r} is not a bucket name (3–63 lowercase letters, digits, '-', '_'; starts and ends "
                "with a letter or digit; no 'goog' prefix or 'google')"
            )
        return value

    @field_validator("location")
    @classmethod
    def _location(cls, value: str | None) -> str | None:
        if value is not None and not _LOCATION.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a Cloud Storage location like 'US-CENTRAL1', 'NAM4' or 'US' "
                "(https://cloud.google.com/storage/docs/locations)"
            )
        return value.upper() if value is not None else None

    @model_validator(mode="after")
    def _lifecycle(self) -> BucketSettings:
        if self.soft_delete_days is not None and 0 < self.soft_delete_days < 7:
            raise invalid("softDeleteDays", f"must be 0 (off) or 7–90 days; got {self.soft_delete_days}")
        if (
            self.delete_after_days is not None
            and self.nearline_after_days is not None
            and self.delete_after_days <= self.nearline_after_days
        ):
            raise invalid(
                "deleteAfterDays",
                f"{self.delete_after_days} must be greater than nearlineAfterDays ({self.nearline_after_days}), "
                "or set nearlineAfterDays to null",
            )
        return self

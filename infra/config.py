"""StackConfig: the one parser of a stack's configuration.

A stack is ``stacks/Pulumi.<stack>.yaml`` (``stackConfigDir: stacks`` in Pulumi.yaml). Its
``config:`` map holds ``gcp:project``, ``gcp:zone`` and the ``multislice:*`` keys below.
Two paths read it and must give equal models (tests/test_config.py checks this):

* inside ``pulumi up``/``preview``: :func:`from_pulumi_config` reads the engine's config map
  (scalars arrive as strings, objects as JSON text);
* everywhere else (local emulation, ``multislice plan``, rendering): :func:`load_stack`
  reads the YAML file directly.

Validation happens before any resource exists. A :class:`StackConfigError` lists every
problem as ``<key path>: <what is wrong; what is allowed>``.

Rules and their sources:

* accelerator type is in the catalog (``infra.accelerators``);
* slices > 1 only where the generation supports Multislice (v4 and later), and
  1 ≤ slices ≤ 256 (SEED-NOTES.md, "Concepts");
* ici.data × ici.fsdp × ici.tensor = chips per slice and dcn.data × dcn.fsdp × dcn.tensor =
  slices, dcn.tensor = 1 (SEED-NOTES.md, "Parallelism rules");
* the global batch divides by the data-parallel size (``training.config``);
* ``reservationName`` only with ``capacity: reserved``; a reservation name or a full
  ``projects/<p>/locations/<zone>/reservations/<name>`` path;
* ``multislice:network``, ``multislice:bucket``, ``multislice:queuedResource`` and
  ``multislice:labels`` (objects) describe the cloud environment around the slices; their
  defaults give a complete environment (see :class:`NetworkSettings`, :class:`BucketSettings`,
  :class:`QueuedResourceSettings`). GCP naming rules come from the Compute Engine, Cloud
  Storage and IAM references cited on each field.
"""

from __future__ import annotations

import difflib
import hashlib
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
import yaml
from pydantic import BeforeValidator, Field, field_validator, model_validator

from infra import accelerators
from training.config import StrictModel, TrainConfig, format_errors, invalid

#: Keys of other namespaces that this program reads. All other ``gcp:*`` keys (credentials,
#: impersonation, …) belong to the gcp provider and are left alone.
GCP_KEYS = ("gcp:project", "gcp:zone")
NAMESPACE = "multislice"

CAPACITY_TYPES = ("spot", "on-demand", "reserved", "best-effort")

_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_PROJECT = re.compile(r"^[a-z][a-z0-9-]{4,28}[a-z0-9]$")
#: Stack and run names become directory names (local state, ``gs://<bucket>/runs/<run>``):
#: they start with a letter or digit, so "." and ".." can never name a parent directory.
_STACK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
#: Compute Engine resource names (RFC 1035): https://cloud.google.com/compute/docs/naming-resources
_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_GCE_PATH = re.compile(r"^projects/[a-z][a-z0-9-]{4,28}[a-z0-9]/(global|regions/[a-z0-9-]+)/(networks|subnetworks)/[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_RESERVATION_PATH = re.compile(
    r"^(projects|folders|organizations)/[A-Za-z0-9-]+/locations/[a-z0-9-]+/reservations/([a-z]([-a-z0-9]{0,61}[a-z0-9])?|-)$"
)
#: Cloud Storage bucket names: https://cloud.google.com/storage/docs/buckets#naming (dots not allowed
#: here: they would need domain verification).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$")
#: Label keys/values: https://cloud.google.com/resource-manager/docs/labels-overview#requirements
_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_DURATION = re.compile(r"^(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?$")

#: Ranges Identity-Aware Proxy TCP forwarding connects from; the only SSH source the firewall
#: admits. Source: https://cloud.google.com/iap/docs/using-tcp-forwarding#create-firewall-rule
IAP_SSH_RANGE = "35.235.240.0/20"
#: Labels this program sets on every labelled resource; ``multislice:labels`` may not override them.
RESERVED_LABELS = ("managed-by", "multislice-stack", "multislice-run")


def parse_duration(value: Any) -> int:
    """Seconds in a duration written ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``, ``"1h30m"`` or as a
    number of seconds.

    Raises:
      ValueError: anything else (pydantic turns it into a key-path error line).
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a duration; write e.g. '90s', '30m', '2h', '1d'")
    if isinstance(value, int):
        seconds = value
    elif isinstance(value, str) and value.strip().isdigit():
        seconds = int(value.strip())
    elif isinstance(value, str) and value.strip() and (m := _DURATION.match(value.strip())):
        seconds = (
            int(m["d"] or 0) * 86400 + int(m["h"] or 0) * 3600 + int(m["m"] or 0) * 60 + int(m["s"] or 0)
        )
    else:
        raise ValueError(f"{value!r} is not a duration; write e.g. '90s', '30m', '2h', '1d' or seconds")
    if seconds <= 0:
        raise ValueError(f"{value!r}: the duration must be positive")
    return seconds


#: A positive duration in whole seconds, written as seconds or ``"30m"``-style text.
Duration = Annotated[int, BeforeValidator(parse_duration)]


def _gce_name_or_path(value: str | None, what: str) -> str | None:
    if value is None or _GCE_NAME.match(value) or _GCE_PATH.match(value):
        return value
    raise ValueError(
        f"{value!r} is not a {what} name (lowercase letters, digits, hyphens; starts with a letter; "
        f"at most 63 characters) or a projects/<project>/.../{what}s/<name> path"
    )


class _Settings(StrictModel):
    model_config = StrictModel.model_config | {"populate_by_name": True}


class NetworkSettings(_Settings):
    """``multislice:network``: the VPC the TPU VMs live in.

    By default a custom-mode VPC with one subnetwork in the zone's region (Private Google
    Access on), a Cloud Router with Cloud NAT (VMs have no external IPs) and the firewall
    rules are created. ``existingNetwork`` + ``existingSubnetwork`` reuse a VPC instead: only
    the firewall rules are then created in it, and NAT only when ``nat: true``.
    """

    mtu: int = Field(
        8896,
        ge=1300,
        le=8896,
        description="VPC MTU in bytes; 8896 (the largest GCE allows) carries DCN traffic in fewer packets. "
        "Source: https://cloud.google.com/vpc/docs/mtu",
    )
    existing_network: str | None = Field(None, alias="existingNetwork", description="Reuse this VPC (name or path).")
    existing_subnetwork: str | None = Field(
        None, alias="existingSubnetwork", description="Reuse this subnetwork of the VPC (name or path), in the zone's region."
    )
    subnet_cidr: str = Field("10.130.0.0/20", alias="subnetCidr", description="Primary range of the created subnetwork.")
    nat: bool | None = Field(None, description="Cloud Router + NAT; default: on for a created VPC, off for a reused one.")

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
        try:
            net = ipaddress.IPv4Network(value, strict=True)
        except ValueError as err:
            raise ValueError(f"{value!r} is not an IPv4 CIDR range like '10.130.0.0/20' ({err})") from None
        if not net.is_private or net.prefixlen < 8 or net.prefixlen > 29:
            raise ValueError(
                f"{value!r} must be a private (RFC 1918) range with a prefix length from /8 to /29"
            )
        return value

    @model_validator(mode="after")
    def _reuse_is_complete(self) -> NetworkSettings:
        if (self.existing_network is None) != (self.existing_subnetwork is None):
            missing = "existingSubnetwork" if self.existing_subnetwork is None else "existingNetwork"
            raise invalid(missing, "existingNetwork and existingSubnetwork are set together (reuse both or neither)")
        if self.existing_network is not None:
            for key, field in (("subnetCidr", "subnet_cidr"), ("mtu", "mtu")):
                if field in self.model_fields_set:
                    raise invalid(key, "only applies to a network created here; remove it when reusing existingNetwork")
        return self

    @property
    def reuses_network(self) -> bool:
        return self.existing_network is not None

    @property
    def creates_nat(self) -> bool:
        return self.nat if self.nat is not None else not self.reuses_network


class BucketSettings(_Settings):
    """``multislice:bucket``: the regional checkpoint bucket.

    Lifecycle: objects under ``runs/`` move to Nearline after ``nearlineAfterDays`` (Orbax keeps
    rewriting the newest checkpoints, so only old ones age) and are deleted after
    ``deleteAfterDays`` when set; incomplete multipart uploads are aborted after a day. Soft
    delete is off by default because Orbax deletes superseded checkpoints all the time (GCS
    allows 0 or 7–90 days: https://cloud.google.com/storage/docs/soft-delete).
    """

    name: str | None = Field(None, description="Bucket name; default '<project>-<stack>-ckpt'.")
    force_destroy: bool = Field(False, alias="forceDestroy", description="Let `pulumi destroy` delete a non-empty bucket.")
    protect: bool | None = Field(None, description="Pulumi `protect`; default: on for stacks named prod or prod-*.")
    nearline_after_days: int | None = Field(30, ge=1, alias="nearlineAfterDays")
    delete_after_days: int | None = Field(None, ge=1, alias="deleteAfterDays")
    soft_delete_days: int = Field(0, ge=0, le=90, alias="softDeleteDays")

    @field_validator("name")
    @classmethod
    def _bucket_name(cls, value: str | None) -> str | None:
        if value is not None and (not _BUCKET.match(value) or value.startswith("goog") or "google" in value):
            raise ValueError(
                f"{value!r} is not a bucket name (3–63 lowercase letters, digits, '-', '_'; starts and ends "
                "with a letter or digit; no 'goog' prefix or 'google')"
            )
        return value

    @model_validator(mode="after")
    def _lifecycle(self) -> BucketSettings:
        if 0 < self.soft_delete_days < 7:
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


class QueuedResourceSettings(_Settings):
    """``multislice:queuedResource``: how the queued resource is requested and waited for."""

    #: States in the order a queued resource passes them (tpu_v2 QueuedResourceState).
    wait_for: Literal["ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"] = Field(
        "ACTIVE", alias="waitFor", description="`pulumi up` returns once the QR reached this state or a later one."
    )
    create_timeout: Duration = Field(
        1800, alias="createTimeout", description="Longest wait for waitFor; past it the QR stays recorded, still queued."
    )
    delete_timeout: Duration = Field(1200, alias="deleteTimeout", description="Longest wait for a delete (2–5 min typical).")
    valid_until: Duration | None = Field(
        None, alias="validUntil", description="Queueing policy valid_until_duration: the API fails the request after it."
    )

    @model_validator(mode="after")
    def _bounds(self) -> QueuedResourceSettings:
        if self.valid_until is not None and self.valid_until < 600:
            raise invalid("validUntil", f"{self.valid_until}s is shorter than 10 minutes; allow the queue time to work")
        return self


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of label key to value")
    problems = []
    for key, item in value.items():
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            problems.append(f"key {key!r} must be 1–63 lowercase letters, digits, '_' or '-', starting with a letter")
        elif key in RESERVED_LABELS:
            problems.append(f"key {key!r} is set by this program; reserved keys: {', '.join(RESERVED_LABELS)}")
        if not isinstance(item, str) or not _LABEL_VALUE.match(item):
            problems.append(f"value {item!r} of {key!r} must be a string of 0–63 lowercase letters, digits, '_' or '-'")
    if len(value) > 64 - len(RESERVED_LABELS):
        problems.append(f"at most {64 - len(RESERVED_LABELS)} labels (GCP allows 64 per resource)")
    if problems:
        raise ValueError("; ".join(problems))
    return dict(value)


def label_value(text: str) -> str:
    """``text`` as a valid GCP label value: lowercase, other characters → '-', ≤ 63 chars."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def gce_name(*parts: str, limit: int = 63) -> str:
    """A Compute Engine style name (RFC 1035, ≤ ``limit`` chars) from ``parts`` joined by '-'.

    Characters outside ``[a-z0-9-]`` become '-'. A name longer than ``limit`` is cut and
    ends with 6 hex digits of its sha256, so distinct long inputs stay distinct.
    """
    raw = "-".join(parts).lower()
    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", raw)).strip("-")
    if not name or not name[0].isalpha():
        name = "m-" + name
    if len(name) > limit:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:6]
        name = name[: limit - 7].rstrip("-") + "-" + digest
    return name


class StackConfigError(ValueError):
    """A stack file that cannot be used; ``lines`` holds one ``key path: problem`` each."""

    def __init__(self, summary: str, lines: list[str] | None = None):
        self.summary = summary
        self.lines = list(lines or [])
        text = summary if not self.lines else summary + "\n" + "\n".join(f"  {line}" for line in self.lines)
        super().__init__(text)


class StackConfig(StrictModel):
    """A validated stack. Field aliases are the stack-file keys.

    ``stack`` is the stack name (from the file name or ``pulumi.get_stack()``), not a key.
    """

    model_config = StrictModel.model_config | {"populate_by_name": True}

    stack: str
    project: str = Field(alias="gcp:project", description="GCP project id.")
    zone: str = Field(alias="gcp:zone", description="Zone of the TPU slices, e.g. us-central2-b.")
    accelerator_type: str = Field(alias="multislice:acceleratorType", description="e.g. v4-8, v5p-16, v6e-256.")
    slices: int = Field(1, ge=1, le=accelerators.MAX_SLICES, alias="multislice:slices")
    runtime_version: str | None = Field(
        None, min_length=1, alias="multislice:runtimeVersion", description="TPU software version; catalog default."
    )
    capacity: Literal["spot", "on-demand", "reserved", "best-effort"] = Field(
        "on-demand", alias="multislice:capacity"
    )
    reservation_name: str | None = Field(None, min_length=1, alias="multislice:reservationName")
    run_name: str | None = Field(
        None, alias="multislice:runName", description="Run directory name; default: stack."
    )
    training: TrainConfig = Field(TrainConfig(), alias="multislice:training")
    network: NetworkSettings = Field(NetworkSettings(), alias="multislice:network")
    bucket: BucketSettings = Field(BucketSettings(), alias="multislice:bucket")
    queued_resource: QueuedResourceSettings = Field(QueuedResourceSettings(), alias="multislice:queuedResource")
    labels: Annotated[dict[str, str], BeforeValidator(_labels)] = Field(
        default_factory=dict, alias="multislice:labels", description="Extra labels on every labelled resource."
    )

    @field_validator("stack", "run_name")
    @classmethod
    def _directory_name(cls, value: str | None) -> str | None:
        if value is not None and not _STACK.match(value):
            raise ValueError(
                f"{value!r} must start with a letter or digit and hold only letters, digits, '.', '_' "
                "and '-' (at most 100 characters): it names directories"
            )
        return value

    @field_validator("project")
    @classmethod
    def _project_id(cls, value: str) -> str:
        if not _PROJECT.match(value):
            raise ValueError(
                f"{value!r} is not a GCP project id (6–30 characters: lowercase letters, digits, hyphens; "
                "starts with a letter)"
            )
        return value

    @field_validator("zone")
    @classmethod
    def _zone_format(cls, value: str) -> str:
        if not _ZONE.match(value):
            raise ValueError(f"{value!r} is not a zone name like 'us-central2-b' (<region>-<letter>)")
        return value

    @field_validator("reservation_name")
    @classmethod
    def _reservation(cls, value: str | None) -> str | None:
        if value is not None and not (_GCE_NAME.match(value) or _RESERVATION_PATH.match(value)):
            raise ValueError(
                f"{value!r} is not a reservation name (lowercase letters, digits, hyphens) or a "
                "projects/<project>/locations/<zone>/reservations/<name> path"
            )
        return value

    @field_validator("accelerator_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        accelerators.parse_accelerator_type(value)  # UnknownAcceleratorType is a ValueError
        return value

    @model_validator(mode="after")
    def _consistent(self) -> StackConfig:
        acc = accelerators.parse_accelerator_type(self.accelerator_type)
        gen = acc.generation
        if self.slices > 1 and not gen.supports_multislice:
            raise invalid(
                "multislice:slices",
                f"Multislice needs TPU v4 or later; {self.accelerator_type} allows only 1 slice",
            )
        if self.reservation_name is not None and self.capacity != "reserved":
            raise invalid(
                "multislice:reservationName",
                f"is only used with multislice:capacity 'reserved' (capacity is {self.capacity!r})",
            )
        par = self.training.parallelism
        if par.ici.product != acc.chips:
            raise invalid(
                "multislice:training.parallelism.ici",
                f"data×fsdp×tensor = {par.ici.data}×{par.ici.fsdp}×{par.ici.tensor} = {par.ici.product} "
                f"must equal the chips per slice of {self.accelerator_type}: {acc.chips}",
            )
        if par.dcn.product != self.slices:
            raise invalid(
                "multislice:training.parallelism.dcn",
                f"data×fsdp×tensor = {par.dcn.data}×{par.dcn.fsdp}×{par.dcn.tensor} = {par.dcn.product} "
                f"must equal multislice:slices: {self.slices}",
            )
        return self

    # Derived values -------------------------------------------------------------------------

    @property
    def accelerator(self) -> accelerators.AcceleratorType:
        return accelerators.parse_accelerator_type(self.accelerator_type)

    @property
    def region(self) -> str:
        """The zone's region: ``us-central2-b`` → ``us-central2``."""
        return self.zone.rsplit("-", 1)[0]

    @property
    def effective_runtime_version(self) -> str:
        return self.runtime_version or self.accelerator.generation.default_runtime_version

    @property
    def effective_run_name(self) -> str:
        return self.run_name or self.stack

    # Names of the cloud resources (deterministic, so local tools can find them) -----------

    @property
    def resource_prefix(self) -> str:
        """``multislice-<stack>`` as a GCE name: the stem of every resource name."""
        return gce_name("multislice", self.stack, limit=40)

    @property
    def queued_resource_id(self) -> str:
        """Id of the queued resource; also the node id (1 slice) or node id prefix (slices > 1)."""
        return self.resource_prefix

    @property
    def node_ids(self) -> list[str]:
        """Node (slice) ids the QR creates: ``<prefix>-0 … <prefix>-<n-1>``, or ``<id>`` for 1 slice."""
        if self.slices == 1:
            return [self.queued_resource_id]
        return [f"{self.queued_resource_id}-{i}" for i in range(self.slices)]

    @property
    def network_tag(self) -> str:
        """Network tag on every TPU VM; the firewall rules target and admit it."""
        return f"{self.resource_prefix}-tpu"

    @property
    def bucket_name(self) -> str:
        """Checkpoint bucket: ``multislice:bucket.name`` or ``<project>-<stack>-ckpt``."""
        if self.bucket.name:
            return self.bucket.name
        return gce_name(self.project, self.stack, "ckpt", limit=63)

    @property
    def run_dir(self) -> str:
        """``gs://<bucket>/runs/<run name>``: the value of the nodes' ``multislice-run-dir`` metadata."""
        return f"gs://{self.bucket_name}/runs/{self.effective_run_name}"

    @property
    def bucket_protected(self) -> bool:
        """Pulumi ``protect`` on the bucket: ``multislice:bucket.protect``, default on for prod stacks."""
        if self.bucket.protect is not None:
            return self.bucket.protect
        return self.stack == "prod" or self.stack.startswith("prod-")

    @property
    def resource_labels(self) -> dict[str, str]:
        """Labels on every labelled resource: ``multislice:labels`` plus the reserved ones."""
        return {
            **self.labels,
            "managed-by": "pulumi",
            "multislice-stack": label_value(self.stack),
            "multislice-run": label_value(self.effective_run_name),
        }

    @property
    def workers_per_slice(self) -> int:
        return self.accelerator.hosts

    @property
    def total_workers(self) -> int:
        return self.slices * self.accelerator.hosts


# Reading -------------------------------------------------------------------------------------


def _allowed_keys() -> list[str]:
    return [f.alias for name, f in StackConfig.model_fields.items() if f.alias]


def _structured_keys() -> set[str]:
    """Keys whose value is an object (Pulumi hands these to programs as JSON text)."""
    return {
        "multislice:training",
        "multislice:network",
        "multislice:bucket",
        "multislice:queuedResource",
        "multislice:labels",
    }


def validate_stack(stack: str, config: dict[str, Any], source: str) -> StackConfig:
    """Build a StackConfig from a stack's ``config:`` map.

    Args:
      stack: the stack name.
      config: keys as written in the stack file (``"multislice:slices"``); values may be
        typed (YAML) or strings/JSON text (the Pulumi engine).
      source: where the map came from, for the error summary.

    Raises:
      StackConfigError: one line per problem, each naming the key.
    """
    values: dict[str, Any] = {}
    unknown: list[str] = []
    allowed = _allowed_keys()
    for key, value in config.items():
        namespace = key.split(":", 1)[0] if ":" in key else NAMESPACE
        full_key = key if ":" in key else f"{NAMESPACE}:{key}"
        if namespace == "gcp" and full_key not in GCP_KEYS:
            continue  # provider configuration, not ours
        if namespace not in (NAMESPACE, "gcp"):
            close = difflib.get_close_matches(namespace, [NAMESPACE, "gcp"], n=1, cutoff=0.75)
            if close:
                unknown.append(f"{key} (did you mean {close[0]}:{key.split(':', 1)[1]}?)")
            continue
        if full_key not in allowed:
            unknown.append(full_key)
            continue
        if isinstance(value, dict) and set(value) == {"secure"}:
            raise StackConfigError(
                f"stack {stack!r} ({source}) is invalid:",
                [f"{full_key}: secret values are not supported for this key; store it in plain text"],
            )
        if full_key in _structured_keys() and isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise StackConfigError(
                    f"stack {stack!r} ({source}) is invalid:", [f"{full_key}: not a JSON object ({err})"]
                ) from None
        values[full_key] = value
    lines = [
        f"{key}: unknown key; allowed keys: {', '.join(k for k in allowed if k.startswith(NAMESPACE))}"
        if "did you mean" not in key
        else f"{key.split(' ', 1)[0]}: unknown namespace {key.split(' ', 1)[1]}"
        for key in unknown
    ]
    for key in ("gcp:project", "gcp:zone", "multislice:acceleratorType"):
        if key not in values:
            lines.append(f"{key}: required key is missing")
    if lines:
        raise StackConfigError(f"stack {stack!r} ({source}) is invalid:", lines)
    try:
        return StackConfig.model_validate({"stack": stack, **values})
    except pydantic.ValidationError as err:
        raise StackConfigError(f"stack {stack!r} ({source}) is invalid:", format_errors(err)) from None


def default_stacks_dir() -> Path:
    """``stacks/`` of the project: the nearest Pulumi.yaml above the working directory that
    names this project, else the checkout this package was installed from."""
    env = os.environ.get("MULTISLICE_STACKS_DIR")
    if env:
        return Path(env)
    for parent in [Path.cwd(), *Path.cwd().parents]:
        project = parent / "Pulumi.yaml"
        if project.is_file():
            try:
                data = yaml.safe_load(project.read_text()) or {}
            except yaml.YAMLError:
                continue
            if data.get("name") == "multislice":
                return parent / str(data.get("stackConfigDir", "."))
    return Path(__file__).resolve().parents[1] / "stacks"


def stack_file(stack: str, stacks_dir: Path | None = None) -> Path:
    return (stacks_dir or default_stacks_dir()) / f"Pulumi.{stack}.yaml"


def available_stacks(stacks_dir: Path | None = None) -> list[str]:
    directory = stacks_dir or default_stacks_dir()
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in directory.glob("Pulumi.*.yaml"))


class DuplicateKeyError(yaml.YAMLError):
    """A key repeated in one YAML mapping (lines are 1-based; keys as written)."""

    def __init__(self, key: str, line: int, first_key: str, first_line: int):
        first = f"first at line {first_line}" if key == first_key else f"same as {first_key!r} at line {first_line}"
        super().__init__(f"duplicate key {key!r} at line {line} ({first})")
        self.key, self.line, self.first_key, self.first_line = key, line, first_key, first_line


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key repeated in one mapping, as Pulumi's own YAML reader
    (go-yaml v3) does; PyYAML would silently keep the last value. Keys compare as the
    Python values they load as (so ``1`` and ``true`` collide: one dict cannot hold both)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, tuple[int, str]] = {}
        key_nodes: set[int] = set()
        previous_line = 0
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            line = key_node.start_mark.line
            if line < previous_line or id(key_node) in key_nodes:
                line = value_node.start_mark.line  # an alias: its node is the anchor's, written earlier
            previous_line = line
            key_nodes.add(id(key_node))
            key = self.construct_object(key_node, deep=True)
            written = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key)
            try:
                first = seen.get(key)
            except TypeError:
                continue  # unhashable: the base constructor reports it
            if first is not None:
                raise DuplicateKeyError(written, line + 1, first[1], first[0] + 1)
            seen[key] = (line, written)
        return super().construct_mapping(node, deep=deep)


def _load_yaml(text: str, name: str) -> Any:
    loader = _UniqueKeyLoader(text)
    loader.name = name  # error marks say the file, not "<unicode string>"
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_stack_file(path: Path, stack: str | None = None) -> StackConfig:
    """Read and validate a stack file anywhere on disk.

    Args:
      path: a ``Pulumi.<stack>.yaml`` file.
      stack: stack name; by default taken from the file name.

    Raises:
      StackConfigError: missing or malformed file, or invalid keys.
    """
    path = Path(path)
    if stack is None:
        name = path.name
        stack = name[len("Pulumi.") : -len(".yaml")] if name.startswith("Pulumi.") and name.endswith(".yaml") else path.stem
    if path.is_dir():
        raise StackConfigError(f"stack file {path} is a directory, not a Pulumi.<stack>.yaml file")
    if not path.is_file():
        raise StackConfigError(f"stack file {path} does not exist")
    try:
        data = _load_yaml(path.read_text(encoding="utf-8"), str(path))
    except UnicodeDecodeError as err:
        raise StackConfigError(f"stack file {path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    except RecursionError:
        raise StackConfigError(f"stack file {path} nests too deeply to be a stack file") from None
    except DuplicateKeyError as err:
        raise StackConfigError(f"stack file {path}: {err}; keep one of them") from None
    except yaml.YAMLError as err:
        raise StackConfigError(f"stack file {path} is not valid YAML: {err}") from None
    if not isinstance(data, dict) or not isinstance(data.get("config", {}), dict):
        raise StackConfigError(f"stack file {path} must be a mapping with a 'config:' mapping inside")
    return validate_stack(stack, data.get("config") or {}, str(path))


def load_stack(stack: str, stacks_dir: Path | None = None) -> StackConfig:
    """Read and validate ``stacks/Pulumi.<stack>.yaml``.

    Raises:
      StackConfigError: the stack does not exist (the message lists those that do), or is invalid.
    """
    path = stack_file(stack, stacks_dir)
    if not path.is_file():
        known = available_stacks(stacks_dir)
        raise StackConfigError(
            f"no stack {stack!r}: {path} does not exist; stacks here: {', '.join(known) or 'none'}"
        )
    return load_stack_file(path, stack)


def from_pulumi_config(stack: str, config: dict[str, Any]) -> StackConfig:
    """Build the StackConfig from the Pulumi engine's config map (``namespace:key`` → string)."""
    return validate_stack(stack, config, "pulumi config")


def pulumi_config_map() -> dict[str, Any]:
    """The whole config map of the running Pulumi program (PULUMI_CONFIG plus explicit sets)."""
    from pulumi.runtime import config as runtime_config

    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}

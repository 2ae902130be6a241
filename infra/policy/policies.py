"""The multislice CrossGuard policies, as ``pulumi_policy`` objects: :data:`POLICIES`.

``pulumi preview --policy-pack infra/policy`` runs them through the Pulumi CLI (the pack's
``__main__.py`` builds the ``PolicyPack``); ``multislice check`` runs the same objects over the
resources the program declares under mocks (:mod:`infra.policy.evaluate`), without the CLI or
cloud credentials. A resource policy gets the resource's *inputs* (``args.props``), camelCase
as the engine has them; numbers may arrive as floats.

Each policy, its enforcement level (mandatory: a violation fails the preview/update and
``multislice check`` exits 1; advisory: printed as a warning) and its rule are listed once, in
docs/review.md, "Review workflow" (tests/cli/test_check.py checks that table against
:data:`POLICIES`). The rules' sources: Identity-Aware Proxy's TCP forwarding range
(https://cloud.google.com/iap/docs/using-tcp-forwarding), public access prevention and uniform
bucket-level access (https://cloud.google.com/storage/docs/public-access-prevention,
https://cloud.google.com/storage/docs/uniform-bucket-level-access), the Compute Engine default
service account's Editor role
(https://cloud.google.com/compute/docs/access/service-accounts#default_service_account),
Multislice's limits (https://cloud.google.com/tpu/docs/multislice-introduction), one GCE metadata
value's size (:data:`infra.startup.script.METADATA_VALUE_LIMIT_BYTES`), the release grants
(:mod:`infra.policy.release_grants`) and Spot preemption (https://cloud.google.com/tpu/docs/spot).

The compute-engine backend's resources are held to the queued resource's node rules: its instance template
(``gcp:compute/instanceTemplate:InstanceTemplate``) is what every VM of every slice is created from, so its network
interfaces (an ``accessConfigs`` entry is an external IP: pulumi-gcp's
``InstanceTemplateNetworkInterfaceArgs.access_configs``, "Access configurations, i.e. IPs via which this instance can
be accessed via the Internet"), service account, startup script, labels and Spot scheduling are checked as the queued
resource's are; its managed instance groups carry the mark of a change of backend (``backend-change``,
:mod:`infra.backends.change`). The gke backend's rules: :mod:`infra.policy.gke`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyConfigSchema,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from infra import accelerators
from infra.components.network import IAP_SSH_RANGE, SSH_PORT
from infra.naming import RUNS_PREFIX
from infra.policy import release_grants
from infra.policy.advisory import backend_change, gke_deletion_protection, prod_capacity, required_labels
from infra.policy.gke import GKE_POLICIES
from infra.policy.resource_types import (
    BUCKET_TYPE,
    DEFAULT_COMPUTE_SA_SUFFIX,
    FIREWALL_TYPE,
    INSTANCE_TEMPLATE_TYPE,
    PUBLIC_RANGES,
    QUEUED_RESOURCE_TYPE,
    REQUIRED_LABELS,
    TPU_PROGRAM_TYPES,
    Report,
    account_problem,
)
from infra.policy.value_secrets import startup_script_safe, tpu_nodes, values_carry_no_credentials
from infra.vm_contract import COMPILATION_CACHE_FOLDER, RELEASE_PREFIX

__all__ = ["POLICIES", "QUEUED_RESOURCE_TYPE", "REQUIRED_LABELS", "DEFAULT_COMPUTE_SA_SUFFIX"]

MANDATORY = EnforcementLevel.MANDATORY
ADVISORY = EnforcementLevel.ADVISORY


# Mandatory ------------------------------------------------------------------------------------


def _firewall_no_public_ingress(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != FIREWALL_TYPE:
        return
    if (args.props.get("direction") or "INGRESS").upper() != "INGRESS":
        return
    public = [r for r in args.props.get("sourceRanges") or [] if r in PUBLIC_RANGES]
    if public:
        report(
            f"firewall rule {args.name!r} admits ingress from {', '.join(public)}; "
            "open ports only to the subnetwork, network tags or IAP (35.235.240.0/20)"
        )


def _opens_ssh(allow: Mapping[str, Any]) -> bool:
    """Whether one ``allows`` entry admits TCP port 22: protocol ``tcp`` or ``all`` with no
    ports (every port), the port itself, or a ``low-high`` range holding it."""
    if str(allow.get("protocol") or "").lower() not in ("tcp", "all", "6"):
        return False
    ports = list(allow.get("ports") or [])
    if not ports:
        return True
    for port in map(str, ports):
        low, _, high = port.partition("-")
        try:
            if int(low) <= int(SSH_PORT) <= int(high or low):
                return True
        except ValueError:
            continue
    return False


def _firewall_ssh_iap_only(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != FIREWALL_TYPE or (args.props.get("direction") or "INGRESS").upper() != "INGRESS":
        return
    ranges = [str(r) for r in args.props.get("sourceRanges") or []]
    allows = list(args.props.get("allows") or [])
    if not ranges:
        return  # by network tag or service account only: no address range reaches port 22
    others = [r for r in ranges if r != IAP_SSH_RANGE]
    if others and any(_opens_ssh(a) for a in allows):
        report(
            f"firewall rule {args.name!r} admits SSH (TCP {SSH_PORT}) from {', '.join(others)}; admit SSH only "
            f"from Identity-Aware Proxy's range {IAP_SSH_RANGE} (multislice:network.iapSsh) and connect with "
            "--tunnel-through-iap"
        )
    if IAP_SSH_RANGE in ranges:
        extra = [
            a
            for a in allows
            if str(a.get("protocol") or "").lower() != "tcp" or [str(p) for p in a.get("ports") or []] != [SSH_PORT]
        ]
        if extra or not allows:
            report(
                f"firewall rule {args.name!r} admits Identity-Aware Proxy's range {IAP_SSH_RANGE} on more than "
                f"TCP port {SSH_PORT}; open only SSH to it"
            )


def _tpu_no_external_ips(args: ResourceValidationArgs, report: Report) -> None:
    if args.get_config().get("allowExternalIps", False):
        return
    for node in tpu_nodes(args):
        external = node.get("enableExternalIps")
        if external is None:
            external = (node.get("networkConfig") or {}).get("enableExternalIps")
        if args.resource_type == INSTANCE_TEMPLATE_TYPE:
            external = any(nic.get("accessConfigs") for nic in node.get("networkInterfaces") or [])
        if external:
            report(
                f"TPU resource {args.name!r} gives its VMs external IPs; use Cloud NAT, or set "
                "allowExternalIps: true for this stack in the policy pack config"
            )


def _bucket_private_uniform(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != BUCKET_TYPE:
        return
    if args.props.get("publicAccessPrevention") != "enforced":
        report(
            f"bucket {args.name!r}: publicAccessPrevention is "
            f"{args.props.get('publicAccessPrevention')!r}, must be 'enforced'"
        )
    if args.props.get("uniformBucketLevelAccess") is not True:
        report(f"bucket {args.name!r}: uniformBucketLevelAccess must be true (no per-object ACLs)")


def _service_account_email(node: Mapping[str, Any]) -> Any:
    account = node.get("serviceAccount")
    return account.get("email") if isinstance(account, Mapping) else account


def _tpu_dedicated_service_account(args: ResourceValidationArgs, report: Report) -> None:
    for node in tpu_nodes(args):
        problem = account_problem(_service_account_email(node))
        if problem:
            report(f"TPU resource {args.name!r} {problem}")


def _parallelism(args: ResourceValidationArgs) -> Mapping[str, Any]:
    return (args.props.get("trainer") or {}).get("parallelism") or {}


def _dcn_tensor_one(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != QUEUED_RESOURCE_TYPE:
        return
    dcn = _parallelism(args).get("dcn") or {}
    tensor = dcn.get("tensor", 1)
    if int(tensor) != 1:
        report(
            f"queued resource {args.name!r}: training.parallelism.dcn.tensor is {int(tensor)}; tensor "
            "parallelism over DCN is too slow (Multislice overview): keep dcn.tensor = 1"
        )


def _multislice_v4_or_later(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != QUEUED_RESOURCE_TYPE:
        return
    slices = int(args.props.get("slices") or 1)
    name = str(args.props.get("acceleratorType"))
    if slices > accelerators.MAX_SLICES:
        report(f"queued resource {args.name!r}: {slices} slices; Multislice allows at most {accelerators.MAX_SLICES}")
    if slices > 1:
        try:
            supported = accelerators.parse_accelerator_type(name).generation.supports_multislice
        except accelerators.UnknownAcceleratorType:
            supported = False
        if not supported:
            report(f"queued resource {args.name!r}: {slices} slices of {name}; Multislice needs TPU v4 or later")


def _integral(value: Any) -> Any:
    """Engine numbers are floats: 2.0 → 2, recursively (the trainer config has int fields)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):  # also pulumi_policy's proxies of the engine's inputs
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [_integral(v) for v in value]
    return value


def _runs_a_command(args: ResourceValidationArgs) -> bool:
    """The queued resource runs a stack's own command (``multislice:workload``): its ``trainer``
    input describes the command, and the bundled trainer's policies do not apply."""
    return "command" in (args.props.get("trainer") or {})


def _training_fits_hbm(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != QUEUED_RESOURCE_TYPE or args.get_config().get("allowOverHbm", False):
        return
    if _runs_a_command(args):
        return
    from infra.planner.memory import memory_per_chip
    from training.config import TrainConfig

    try:
        accelerator = accelerators.parse_accelerator_type(str(args.props.get("acceleratorType")))
        train = TrainConfig.model_validate(_integral(dict(args.props.get("trainer") or {})))
    except ValueError as err:  # UnknownAcceleratorType and pydantic's ValidationError are ValueErrors
        report(f"queued resource {args.name!r}: cannot estimate memory: {str(err).splitlines()[0]}")
        return
    estimate = memory_per_chip(train, accelerator.generation.hbm_bytes_per_chip)
    if not estimate.fits:
        report(
            f"queued resource {args.name!r}: training needs ~{estimate.total / 2**30:.1f} GiB per chip, "
            f"{accelerator.name} has {estimate.capacity / 2**30:.0f} GiB of HBM (multislice plan); "
            "shrink the model or batch, shard more (fsdp), or set allowOverHbm: true in the pack config"
        )


def _data_source_exists(args: ResourceValidationArgs, report: Report) -> None:
    if args.resource_type != QUEUED_RESOURCE_TYPE or _runs_a_command(args):
        return
    source = str(((args.props.get("trainer") or {}).get("data") or {}).get("source") or "")
    if not source.startswith("gs://"):
        return
    from infra.policy.data_source import SourceUnlistable, list_gs_source

    try:
        listing = list_gs_source(source, str(args.props.get("project") or ""))
    except SourceUnlistable:
        return  # these credentials cannot list it: unchecked here; the trainer checks on the VM
    except FileNotFoundError as err:
        report(f"multislice:training.data.source {source!r}: {err}")
        return
    if listing.non_empty == 0:
        report(
            f"multislice:training.data.source {source!r} matches no non-empty object "
            f"({listing.objects} object(s) matched); the trainer would stop at once on every VM"
        )


def _vm_cannot_write_release(args: ResourceValidationArgs, report: Report) -> None:
    for grant in release_grants.grants_of(args.resource_type, args.props):
        for member in release_grants.unconfined(grant):
            where = (
                f"bucket {grant.bucket}" + (f" (managed folder {grant.folder})" if grant.folder else "")
                if grant.bucket is not None
                else "the project (every bucket)"
            )
            how = (
                "without a condition"
                if grant.expression is None
                else f"under a condition that does not keep it out of {RELEASE_PREFIX} ({grant.expression!r})"
            )
            report(
                f"IAM grant {args.name!r} gives {member} {grant.role} on {where} {how}: the TPU VMs could write "
                f"the release record under {RELEASE_PREFIX} that every boot runs as root; confine it with "
                f'resource.name.startsWith("projects/_/buckets/<bucket>/objects/<prefix>") to the prefixes the '
                f"VMs write ({RUNS_PREFIX}, {COMPILATION_CACHE_FOLDER}/)"
            )


def _multislice_program(args: StackValidationArgs, report: Report) -> None:
    if not any(r.resource_type in TPU_PROGRAM_TYPES for r in args.resources):
        report(
            f"this stack declares none of {', '.join(TPU_PROGRAM_TYPES)}: the multislice policy pack checks the "
            "multislice program only"
        )


def _resource(
    name: str, description: str, validate, level: EnforcementLevel, **config: Any
) -> ResourceValidationPolicy:
    schema = (
        PolicyConfigSchema(properties={key: {"type": "boolean", "default": default} for key, default in config.items()})
        if config
        else None
    )
    return ResourceValidationPolicy(
        name=name, description=description, validate=validate, enforcement_level=level, config_schema=schema
    )


POLICIES = [
    _resource(
        "firewall-no-public-ingress",
        "No firewall ingress from 0.0.0.0/0 or ::/0.",
        _firewall_no_public_ingress,
        MANDATORY,
    ),
    _resource(
        "firewall-ssh-iap-only",
        "SSH ingress only from Identity-Aware Proxy's range, and that range only on TCP port 22.",
        _firewall_ssh_iap_only,
        MANDATORY,
    ),
    _resource(
        "tpu-no-external-ips",
        "TPU VMs have no external IPs unless the stack allows them.",
        _tpu_no_external_ips,
        MANDATORY,
        allowExternalIps=False,
    ),
    _resource(
        "bucket-private-uniform",
        "Buckets enforce public access prevention and uniform bucket-level access.",
        _bucket_private_uniform,
        MANDATORY,
    ),
    _resource(
        "tpu-dedicated-service-account",
        "TPU VMs run as a dedicated service account, never the default compute one.",
        _tpu_dedicated_service_account,
        MANDATORY,
    ),
    _resource(
        "dcn-tensor-parallelism-one", "No tensor parallelism over DCN (dcn.tensor = 1).", _dcn_tensor_one, MANDATORY
    ),
    _resource(
        "multislice-v4-or-later",
        "Multislice only on TPU v4 and later, at most 256 slices.",
        _multislice_v4_or_later,
        MANDATORY,
    ),
    _resource(
        "startup-script-safe",
        "The startup script fits one metadata value; neither it (in metadata or a ConfigMap) nor its release holds "
        "credentials.",
        startup_script_safe,
        MANDATORY,
    ),
    _resource(
        "values-carry-no-credentials",
        "Labels, annotations, environment variables, container images and the stack file's plain-text settings hold "
        "no credentials.",
        values_carry_no_credentials,
        MANDATORY,
    ),
    _resource(
        "training-fits-hbm",
        "The estimated per-chip training memory fits the accelerator's HBM.",
        _training_fits_hbm,
        MANDATORY,
        allowOverHbm=False,
    ),
    _resource(
        "data-source-exists",
        "A gs:// training data source matches a non-empty object (when listable).",
        _data_source_exists,
        MANDATORY,
    ),
    _resource(
        "vm-cannot-write-release",
        "The TPU VMs' service account cannot write the release record under multislice/ that every boot runs.",
        _vm_cannot_write_release,
        MANDATORY,
    ),
    StackValidationPolicy(
        name="multislice-program",
        description="The stack is a multislice program.",
        # pulumi_policy's StackValidation alias requires the urn its callbacks take as optional (Report)
        validate=_multislice_program,  # pyright: ignore[reportArgumentType]
        enforcement_level=MANDATORY,
    ),
    _resource("required-labels", "Resources carry the env, owner and cost-center labels.", required_labels, ADVISORY),
    _resource(
        "prod-capacity",
        "Prod TPU capacity (a queued resource, Spot instance templates or node pools) is not Spot, or is protected.",
        prod_capacity,
        ADVISORY,
    ),
    _resource(
        "gke-deletion-protection",
        "A prod GKE cluster is protected from deletion.",
        gke_deletion_protection,
        ADVISORY,
    ),
    _resource(
        "backend-change",
        "No managed instance group replaces the stack's queued resource (a change of multislice:backend).",
        backend_change,
        ADVISORY,
    ),
    *GKE_POLICIES,
]

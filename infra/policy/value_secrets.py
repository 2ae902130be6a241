"""No credential wherever a stack's values reach the cloud, on every backend: the policies
``startup-script-safe`` and ``values-carry-no-credentials``, and the stack file's provider settings
(:func:`provider_credentials`, which ``multislice check`` reports under the latter's name).

Where the values go (the patterns: :mod:`infra.policy.secret_patterns`):

* **the startup script and its release**, wherever the script travels: a queued resource's or a
  TPU VM's node metadata, the compute-engine backend's instance template metadata, and on the gke
  backend the startup ConfigMap (``kubernetes:core/v1:ConfigMap``, key ``startup.sh``:
  ``infra.backends.gke.jobset.STARTUP_KEY``), which every Pod's container runs. The same stack
  therefore draws the same violation on all three backends (the workload ``env`` and the data
  source travel inside the script's release);
* **labels**: every resource's ``labels`` (pulumi-gcp) and a Kubernetes object's
  ``metadata.labels`` and ``metadata.annotations``: readable by anyone who can list the resources;
* **image references**: each container ``image`` of a JobSet (``user:password@registry/…`` is
  refused by the config already: :mod:`infra.backends.gke.image_reference`);
* **provider settings**: ``gcp:accessToken`` and ``gcp:credentials`` written in the stack file in
  plain text rather than as Pulumi secrets (``pulumi config set --secret``, which stores
  ``{secure: …}``): the stack file is committed and read by every reviewer. A policy pack sees the
  provider's inputs without knowing whether they were secrets, so this part is ``multislice
  check``'s alone (:func:`provider_credentials`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pulumi_policy import ResourceValidationArgs

from infra.policy.release_contents import asset_files, embedded_release, stack_content
from infra.policy.resource_types import (
    BUCKET_OBJECT_TYPE,
    GCP_QUEUED_RESOURCE_TYPE,
    INSTANCE_TEMPLATE_TYPE,
    JOBSET_TYPE,
    QUEUED_RESOURCE_TYPE,
    TPU_VM_TYPE,
    Report,
)
from infra.policy.secret_patterns import find_secrets, find_secrets_in_files
from infra.startup.script import METADATA_VALUE_LIMIT_BYTES
from infra.vm_contract import RELEASE_PREFIX, STARTUP_SCRIPT_KEY

__all__ = [
    "CONFIG_MAP_TYPE",
    "PROVIDER_CREDENTIAL_KEYS",
    "provider_credentials",
    "startup_script_safe",
    "tpu_nodes",
    "values_carry_no_credentials",
]

#: The Kubernetes ConfigMap that carries the gke backend's startup script.
CONFIG_MAP_TYPE = "kubernetes:core/v1:ConfigMap"
#: Its key (``infra.backends.gke.jobset.STARTUP_KEY``; the policy pack does not import the backends).
CONFIG_MAP_SCRIPT_KEY = "startup.sh"
#: The stack file's provider settings that hold a credential (pulumi-gcp's provider configuration).
PROVIDER_CREDENTIAL_KEYS = ("gcp:accessToken", "gcp:credentials")


def tpu_nodes(args: ResourceValidationArgs) -> list[Mapping[str, Any]]:
    """The node-shaped inputs of a TPU resource: the multislice QR's own props, a V2Vm's, an
    instance template's, or each node spec of pulumi-gcp's queued resource."""
    if args.resource_type in (QUEUED_RESOURCE_TYPE, TPU_VM_TYPE, INSTANCE_TEMPLATE_TYPE):
        return [args.props]
    if args.resource_type == GCP_QUEUED_RESOURCE_TYPE:
        return [spec.get("node") or {} for spec in (args.props.get("tpu") or {}).get("nodeSpecs") or []]
    return []


def _scripts(args: ResourceValidationArgs) -> Iterator[tuple[str, str]]:
    """``(what, script)`` of each startup script ``args`` carries."""
    for node in tpu_nodes(args):
        script = (node.get("metadata") or {}).get(STARTUP_SCRIPT_KEY)
        if isinstance(script, str):
            yield f"TPU resource {args.name!r}", script
    if args.resource_type == CONFIG_MAP_TYPE:
        script = (args.props.get("data") or {}).get(CONFIG_MAP_SCRIPT_KEY)
        if isinstance(script, str):
            yield f"ConfigMap {args.name!r} (the gke backend's startup script)", script


def startup_script_safe(args: ResourceValidationArgs, report: Report) -> None:
    """``startup-script-safe``: a script in node metadata fits one metadata value, and no script
    (wherever it travels), nothing its release carries and no command source holds a credential."""
    for what, script in _scripts(args):
        size = len(script.encode())
        if args.resource_type != CONFIG_MAP_TYPE and size > METADATA_VALUE_LIMIT_BYTES:
            report(
                f"{what}: startup script is {size} bytes; one GCE metadata value holds at most "
                f"{METADATA_VALUE_LIMIT_BYTES}"
            )
        for found in find_secrets(script):
            report(
                f"{what}: startup script line {found.line} holds {found.kind}; the script is readable on the VM and "
                "by project viewers: use the service account"
            )
        stack_files = {path: data for path, data in embedded_release(script).items() if stack_content(path)}
        for path, found in find_secrets_in_files(stack_files):
            report(
                f"{what}: its release's {path} line {found.line} holds {found.kind}; the release is readable on the "
                "VM, in the bucket and by project viewers: pass credentials at run time"
            )
    name = str(args.props.get("name") or "") if args.resource_type == BUCKET_OBJECT_TYPE else ""
    if name.startswith(RELEASE_PREFIX) and "/sources/" in name:  # a command's source (contract.workload_source_object)
        for path, found in find_secrets_in_files(asset_files(args.props.get("source"))):
            report(
                f"bucket object {name!r} (multislice:workload.source): {path} line {found.line} holds "
                f"{found.kind}; the source is readable on the VMs and in the bucket: keep credentials out of it"
            )


def _images(value: Any) -> Iterator[str]:
    """Every container ``image`` under ``value`` (a JobSet's spec)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "image" and isinstance(item, str):
                yield item
            else:
                yield from _images(item)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for item in value:
            yield from _images(item)


def values_carry_no_credentials(args: ResourceValidationArgs, report: Report) -> None:
    """``values-carry-no-credentials``: labels, Kubernetes labels and annotations, and container
    images hold no credential (the module docstring)."""
    metadata = args.props.get("metadata")
    places = {"labels": args.props.get("labels")}
    if isinstance(metadata, Mapping) and args.resource_type.startswith("kubernetes:"):
        places |= {"metadata.labels": metadata.get("labels"), "metadata.annotations": metadata.get("annotations")}
    for where, value in places.items():
        if not isinstance(value, Mapping):
            continue
        for key in sorted(value):
            text = f"{key}={value[key]}"
            for found in find_secrets(text):
                report(
                    f"resource {args.name!r}: its {where} {key!r} holds {found.kind}; labels are readable by anyone "
                    "who can list the resource"
                )
    if args.resource_type == JOBSET_TYPE:
        for image in _images(args.props.get("spec")):
            head = image.split("/", 1)[0]
            kinds = [found.kind for found in find_secrets(image)]
            if "@" in head and ":" in head.split("@", 1)[0]:
                kinds.append("a user:password in front of the registry")
            for kind in kinds:
                report(f"JobSet {args.name!r}: a container image holds {kind}; use an image pull secret")


def provider_credentials(config_map: Mapping[str, Any]) -> list[str]:
    """The stack file's provider credentials written in plain text (one message each): a
    :data:`PROVIDER_CREDENTIAL_KEYS` value that is a string rather than a ``{secure: …}`` secret."""
    found = []
    for key in PROVIDER_CREDENTIAL_KEYS:
        value = config_map.get(key)
        if isinstance(value, str) and value.strip():
            kinds = sorted({match.kind for match in find_secrets(value)}) or ["a credential"]
            found.append(
                f"stack file: {key} holds {', '.join(kinds)} in plain text; the stack file is committed and read by "
                f"every reviewer: store it as a secret (`pulumi config set --secret {key} …`)"
            )
    return found

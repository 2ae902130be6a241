"""No credential wherever a stack's values reach the cloud, on every backend: the policies
``startup-script-safe`` and ``values-carry-no-credentials``, and the stack file itself
(:func:`stack_file_credentials`, which ``multislice check`` reports under the latter's name).

Where the values go (the patterns, and the rule for a value stored under a name that says secret:
:mod:`infra.policy.secret_patterns`):

* **the startup script and its release**, wherever the script travels: a queued resource's or a
  TPU VM's node metadata, the compute-engine backend's instance template metadata, and on the gke
  backend the startup ConfigMap (``kubernetes:core/v1:ConfigMap``, key ``startup.sh``:
  ``infra.backends.gke.jobset.STARTUP_KEY``), which every Pod's container runs. The same stack
  therefore draws the same violation on all three backends (the workload ``env`` and the data
  source travel inside the script's release; an ``env`` variable whose name says secret is named);
* **labels**: every ``labels``, ``resourceLabels`` and ``annotations`` mapping of a resource's inputs,
  at any depth (pulumi-gcp's ``labels``, a GKE cluster's ``resourceLabels``, a node pool's
  ``nodeConfig.resourceLabels``, a Kubernetes object's ``metadata.labels`` and ``metadata.annotations``,
  a Pod template's): readable by anyone who can list the resources, and copied into billing exports;
* **environment variables** in a resource's inputs: the queued resource's ``trainer.env`` and each
  container's ``env`` of a JobSet (the workload's ``env`` on the gke backend): readable by anyone
  who can read the resource, and kept in the Pulumi state;
* **image references**: each container ``image`` of a JobSet (``user:password@registry/…`` is
  refused by the config already: :mod:`infra.backends.gke.image_reference`);
* **the stack file**: ``gcp:accessToken``, ``gcp:credentials`` (the JSON of a key as text or as a
  YAML mapping; a path to the key file is fine: the provider reads "Contents of a file (or path to a
  file)"), ``gcp:externalCredentials.identityToken`` and any other value outside ``multislice:*``
  written in plain text rather than as a Pulumi secret (``pulumi config set --secret``, which stores
  ``{secure: …}``): the stack file is committed and read by every reviewer. The keys are
  pulumi-gcp's provider configuration (docs/review.md cites it). A policy pack sees the provider's
  inputs without knowing whether they were secrets, so this part is ``multislice check``'s alone.
  The ``multislice:*`` values are scanned where they land (above), and the config refuses a
  malformed one with a message that never quotes a secret (:func:`training.redaction.redacted`).

A finding names where the value is and what it looks like, never the value.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pulumi_policy import ResourceValidationArgs
from pulumi_policy.proxy import UnknownValueError

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
from infra.policy.secret_patterns import NAMED_SECRET, find_secrets, find_secrets_in_files, value_kinds
from infra.startup.script import METADATA_VALUE_LIMIT_BYTES
from infra.vm_contract import RELEASE_PREFIX, STARTUP_SCRIPT_KEY
from training.run_objects import json_record

__all__ = [
    "CONFIG_MAP_TYPE",
    "PROVIDER_CREDENTIAL_KEYS",
    "stack_file_credentials",
    "startup_script_safe",
    "tpu_nodes",
    "values_carry_no_credentials",
]

#: The Kubernetes ConfigMap that carries the gke backend's startup script.
CONFIG_MAP_TYPE = "kubernetes:core/v1:ConfigMap"
#: Its key (``infra.backends.gke.jobset.STARTUP_KEY``; the policy pack does not import the backends).
CONFIG_MAP_SCRIPT_KEY = "startup.sh"
#: The stack file's provider settings that hold a credential (pulumi-gcp's provider configuration:
#: ``accessToken``, ``credentials``, and ``externalCredentials``, whose ``identityToken`` is one).
PROVIDER_CREDENTIAL_KEYS = ("gcp:accessToken", "gcp:credentials", "gcp:externalCredentials")
#: The mappings of a resource's inputs that hold labels (at any depth).
LABEL_KEYS = ("labels", "resourceLabels", "annotations")


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


#: An ``env`` entry's line of ``workload.json`` as :mod:`infra.startup.workload` writes it (``indent=1``,
#: sorted keys: ``  "NAME": "value",`` between `` "env": {`` and `` },``; names are ``[A-Za-z_][A-Za-z0-9_]*``).
_ENV_LINE = re.compile(r'  "([A-Za-z_][A-Za-z0-9_]*)": ')


def _env_lines(spec: bytes | None) -> dict[int, tuple[str, Any]]:
    """``line → (name, value)`` of each ``env`` entry of a command's ``workload.json`` (empty when it
    is not one): a finding on such a line names the variable."""
    try:
        env = json.loads(spec or b"{}").get("env")
    except (ValueError, AttributeError):
        return {}
    if not isinstance(env, dict) or spec is None:
        return {}
    found, inside = {}, False
    for number, line in enumerate(spec.decode("utf-8", "replace").splitlines(), 1):
        if line.rstrip() == ' "env": {':
            inside = True
        elif inside and line.startswith(" }"):
            break
        elif inside and (match := _ENV_LINE.match(line)) and match[1] in env:
            found[number] = (match[1], env[match[1]])
    return found


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
        env_lines = _env_lines(stack_files.get("workload.json"))
        named = [  # a variable whose value is a secret by its name alone (a shape is found on its line below)
            ("workload.json", line, NAMED_SECRET)
            for line, (env_name, value) in sorted(env_lines.items())
            if value_kinds(env_name, value) == [NAMED_SECRET]
        ]
        for path, line, kind in [(p, f.line, f.kind) for p, f in find_secrets_in_files(stack_files)] + named:
            variable = f" (env {env_lines[line][0]})" if path == "workload.json" and line in env_lines else ""
            report(
                f"{what}: its release's {path} line {line} holds {kind}{variable}; the release is readable on the "
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
        for key, item in _known(value):
            if key == "image" and isinstance(item, str):
                yield item
            else:
                yield from _images(item)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for _, item in _known(value):
            yield from _images(item)


def _known(value: Any) -> Iterator[tuple[Any, Any]]:
    """``(key, item)`` of a mapping, or ``(index, item)`` of a sequence, leaving out each item not
    known until the update (a computed output during a preview: no stack value is one)."""
    keys = list(value) if isinstance(value, Mapping) else range(len(value))
    for key in keys:
        try:
            yield key, value[key]
        except UnknownValueError:
            continue


def _named_values(value: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str, Any]]:
    """``(where, name, value)`` of each label, annotation and environment variable under ``value``
    (a resource's inputs): :data:`LABEL_KEYS` mappings, ``env`` mappings, and ``env`` lists of
    ``{name, value}`` (a container's)."""
    if isinstance(value, Mapping):
        for key, item in _known(value):
            here = (*path, str(key))
            if key in (*LABEL_KEYS, "env") and isinstance(item, Mapping):
                yield from ((".".join(here), str(name), known) for name, known in sorted(_known(item)))
            elif key == "env" and isinstance(item, Sequence) and not isinstance(item, str):
                entries = [dict(_known(e)) for _, e in _known(item) if isinstance(e, Mapping)]
                yield from (
                    (".".join(here), str(e["name"]), e["value"]) for e in entries if {"name", "value"} <= set(e)
                )
            else:
                yield from _named_values(item, here)
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for _, item in _known(value):
            yield from _named_values(item, path)


def values_carry_no_credentials(args: ResourceValidationArgs, report: Report) -> None:
    """``values-carry-no-credentials``: labels, annotations, environment variables and container
    images hold no credential (the module docstring)."""
    for where, name, value in _named_values(args.props):
        readable = (
            "labels are readable by anyone who can list the resource"
            if where.rsplit(".", 1)[-1] in LABEL_KEYS
            else "a resource's env is readable by anyone who can read the resource: pass credentials at run time"
        )
        for kind in value_kinds(name, value):
            report(f"resource {args.name!r}: its {where} {name!r} holds {kind}; {readable}")
    if args.resource_type == JOBSET_TYPE:
        for image in _images(args.props.get("spec")):
            head = image.split("/", 1)[0]
            kinds = [found.kind for found in find_secrets(image)]
            if "@" in head and ":" in head.split("@", 1)[0]:
                kinds.append("a user:password in front of the registry")
            for kind in kinds:
                report(f"JobSet {args.name!r}: a container image holds {kind}; use an image pull secret")


def _plain_values(value: Any, path: str, name: str) -> Iterator[tuple[str, str, Any]]:
    """``(path, name, value)`` of each value under ``value`` that is not a Pulumi secret
    (``{secure: …}``); ``name`` is the key the value is stored under."""
    if isinstance(value, Mapping):
        if set(value) == {"secure"}:
            return
        for key, item in value.items():
            yield from _plain_values(item, f"{path}.{key}", str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _plain_values(item, f"{path}[{index}]", name)
    else:
        yield path, name, value


def _decoded(value: Any) -> Any:
    """A map or a list of the engine's config map (its JSON text: infra.config.pulumi_config_of_file) as
    itself, so that a finding names the key inside it; anything else as it is."""
    if isinstance(value, str) and value.lstrip().startswith(("{", "[")):
        try:
            return json_record(value.encode())
        except ValueError:
            return value
    return value


def stack_file_credentials(config_map: Mapping[str, Any]) -> list[str]:
    """The credentials a stack file holds in plain text outside ``multislice:*`` (one message each):
    a value under a key that says secret (``gcp:accessToken``, a ``private_key``, an ``identityToken``)
    or of a credential's shape, unless it is a ``{secure: …}`` secret; ``gcp:credentials`` may name
    its key file by path (the module docstring)."""
    found = []
    for key in sorted(config_map):
        if key.startswith("multislice:"):
            continue  # scanned where each value lands (the module docstring)
        for path, name, value in _plain_values(_decoded(config_map[key]), key, key.split(":", 1)[-1]):
            if path == "gcp:credentials" and isinstance(value, str) and not value.lstrip().startswith("{"):
                kinds = list(dict.fromkeys(match.kind for match in find_secrets(value)))  # a path, or a shape
            else:
                kinds = value_kinds(name, value)
            if kinds:
                command = path if path == key else f"--path {path}"
                found.append(
                    f"stack file: {path} holds {', '.join(kinds)} in plain text; the stack file is committed and "
                    f"read by every reviewer: store it as a secret (`pulumi config set --secret {command} …`)"
                )
    return found

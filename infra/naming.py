"""Names of a stack's cloud resources and the label rules, derived in one place.

Every name is a pure function of the stack name (and project, slice count or run name), so
``pulumi up``, ``multislice plan``, the local emulator and the tests all find the same
resources without asking the cloud.

One stack, one set of names: a stack name must already be spelled the way GCP names are
(:func:`check_stack_name`: lowercase letters, digits and single hyphens, at most
:data:`STACK_NAME_LIMIT` characters). Such a name goes into every derived name unchanged and
uncut (``multislice-<stack>``, ``multislice-<stack>-tpu``, ``<project>-<stack>-ckpt``), so two
distinct stacks never share a queued resource, network, service account or bucket. Names that
would have to be rewritten (``Staging``, ``qa_1``, ``prod.eu``) are refused rather than mapped:
``Staging`` and ``staging``, or ``qa_1`` and ``qa-1``, would otherwise become the same
resources. The stem of every name is :func:`resource_prefix`
(``multislice-<stack>``); a ``Network`` component, for example, creates
``multislice-dev-net``, ``multislice-dev-subnet``, ``multislice-dev-router``,
``multislice-dev-nat``, ``multislice-dev-internal`` and ``multislice-dev-iap-ssh``.

Rules and their sources:

* Compute Engine resource names (VPC, subnetwork, router, NAT, firewall, TPU node and queued
  resource ids, network tags): RFC 1035, 1–63 characters of ``[a-z0-9-]``, starting with a
  letter, not ending with '-' (https://cloud.google.com/compute/docs/naming-resources);
* service account ids: 6–30 characters, same alphabet
  (https://cloud.google.com/iam/docs/service-accounts-create#creating);
* bucket names: 3–63 characters of ``[a-z0-9_-]`` (dots would need domain verification),
  starting and ending with a letter or digit (https://cloud.google.com/storage/docs/buckets#naming);
* labels: keys 1–63 characters of ``[a-z0-9_-]`` starting with a letter, values 0–63 of
  the same, at most 64 per resource
  (https://cloud.google.com/resource-manager/docs/labels-overview#requirements).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from training.redaction import redacted

#: A Compute Engine resource name (RFC 1035).
GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
#: A Cloud Storage bucket name without dots.
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$")
LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
#: Labels GCP allows on one resource.
MAX_LABELS = 64
#: Labels this program sets on every labelled resource; ``multislice:labels`` may not set them.
RESERVED_LABELS = ("managed-by", "multislice-stack", "multislice-run")

#: Prefix of every run directory in the checkpoint bucket (``gs://<bucket>/runs/<run name>``).
RUNS_PREFIX = "runs/"
#: Longest :func:`resource_prefix`: leaves room for the suffixes of the names built on it
#: (``-iap-ssh``, ``-<slice index>``) within 63 characters.
PREFIX_LIMIT = 40
#: Longest service account id (IAM).
ACCOUNT_ID_LIMIT = 30
#: Suffixes of the names a ``Network`` component gives its resources.
NETWORK_ROLES = ("net", "subnet", "router", "nat", "internal", "iap-ssh")
#: Longest stack name: ``multislice-<stack>-tpu`` (the service account id, the tightest
#: derived name) must fit the 30 characters IAM allows without being cut.
STACK_NAME_LIMIT = ACCOUNT_ID_LIMIT - len("multislice--tpu")
#: A stack name as GCP names are spelled: lowercase letters and digits in runs joined by single
#: hyphens (RFC 1035 characters; a leading digit is fine inside ``multislice-<stack>``).
STACK_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


_SLICE_SUFFIX = re.compile(r"-([0-9]+)$")


def check_stack_name(stack: str) -> str:
    """``stack`` if every name derived from it can hold it unchanged and uncut.

    Besides the spelling, a name may not end in ``-<number>``: the nodes of a multi-slice
    queued resource are ``<id>-0``, ``<id>-1``, … (:func:`node_ids`), so the one node of stack
    ``qa-1`` would be slice 1 of stack ``qa``.

    Raises:
      ValueError: anything else, saying what is allowed (the message starts with the name).
    """
    rename = "rename the stack (pulumi stack rename) and its stacks/Pulumi.<stack>.yaml"
    if not isinstance(stack, str) or not STACK_NAME.fullmatch(stack) or len(stack) > STACK_NAME_LIMIT:
        raise ValueError(
            f"{stack!r} must start with a letter or digit and hold only lowercase letters, digits and single "
            f"'-' (at most {STACK_NAME_LIMIT} characters): it is spelled into every resource name unchanged, "
            "so that two stacks never share a queued resource, network or bucket (Staging and staging, or "
            f"qa_1 and qa-1, would); {rename}"
        )
    if match := _SLICE_SUFFIX.search(stack):
        base = stack[: match.start()]
        raise ValueError(
            f"{stack!r} must not end in '-<number>': the node of its queued resource would be named like slice "
            f"{match[1]} of stack {base!r} ({resource_prefix(stack)}); write {base + match[1]!r} instead, or {rename}"
        )
    return stack


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


def label_value(text: str) -> str:
    """``text`` as a valid GCP label value: lowercase, other characters → '-', ≤ 63 chars."""
    return re.sub(r"[^a-z0-9_-]", "-", text.lower())[:63]


def resource_prefix(stack: str) -> str:
    """``multislice-<stack>`` as a GCE name of at most :data:`PREFIX_LIMIT` characters."""
    return gce_name("multislice", stack, limit=PREFIX_LIMIT)


def queued_resource_id(stack: str) -> str:
    """Id of the stack's queued resource; also the node id (1 slice) or node id prefix."""
    return resource_prefix(stack)


def node_ids(stack: str, slices: int) -> list[str]:
    """Node (slice) ids the queued resource creates: ``<id>`` for 1 slice, else
    ``<id>-0 … <id>-<slices-1>`` (the API appends ``-<index>`` to ``node_id_prefix``)."""
    qr_id = queued_resource_id(stack)
    if slices == 1:
        return [qr_id]
    return [f"{qr_id}-{i}" for i in range(slices)]


def network_tag(stack: str) -> str:
    """Network tag on every TPU VM of the stack; the firewall rules target and admit it."""
    return f"{resource_prefix(stack)}-tpu"


def network_resource_name(stack: str, role: str) -> str:
    """Name of one resource of the stack's network: ``<prefix>-<role>``.

    Raises:
      ValueError: ``role`` is not one of :data:`NETWORK_ROLES`.
    """
    if role not in NETWORK_ROLES:
        raise ValueError(f"unknown network resource role {role!r}; known: {', '.join(NETWORK_ROLES)}")
    return gce_name(resource_prefix(stack), role)


def service_account_id(stack: str) -> str:
    """Account id of the TPU VMs' service account: ``multislice-<stack>-tpu`` (≤ 30 chars)."""
    return gce_name("multislice", stack, "tpu", limit=ACCOUNT_ID_LIMIT)


def bucket_name(project: str, stack: str, name: str | None = None) -> str:
    """The checkpoint bucket: ``name`` when given, else ``<project>-<stack>-ckpt``."""
    return name or gce_name(project, stack, "ckpt", limit=63)


def run_dir(bucket: str, run_name: str) -> str:
    """``gs://<bucket>/runs/<run name>``: the value of the nodes' ``multislice-run-dir`` metadata."""
    return f"gs://{bucket}/{RUNS_PREFIX}{run_name}"


def resource_labels(stack: str, run_name: str, extra: dict[str, str]) -> dict[str, str]:
    """Labels on every labelled resource: ``extra`` (``multislice:labels``) plus the reserved
    ones (:data:`RESERVED_LABELS`), which always win."""
    return {
        **extra,
        "managed-by": "pulumi",
        "multislice-stack": label_value(stack),
        "multislice-run": label_value(run_name),
    }


def check_labels(value: Any) -> dict[str, str]:
    """``value`` as user labels (``multislice:labels``) if it follows the label rules.

    Raises:
      ValueError: not a mapping, a bad key or value, a reserved key, or too many labels
        (one message listing every problem). A key is shown without a secret it carries
        (:func:`training.redaction.redacted`); a value is never shown: the key names it, and a label
        value may be a secret by its key alone (``db-password``).
    """
    if not isinstance(value, dict):
        raise ValueError("must be a mapping of label key to value")
    problems = []
    for key, item in value.items():
        shown = redacted(repr(key))[:80]
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            problems.append(f"key {shown} must be 1–63 lowercase letters, digits, '_' or '-', starting with a letter")
        elif key in RESERVED_LABELS:
            problems.append(f"key {shown} is set by this program; reserved keys: {', '.join(RESERVED_LABELS)}")
        if not isinstance(item, str) or not LABEL_VALUE.fullmatch(item):
            problems.append(f"the value of {shown} must be a string of 0–63 lowercase letters, digits, '_' or '-'")
    allowed = MAX_LABELS - len(RESERVED_LABELS)
    if len(value) > allowed:
        problems.append(f"at most {allowed} labels (GCP allows {MAX_LABELS} per resource)")
    if problems:
        raise ValueError("; ".join(problems))
    return dict(value)

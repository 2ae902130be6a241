"""Whether an IAM grant lets the TPU VMs write the release that every boot runs.

``boot.sh`` prefers the release record ``gs://<bucket>/multislice/<stack>/release.json`` (and
the payload and workload source it names, all under :data:`RELEASE_PREFIX`) over the release
its startup script carries, and runs it as root (docs/vm-boot.md). Only ``pulumi up`` may
write there: an identity on the VMs that can (the workload, or any dependency it installs)
would choose what every later boot runs. The policy ``vm-cannot-write-release``
(:mod:`infra.policy.policies`) refuses a grant that gives the VMs' service account a role that
writes objects on a bucket, a managed folder or the project, unless its IAM condition confines
it to objects outside :data:`RELEASE_PREFIX`.

What it reads:

* the member: ``serviceAccount:multislice-<stack>-tpu@…`` (:data:`VM_MEMBER`,
  ``infra.naming.service_account_id``), the account the program creates for the VMs (the
  policy ``tpu-dedicated-service-account`` keeps the nodes on a dedicated one);
* the role: :data:`OBJECT_WRITE_ROLES`, the predefined roles that create or delete objects or
  set the bucket's IAM policy (https://cloud.google.com/storage/docs/access-control/iam-roles;
  the basic roles Owner and Editor hold ``storage.objects.*``:
  https://cloud.google.com/iam/docs/roles-overview#basic). A custom role's permissions are
  not part of the grant, so a grant of one is not judged here;
* the condition (:func:`confines`): a disjunction (``||``) of terms, each of which must hold
  ``resource.name.startsWith("<literal>")`` (possibly among other terms joined by ``&&``) with
  a literal that no object name under :data:`RELEASE_PREFIX` can start with. The resource
  name of an object is ``projects/_/buckets/<bucket>/objects/<object>``
  (https://cloud.google.com/iam/docs/conditions-resource-attributes#resource-name). Any other
  expression (a negation, a function this module does not read) is taken as not confining.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from infra.vm_contract import RELEASE_PREFIX

__all__ = ["OBJECT_WRITE_ROLES", "VM_MEMBER", "Grant", "confines", "grants_of", "unconfined"]

#: The VMs' service account as an IAM member (``infra.naming.service_account_id``).
VM_MEMBER = re.compile(r"^serviceAccount:multislice-[a-z0-9]+(?:-[a-z0-9]+)*-tpu@[^@\s]+\.iam\.gserviceaccount\.com$")
#: Predefined roles that create or delete objects (``storage.objects.create`` /
#: ``storage.objects.delete``) or set a bucket's IAM policy (``storage.buckets.setIamPolicy``:
#: the holder can grant itself the rest).
OBJECT_WRITE_ROLES = frozenset(
    {
        "roles/storage.objectCreator",
        "roles/storage.objectUser",
        "roles/storage.objectAdmin",
        "roles/storage.folderAdmin",
        "roles/storage.admin",
        "roles/storage.legacyBucketWriter",
        "roles/storage.legacyBucketOwner",
        "roles/editor",
        "roles/owner",
    }
)

BUCKET_MEMBER_TYPE = "gcp:storage/bucketIAMMember:BucketIAMMember"
BUCKET_BINDING_TYPE = "gcp:storage/bucketIAMBinding:BucketIAMBinding"
BUCKET_POLICY_TYPE = "gcp:storage/bucketIAMPolicy:BucketIAMPolicy"
FOLDER_MEMBER_TYPE = "gcp:storage/managedFolderIamMember:ManagedFolderIamMember"
FOLDER_BINDING_TYPE = "gcp:storage/managedFolderIamBinding:ManagedFolderIamBinding"
FOLDER_POLICY_TYPE = "gcp:storage/managedFolderIamPolicy:ManagedFolderIamPolicy"
PROJECT_MEMBER_TYPE = "gcp:projects/iAMMember:IAMMember"
PROJECT_BINDING_TYPE = "gcp:projects/iAMBinding:IAMBinding"
PROJECT_POLICY_TYPE = "gcp:projects/iAMPolicy:IAMPolicy"
MEMBER_TYPES = (BUCKET_MEMBER_TYPE, FOLDER_MEMBER_TYPE, PROJECT_MEMBER_TYPE)
BINDING_TYPES = (BUCKET_BINDING_TYPE, FOLDER_BINDING_TYPE, PROJECT_BINDING_TYPE)
POLICY_TYPES = (BUCKET_POLICY_TYPE, FOLDER_POLICY_TYPE, PROJECT_POLICY_TYPE)

_OBJECTS = "projects/_/buckets/"
_STARTS_WITH = re.compile(r"""^resource\.name\.startsWith\(\s*(?:"([^"\\]*)"|'([^'\\]*)')\s*\)$""")


@dataclass(frozen=True)
class Grant:
    """One role granted to members, with its condition's expression (None: unconditional)."""

    role: str
    members: tuple[str, ...]
    expression: str | None
    #: The bucket it is granted on; None: the project (every bucket).
    bucket: str | None
    #: The managed folder it is granted on (objects under that name), if any.
    folder: str | None = None


def _expression(condition: Any) -> str | None:
    if isinstance(condition, Mapping):
        expression = condition.get("expression")
        return None if expression is None else str(expression)
    return None


def grants_of(resource_type: str, props: Mapping[str, Any]) -> Iterator[Grant]:
    """The grants an IAM resource of pulumi-gcp declares (its inputs, camelCase)."""
    bucket = str(props.get("bucket")) if resource_type.startswith("gcp:storage/") else None
    folder = str(props.get("managedFolder")) if "managedFolder" in resource_type else None
    if resource_type in MEMBER_TYPES:
        yield Grant(
            str(props.get("role")), (str(props.get("member")),), _expression(props.get("condition")), bucket, folder
        )
    elif resource_type in BINDING_TYPES:
        members = tuple(str(m) for m in props.get("members") or [])
        yield Grant(str(props.get("role")), members, _expression(props.get("condition")), bucket, folder)
    elif resource_type in POLICY_TYPES:
        try:
            policy = json.loads(str(props.get("policyData") or "{}"))
        except json.JSONDecodeError:
            return
        bindings = policy.get("bindings") if isinstance(policy, Mapping) else None
        for binding in bindings if isinstance(bindings, list) else []:
            if not isinstance(binding, Mapping):
                continue
            members = tuple(str(m) for m in binding.get("members") or [])
            yield Grant(str(binding.get("role")), members, _expression(binding.get("condition")), bucket, folder)


def _scan(expression: str) -> Iterator[tuple[int, int]]:
    """(index, parenthesis depth) of each character of ``expression`` outside string literals."""
    depth, quote, i = 0, "", 0
    while i < len(expression):
        char = expression[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "\"'":
            quote = char
        else:
            depth += {"(": 1, ")": -1}.get(char, 0)
            yield i, depth
        i += 1


def _split(expression: str, operator: str) -> list[str]:
    """``expression`` split at each top-level ``operator`` (outside quotes and parentheses)."""
    parts, start = [], 0
    for i, depth in _scan(expression):
        if depth == 0 and i >= start and expression.startswith(operator, i):
            parts.append(expression[start:i])
            start = i + len(operator)
    parts.append(expression[start:])
    return parts


def _unwrapped(expression: str) -> str:
    """``expression`` without surrounding whitespace and parentheses around the whole of it."""
    text = expression.strip()
    while text.startswith("(") and text.endswith(")"):
        closes = [i for i, depth in _scan(text) if depth == 0]
        if closes[:1] != [len(text) - 1]:  # "(a) || (b)": the first parenthesis closes earlier
            break
        text = text[1:-1].strip()
    return text


def _literal_keeps_out(literal: str, bucket: str | None) -> bool:
    """Whether no object under :data:`RELEASE_PREFIX` (of ``bucket``; of any bucket when None)
    has a resource name starting with ``literal``."""
    if not literal.startswith(_OBJECTS):
        return not _OBJECTS.startswith(literal)  # a prefix of every bucket's name covers all of them
    name, slash, rest = literal[len(_OBJECTS) :].partition("/")
    if not slash:
        return bucket is not None and not bucket.startswith(name)  # a bucket name's prefix
    if bucket is not None and name != bucket:
        return True
    release = f"objects/{RELEASE_PREFIX}"
    return not (rest.startswith(release) or release.startswith(rest))


def confines(expression: str, bucket: str | None) -> bool:
    """Whether the condition ``expression`` is false for every object under
    :data:`RELEASE_PREFIX` of ``bucket`` (None: of every bucket), as far as this module can
    read it (see the module docstring); an expression it cannot read does not confine."""
    text = _unwrapped(expression)
    alternatives = _split(text, "||")
    if len(alternatives) > 1:
        return all(confines(part, bucket) for part in alternatives)
    terms = _split(text, "&&")
    if len(terms) > 1:
        return any(confines(part, bucket) for part in terms)
    match = _STARTS_WITH.fullmatch(text)
    if match is None:
        return False
    literal = match.group(1) if match.group(1) is not None else match.group(2)
    return _literal_keeps_out(literal, bucket)


def _folder_keeps_out(folder: str | None) -> bool:
    """Whether a managed folder holds no object under :data:`RELEASE_PREFIX`."""
    if folder is None:
        return False
    return not (folder.startswith(RELEASE_PREFIX) or RELEASE_PREFIX.startswith(folder))


def unconfined(grant: Grant) -> list[str]:
    """The VM members to whom ``grant`` gives object write that reaches :data:`RELEASE_PREFIX`."""
    if grant.role not in OBJECT_WRITE_ROLES or _folder_keeps_out(grant.folder):
        return []
    if grant.expression is not None and confines(grant.expression, grant.bucket):
        return []
    return [member for member in grant.members if VM_MEMBER.fullmatch(member)]

"""The program's declared resource inputs judged by the API schema each one becomes (the discovery
documents of tests/fakes/discovery.py), as the fakes' traffic is: field names, nesting and types.

Under mocks a resource's inputs are pulumi-gcp's names (camelCase, as the engine holds them); the
provider, a bridge of terraform-provider-google, turns them into the API's request. :data:`SCHEMAS`
gives each resource type its API schema, and :data:`RENAMES` the prefixes that pulumi-gcp names or
nests differently (its ``*Args`` docstrings and terraform-provider-google's expanders, e.g.
``InstanceTemplate.disks[].sourceImage`` is ``InstanceProperties.disks[].initializeParams
.sourceImage``; ``NodePool.nodeConfig`` is ``NodePool.config``), or that are the provider's own
switches or a request's path parameters and never reach a body (``None``). ``*`` is a map's value
(``additionalProperties``). :func:`input_problems` lists every input path the schema does not have,
or whose value is not of the field's type; a map the provider turns into a list of items
(``metadata``) is judged as the field it becomes, not by its keys.
"""

from __future__ import annotations

from typing import Any

from tests.fakes import discovery

#: Resource type → (document, schema the inputs become).
SCHEMAS: dict[str, tuple[str, str]] = {
    "gcp:compute/firewall:Firewall": ("compute.v1", "Firewall"),
    "gcp:compute/instanceGroupManager:InstanceGroupManager": ("compute.v1", "InstanceGroupManager"),
    "gcp:compute/instanceTemplate:InstanceTemplate": ("compute.v1", "InstanceTemplate"),
    "gcp:compute/network:Network": ("compute.v1", "Network"),
    "gcp:compute/resizeRequest:ResizeRequest": ("compute.v1", "InstanceGroupManagerResizeRequest"),
    "gcp:compute/resourcePolicy:ResourcePolicy": ("compute.v1", "ResourcePolicy"),
    "gcp:compute/router:Router": ("compute.v1", "Router"),
    "gcp:compute/routerNat:RouterNat": ("compute.v1", "RouterNat"),
    "gcp:compute/subnetwork:Subnetwork": ("compute.v1", "Subnetwork"),
    "gcp:container/cluster:Cluster": ("container.v1", "Cluster"),
    "gcp:container/nodePool:NodePool": ("container.v1", "NodePool"),
    "gcp:storage/bucket:Bucket": ("storage.v1", "Bucket"),
    "gcp:storage/bucketIAMMember:BucketIAMMember": ("storage.v1", "Policy"),
    "gcp:storage/bucketObject:BucketObject": ("storage.v1", "Object"),
    "gcp:projects/iAMCustomRole:IAMCustomRole": ("iam.v1", "Role"),
    "gcp:projects/iAMMember:IAMMember": ("cloudresourcemanager.v1", "Policy"),
    "gcp:serviceaccount/account:Account": ("iam.v1", "ServiceAccount"),
    "gcp:serviceaccount/iAMMember:IAMMember": ("iam.v1", "Policy"),
    "gcp:projects/service:Service": ("serviceusage.v1", "GoogleApiServiceusageV1Service"),
}

#: Where the project, zone, region or parent goes: a request's path, never its body.
_PATH_PARAMETERS = ("project", "zone", "region")

#: Resource type → [(pulumi-gcp input prefix, the API's path, or None: not in the body)], longest first.
RENAMES: dict[str, list[tuple[str, str | None]]] = {
    "gcp:compute/firewall:Firewall": [
        ("allows[].protocol", "allowed[].IPProtocol"),
        ("allows[]", "allowed[]"),
    ],
    "gcp:compute/instanceGroupManager:InstanceGroupManager": [
        ("targetSizePolicies[]", "targetSizePolicy"),  # one block in pulumi-gcp, an object in the API
        ("allInstancesConfig", "allInstancesConfig.properties"),
    ],
    "gcp:compute/instanceTemplate:InstanceTemplate": [
        ("namePrefix", None),  # the provider's: it makes the name
        ("disks[].diskSizeGb", "properties.disks[].initializeParams.diskSizeGb"),
        ("disks[].diskType", "properties.disks[].initializeParams.diskType"),
        ("disks[].sourceImage", "properties.disks[].initializeParams.sourceImage"),
        ("reservationAffinity.type", "properties.reservationAffinity.consumeReservationType"),
        ("reservationAffinity.specificReservation.key", "properties.reservationAffinity.key"),
        ("reservationAffinity.specificReservation.values[]", "properties.reservationAffinity.values[]"),
        ("serviceAccount", "properties.serviceAccounts[]"),
        ("tags[]", "properties.tags.items[]"),
        ("metadata", "properties.metadata"),
        ("labels", "properties.labels"),
        ("machineType", "properties.machineType"),
        ("disks[]", "properties.disks[]"),
        ("networkInterfaces[]", "properties.networkInterfaces[]"),
        ("scheduling", "properties.scheduling"),
    ],
    "gcp:compute/network:Network": [("routingMode", "routingConfig.routingMode")],
    "gcp:compute/resizeRequest:ResizeRequest": [("instanceGroupManager", None)],
    "gcp:compute/routerNat:RouterNat": [
        ("router", None),
        ("subnetworks[].sourceIpRangesToNats[]", "subnetworks[].sourceIpRangesToNat[]"),
    ],
    "gcp:container/cluster:Cluster": [
        ("deletionProtection", None),  # the provider's guard against a destroy
        ("networkingMode", None),  # the provider's switch: ipAllocationPolicy.useIpAliases
        ("removeDefaultNodePool", None),  # the provider deletes the default pool after creating it
        ("location", None),
        ("minMasterVersion", "initialClusterVersion"),
        ("nodeLocations[]", "locations[]"),
        ("resourceLabels", "resourceLabels"),
        ("maintenancePolicy.dailyMaintenanceWindow", "maintenancePolicy.window.dailyMaintenanceWindow"),
        ("maintenancePolicy.maintenanceExclusions[].exclusionName", None),  # the map's key
        (
            "maintenancePolicy.maintenanceExclusions[].exclusionOptions",
            "maintenancePolicy.window.maintenanceExclusions.*.maintenanceExclusionOptions",
        ),
        ("maintenancePolicy.maintenanceExclusions[]", "maintenancePolicy.window.maintenanceExclusions.*"),
    ],
    "gcp:container/nodePool:NodePool": [
        ("cluster", None),
        ("location", None),
        ("nodeCount", "initialNodeCount"),
        ("nodeLocations[]", "locations[]"),
        ("nodeConfig", "config"),
    ],
    "gcp:storage/bucket:Bucket": [
        ("forceDestroy", None),  # the provider deletes the objects first
        ("lifecycleRules[].condition.matchesPrefixes[]", "lifecycle.rule[].condition.matchesPrefix[]"),
        (
            "lifecycleRules[].condition.matchesStorageClasses[]",
            "lifecycle.rule[].condition.matchesStorageClass[]",
        ),
        ("lifecycleRules[]", "lifecycle.rule[]"),
        ("publicAccessPrevention", "iamConfiguration.publicAccessPrevention"),
        ("uniformBucketLevelAccess", "iamConfiguration.uniformBucketLevelAccess.enabled"),
    ],
    "gcp:storage/bucketIAMMember:BucketIAMMember": [
        ("bucket", None),
        ("member", "bindings[].members[]"),
        ("role", "bindings[].role"),
        ("condition", "bindings[].condition"),
    ],
    "gcp:storage/bucketObject:BucketObject": [("content", None)],  # the object's bytes: a media upload
    "gcp:projects/iAMCustomRole:IAMCustomRole": [
        ("roleId", None),  # CreateRoleRequest.roleId, beside the role
        ("permissions[]", "includedPermissions[]"),
    ],
    "gcp:projects/iAMMember:IAMMember": [
        ("member", "bindings[].members[]"),
        ("role", "bindings[].role"),
        ("condition", "bindings[].condition"),
    ],
    "gcp:serviceaccount/account:Account": [("accountId", None)],  # CreateServiceAccountRequest.accountId
    "gcp:serviceaccount/iAMMember:IAMMember": [
        ("serviceAccountId", None),  # the policy's resource, in the path
        ("member", "bindings[].members[]"),
        ("role", "bindings[].role"),
    ],
    "gcp:projects/service:Service": [
        ("service", "name"),  # services/{service}: the service's name
        ("disableDependentServices", None),  # the provider's, on destroy
        ("disableOnDestroy", None),
    ],
}

#: API fields the provider builds from a map input (``{key: value}`` → ``items[{key, value}]``):
#: judged as the field, not by the map's keys.
FROM_MAPS = {
    "properties.metadata",
    "labels",
    "properties.labels",
    "resourceLabels",
    "config.labels",
    "config.resourceLabels",  # NodeConfig.resourceLabels is ResourceLabels: {"labels": {...}}
    "allInstancesConfig.properties.metadata",
}


def _leaves(value: Any, path: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [leaf for key, item in value.items() for leaf in _leaves(item, f"{path}.{key}" if path else key)]
    if isinstance(value, list) and value:
        return [leaf for item in value for leaf in _leaves(item, f"{path}[]")]
    return [(path, value)]


def api_path(typ: str, path: str) -> str | None:
    """The API's path of input ``path`` of a ``typ`` resource (None: not in the request body)."""
    if path.split(".")[0].removesuffix("[]") in _PATH_PARAMETERS and path.count(".") == 0:
        return None
    for prefix, target in RENAMES.get(typ, []):
        if path == prefix or path.startswith(prefix + ".") or path.startswith(prefix + "["):
            return None if target is None else target + path[len(prefix) :]
    return path


def _resolve(doc: discovery.Document, schema: str, path: str) -> tuple[dict[str, Any] | None, str]:
    """The property at ``path`` of ``schema`` (None and the first segment it lacks when it has none)."""
    node: dict[str, Any] = doc.schema(schema)
    for part in path.split("."):
        key, array = part.removesuffix("[]"), part.endswith("[]")
        while "$ref" in node:
            node = doc.schema(node["$ref"])
        if key == "*":
            following = node.get("additionalProperties")
        else:
            following = node.get("properties", {}).get(key)
        if following is None:
            return None, key
        node = following
        while "$ref" in node:
            node = doc.schema(node["$ref"])
        if array:
            if node.get("type") != "array":
                return None, f"{key}[] (not an array)"
            node = node["items"]
    return node, ""


def _type_problem(node: dict[str, Any], value: Any) -> str | None:
    kind, fmt = node.get("type"), node.get("format")
    if value is None or kind in (None, "any", "object") or isinstance(value, (dict, list)):
        return None
    if kind == "boolean" and not isinstance(value, bool):
        return f"expected a boolean, got {value!r}"
    if kind == "integer" or fmt in ("int32", "uint32", "int64", "uint64"):
        whole = isinstance(value, int) or isinstance(value, float) and value.is_integer()
        if isinstance(value, bool) or not whole and not (isinstance(value, str) and value.lstrip("-").isdigit()):
            return f"expected an integer, got {value!r}"
        return None
    if kind == "number" and (isinstance(value, bool) or not isinstance(value, (int, float))):
        return f"expected a number, got {value!r}"
    if kind == "string" and fmt not in ("int64", "uint64") and not isinstance(value, str):
        return f"expected a string, got {value!r}"
    return None


def input_problems(typ: str, inputs: dict[str, Any]) -> list[str]:
    """What the API schema of ``typ`` refuses in its declared ``inputs`` (empty: nothing)."""
    if typ not in SCHEMAS:
        return [f"{typ}: no API schema named for this resource type (tests/fakes/pulumi_inputs.py)"]
    api, schema = SCHEMAS[typ]
    doc = discovery.document(*api.split(".", 1))
    problems = []
    for path, value in _leaves(inputs):
        target = api_path(typ, path)
        if target is None:
            continue
        judged = next((f for f in FROM_MAPS if target == f or target.startswith(f + ".")), None)
        node, missing = _resolve(doc, schema, judged or target)
        if node is None:
            problems.append(f"{typ} {path}: {schema} has no field {missing!r} (as {target})")
        elif judged is None and (why := _type_problem(node, value)):
            problems.append(f"{typ} {path}: {why} ({schema}.{target})")
    return problems

"""A Kubernetes CRD's structural ``openAPIV3Schema`` as a judge of an object, the way the API server
reads it (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/custom-resource-definitions/,
"Specifying a structural schema" and "Field pruning"): a field the schema does not list is pruned
there, silently, so here it is an error; types, formats, enums, patterns, lengths, bounds and required
fields are checked; ``x-kubernetes-int-or-string`` takes an integer or a string.

Not checked: ``x-kubernetes-validations`` (CEL rules the API server evaluates; each test that relies
on one says so), and the root ``metadata`` (the API server's own ObjectMeta).
"""

from __future__ import annotations

import re
from typing import Any


def problems(schema: dict[str, Any], value: Any, where: str = "") -> list[str]:
    """What ``schema`` refuses in ``value`` (empty: nothing), each with its path."""
    if schema.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, (int, str)) and not isinstance(value, bool)
        return [] if ok else [f"{where}: expected an integer or a string, got {value!r}"]
    if "anyOf" in schema and "type" not in schema:
        if any(not problems(branch, value, where) for branch in schema["anyOf"]):
            return []
        return [f"{where}: matches none of {schema['anyOf']}"]
    kind = schema.get("type")
    found: list[str] = []
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {value!r}"]
        properties, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            path = f"{where}.{key}" if where else key
            if properties is not None and key in properties:
                found += problems(properties[key], item, path)
            elif isinstance(extra, dict):
                found += problems(extra, item, path)
            elif properties is not None or extra is False:
                found.append(f"{path}: unknown field (the API server would prune it)")
        found += [f"{where}: required field {key!r} missing" for key in schema.get("required", []) if key not in value]
        return found
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: expected an array, got {value!r}"]
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            found.append(f"{where}: more than {schema['maxItems']} items")
        return found + [
            p for i, item in enumerate(value) for p in problems(schema.get("items", {}), item, f"{where}[{i}]")
        ]
    if kind == "integer" and (not isinstance(value, int) or isinstance(value, bool)):
        return [f"{where}: expected an integer, got {value!r}"]
    if kind == "number" and (not isinstance(value, (int, float)) or isinstance(value, bool)):
        return [f"{where}: expected a number, got {value!r}"]
    if kind == "boolean" and not isinstance(value, bool):
        return [f"{where}: expected a boolean, got {value!r}"]
    if kind == "string" and not isinstance(value, str):
        return [f"{where}: expected a string, got {value!r}"]
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(_python_pattern(schema["pattern"]), value):
            found.append(f"{where}: {value!r} does not match {schema['pattern']!r}")
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            found.append(f"{where}: {value!r} is not {schema.get('minLength', 0)} to {schema.get('maxLength')} long")
    if isinstance(value, int) and "minimum" in schema and value < schema["minimum"]:
        found.append(f"{where}: {value} is below {schema['minimum']}")
    if schema.get("format") == "int32" and isinstance(value, int) and not -(2**31) <= value < 2**31:
        found.append(f"{where}: {value} is not an int32")
    return found


def _python_pattern(pattern: str) -> str:
    """A CRD's pattern (Go's RE2 syntax, which the API server uses) as Python's ``re`` reads it: RE2 takes an
    inline flag group anywhere (Kueue's ``^(?i)[a-z]…``), Python only at the start."""
    if pattern.startswith("^(?i)"):
        return "(?i)^" + pattern[len("^(?i)") :]
    return pattern

"""Google's discovery documents as the judge of our fakes' traffic: a request checked against the
method it calls, a response body against the method's response schema.

The documents are Google's own, shipped offline in ``google-api-python-client``
(``googleapiclient/discovery_cache/documents/<api>.<version>.json``; a development dependency, pinned
in uv.lock; docs/development.md says how to refresh it). Each names every method (its ``path`` under
``rootUrl`` + ``servicePath``, its HTTP verb, its path and query ``parameters`` with their types,
patterns and enums), the schema of its request and response bodies, and every field's type, format
and enum values (https://developers.google.com/discovery/v1/reference/apis).

:func:`check_request` finds the method a request calls (its path template, the path parameters'
``pattern``s deciding between templates that look alike, the verb) and lists what the document
refuses: an unknown method, an unknown or mistyped query parameter, a value outside an enum, a body
field the request schema does not have or of the wrong type, a required field missing.
:func:`check_response` does the same for a response body (an error body must have Google's shape:
``{"error": {"code", "message", "status"}}``, https://cloud.google.com/apis/design/errors).
No document marks a response field required, so :data:`ALWAYS_RETURNED` lists, per schema a fake
answers with, the fields Google always returns, each with its source; :func:`check_response` refuses
an answer without one of them, at any depth. What a document cannot say (state transitions, timings,
which enum value comes when) the fakes' docstrings cite from Google's pages.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
import sys
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import unquote

#: The documents the fakes are judged by: (api, version) → what serves it.
DOCUMENTS = (
    ("tpu", "v2"),
    ("compute", "v1"),
    ("container", "v1"),
    ("storage", "v1"),
    ("logging", "v2"),
    ("iamcredentials", "v1"),
)

#: The fields Google always returns in a resource of a schema, (api, schema) → fields. Sources:
#:
#: * Compute Engine: every resource carries the server-set ``kind`` (its type, e.g. "[Output Only] Type
#:   of the resource. Always compute#instance for instances"), ``id`` ("[Output Only] The unique
#:   identifier for the resource. This identifier is defined by the server."), ``name`` and ``selfLink``
#:   ("[Output Only] Server-defined URL for the resource"), and a zonal one its ``zone`` (the
#:   discovery document's descriptions; https://cloud.google.com/compute/docs/reference/rest/v1).
#:   gcloud polls an Operation through its ``name`` and ``zone`` (a zonal operation without ``zone``
#:   makes gcloud fail "Request missing required parameter zone", seen against this repository's
#:   emulated API) and reads its ``status``; ``operationType`` and ``targetLink`` name what it acts on.
#:   A group's ``ManagedInstance`` has its ``instance`` URL and its ``name``, which "always exists even
#:   if the instance has not yet been created" (the document's description of ``name``).
#: * Cloud TPU: a QueuedResource is named by its resource ``name`` (AIP-122: "All resource messages
#:   must contain a string name field"), and a long-running Operation by its ``name``
#:   (google.longrunning.Operation: "The server-assigned name, which is only unique within the same
#:   service that originally returns it"). Not a Node: a queued resource's ``nodeSpec[].node`` is a
#:   Node without its name (the spec's ``nodeId`` names it).
ALWAYS_RETURNED: dict[tuple[str, str], tuple[str, ...]] = {
    ("compute", "Operation"): ("kind", "id", "name", "zone", "selfLink", "status", "operationType", "targetLink"),
    ("compute", "Instance"): ("kind", "id", "name", "zone", "selfLink", "status"),
    ("compute", "InstanceGroupManager"): ("kind", "id", "name", "zone", "selfLink", "baseInstanceName", "targetSize"),
    ("compute", "ManagedInstance"): ("instance", "name"),
    ("tpu", "QueuedResource"): ("name",),
    ("tpu", "Operation"): ("name",),
}

#: google.rpc.Code's names (https://github.com/googleapis/googleapis/blob/master/google/rpc/code.proto),
#: the ``status`` of an error body.
RPC_CODES = frozenset(
    {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    }
)
#: Query parameters a Google client library adds that the document does not list, and the service
#: takes: tensorstore (Google's; Orbax writes checkpoints through it) appends ``&tensorstore=<nonce>``
#: to its Cloud Storage reads (the literal ``&tensorstore=`` in its compiled library), and works
#: against Cloud Storage.
CLIENT_NONCES = frozenset({("storage", "tensorstore")})
#: The response formats of the system parameter ``alt`` (https://cloud.google.com/apis/docs/system-parameters).
ALT_VALUES = frozenset({"json", "media", "proto", "sse"})
_DURATION = re.compile(r"^-?[0-9]+(\.[0-9]{1,9})?s$")
_DATETIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$")
_INT = re.compile(r"^-?[0-9]+$")


@dataclass(frozen=True)
class Method:
    """One method of a document: ``id`` (``compute.instanceGroupManagers.listManagedInstances``), its
    HTTP verb, its parameters and the ``$ref`` of its request and response schemas (None: no body)."""

    id: str
    http_method: str
    path: str
    parameters: dict[str, Any]
    request: str | None
    response: str | None
    pattern: re.Pattern[str]


@dataclass(frozen=True)
class Document:
    """One discovery document (``tpu.v2``)."""

    name: str
    version: str
    revision: str
    data: dict[str, Any]

    @property
    def label(self) -> str:
        """``tpu.v2 (revision 20261001)``."""
        return f"{self.name}.{self.version} (revision {self.revision})"

    @functools.cached_property
    def methods(self) -> list[Method]:
        """Every method of the document, with the regular expression of its full URL path."""
        found: list[Method] = []
        base = "/" + self.data.get("servicePath", "")

        def walk(resources_: dict[str, Any]) -> None:
            for resource in resources_.values():
                for method in resource.get("methods", {}).values():
                    paths = [base + method["path"]]
                    upload = method.get("mediaUpload", {}).get("protocols", {}).get("simple", {}).get("path")
                    if upload:
                        paths.append(upload)
                    if method.get("useMediaDownloadService"):  # a media download's own path (gcsfs uses it)
                        paths.append("/download" + base + method["path"])
                    for path in paths:
                        found.append(
                            Method(
                                id=method["id"],
                                http_method=method["httpMethod"],
                                path=path,
                                parameters=method.get("parameters", {}),
                                request=(method.get("request") or {}).get("$ref"),
                                response=(method.get("response") or {}).get("$ref"),
                                pattern=_template(path),
                            )
                        )
                walk(resource.get("resources", {}))

        walk(self.data.get("resources", {}))
        return found

    def schema(self, name: str) -> dict[str, Any]:
        return self.data["schemas"][name]


def _template(path: str) -> re.Pattern[str]:
    """A path template's regular expression: ``{+name}`` takes slashes, ``{name}`` one segment."""
    out, pos = [], 0
    for match in re.finditer(r"\{(\+?)([^}]+)\}", path):
        out.append(re.escape(path[pos : match.start()]))
        group = re.sub(r"\W", "_", match.group(2))
        out.append(f"(?P<{group}>.+)" if match.group(1) else f"(?P<{group}>[^/]+)")
        pos = match.end()
    out.append(re.escape(path[pos:]))
    return re.compile("^" + "".join(out) + "$")


@functools.cache
def document(name: str, version: str) -> Document:
    """Google's discovery document of API ``name`` at ``version``, from google-api-python-client.

    Raises:
      FileNotFoundError: the installed google-api-python-client ships no such document.
    """
    folder = resources.files("googleapiclient.discovery_cache").joinpath("documents")
    data = json.loads(folder.joinpath(f"{name}.{version}.json").read_text(encoding="utf-8"))
    return Document(name, version, str(data.get("revision", "?")), data)


def revisions() -> list[str]:
    """Each judging document with its revision (for the test run's header)."""
    return [document(*key).label for key in DOCUMENTS]


def find_method(doc: Document, http_method: str, path: str) -> tuple[Method | None, dict[str, str]]:
    """The method ``http_method path`` calls and its path parameters (URL-decoded); (None, {}) if
    none of the document's methods has that verb and a template that matches with its parameters'
    patterns."""
    for method in doc.methods:
        if method.http_method != http_method:
            continue
        match = method.pattern.match(path)
        if match is None:
            continue
        values = {name: unquote(value) for name, value in match.groupdict().items()}
        if all(_pattern_ok(method.parameters.get(name, {}), value) for name, value in values.items()):
            return method, values
    return None, {}


def _pattern_ok(parameter: dict[str, Any], value: str) -> bool:
    pattern = parameter.get("pattern")
    return pattern is None or re.fullmatch(pattern, value) is not None


def check_request(
    doc: Document, http_method: str, path: str, query: dict[str, list[str]], body: Any = None
) -> tuple[Method | None, list[str]]:
    """The method a request calls and what ``doc`` refuses in it (empty: nothing).

    Args:
      path: the URL's path, percent-encoded as sent (``/compute/v1/projects/p/zones/z/...``).
      query: its query parameters (``urllib.parse.parse_qs``).
      body: its JSON body, parsed (None: none).
    """
    method, _ = find_method(doc, http_method, path)
    if method is None:
        return None, [f"{doc.label} has no method {http_method} {path}"]
    problems: list[str] = []
    system = doc.data.get("parameters", {})
    for name, values in sorted(query.items()):
        if (doc.name, name) in CLIENT_NONCES:
            continue
        if name.removeprefix("$") in system or name in system:
            problems += [f"{method.id}: system parameter {name!r}: {p}" for p in _system_value(name, values)]
            continue
        parameter = method.parameters.get(name)
        if parameter is None or parameter.get("location", "query") != "query":
            problems.append(f"{method.id}: unknown query parameter {name!r}")
            continue
        if len(values) > 1 and not parameter.get("repeated"):
            problems.append(f"{method.id}: query parameter {name!r} given {len(values)} times")
        for value in values:
            problems += [f"{method.id}: query parameter {name!r}: {p}" for p in _scalar_text(parameter, value)]
    for name, parameter in method.parameters.items():
        if parameter.get("required") and parameter.get("location") == "query" and name not in query:
            problems.append(f"{method.id}: required query parameter {name!r} missing")
    if body is not None and method.request is None and body not in ({}, b"", ""):
        problems.append(f"{method.id}: takes no request body, got {_short(body)}")
    elif method.request is not None:
        problems += check_value(doc, {"$ref": method.request}, {} if body is None else body, method.request, method.id)
    return method, problems


def _system_value(name: str, values: list[str]) -> list[str]:
    """A system parameter's value: ``alt``/``$alt`` is ``json``, ``media``, ``proto`` or ``sse``, with
    options after ``;`` (Google's client libraries send ``$alt=json;enum-encoding=int``); the others
    are free text. Source: https://cloud.google.com/apis/docs/system-parameters ("``$alt``, ``alt``";
    a system parameter ``$foo`` "is sent as ``?$foo=xxx``")."""
    if name.removeprefix("$") != "alt":
        return []
    return [f"{v!r} is not json, media, proto or sse" for v in values if v.split(";")[0] not in ALT_VALUES]


def check_response(doc: Document, method: Method | None, status: int, body: Any) -> list[str]:
    """What ``doc`` refuses in a response body of ``method`` with HTTP ``status`` (an error's shape
    for a status of 400 or more)."""
    if status >= 400:
        return error_problems(status, body, rpc_status=doc.name != "storage")
    if method is None or method.response is None or body is None:
        return []
    return check_value(doc, {"$ref": method.response}, body, method.response, None)


def error_problems(status: int, body: Any, *, rpc_status: bool = True) -> list[str]:
    """What an error body lacks of Google's shape (https://cloud.google.com/apis/design/errors).
    Cloud Storage's JSON API answers the older shape, ``code``, ``message`` and ``errors`` with no
    ``status`` (https://cloud.google.com/storage/docs/json_api/v1/status-codes): ``rpc_status`` False."""
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(body) != {"error"}:
        return [f"an error answer must be {{'error': {{...}}}}, got {_short(body)}"]
    problems = [
        f"error: unknown field {k!r}" for k in sorted(set(error) - {"code", "message", "status", "errors", "details"})
    ]
    if error.get("code") != status:
        problems.append(f"error.code {error.get('code')!r} is not the HTTP status {status}")
    if not isinstance(error.get("message"), str):
        problems.append("error.message is not a string")
    if (rpc_status or "status" in error) and error.get("status") not in RPC_CODES:
        problems.append(f"error.status {error.get('status')!r} is not a google.rpc.Code name")
    return problems


def check_value(doc: Document, schema: dict[str, Any], value: Any, where: str, method_id: str | None) -> list[str]:
    """What ``doc`` refuses in ``value`` against ``schema`` (a property or ``{"$ref": name}``);
    ``method_id`` is the request's method (the ``annotations.required`` of a field), None for a response."""
    if value is None:
        return []  # "null is an accepted value for all field types" (https://protobuf.dev/programming-guides/json/)
    if "$ref" in schema:
        return check_value(doc, doc.schema(schema["$ref"]) | {"$ref_name": schema["$ref"]}, value, where, method_id)
    kind = schema.get("type")
    if kind == "any" or kind is None and "properties" not in schema:
        return []
    if kind == "object" or "properties" in schema:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {_short(value)}"]
        problems: list[str] = []
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            # Parsers "accept both the lowerCamelCase name ... and the original proto field name"
            # (https://protobuf.dev/programming-guides/json/): dry_run is dryRun.
            known = key if key in properties else _camel(key)
            if known in properties:
                problems += check_value(doc, properties[known], item, f"{where}.{key}", method_id)
            elif extra is not None:
                problems += check_value(doc, extra, item, f"{where}[{key!r}]", method_id)
            elif key == "@type" and "$ref_name" not in schema:
                continue
            else:
                problems.append(f"{where}: unknown field {key!r} (not in {schema.get('$ref_name', 'the schema')})")
        for key, prop in properties.items():
            required = prop.get("required") is True or (
                method_id is not None and method_id in prop.get("annotations", {}).get("required", [])
            )
            if required and key not in value:
                problems.append(f"{where}: required field {key!r} missing")
        if method_id is None:  # an answer: what Google always returns in it
            for key in ALWAYS_RETURNED.get((doc.name, schema.get("$ref_name", "")), ()):
                if value.get(key) in (None, ""):
                    problems.append(f"{where}: {key!r} missing (Google always returns it: discovery.ALWAYS_RETURNED)")
        return problems
    if kind == "array":
        if not isinstance(value, list):
            return [f"{where}: expected an array, got {_short(value)}"]
        return [
            p
            for i, item in enumerate(value)
            for p in check_value(doc, schema["items"], item, f"{where}[{i}]", method_id)
        ]
    return [f"{where}: {p}" for p in _scalar(schema, value)]


def _camel(name: str) -> str:
    """``dry_run`` → ``dryRun``: a proto field's JSON name."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _scalar(schema: dict[str, Any], value: Any) -> list[str]:
    kind, fmt = schema.get("type"), schema.get("format")
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"expected a boolean, got {_short(value)}"]
    if kind == "integer":
        return (
            []
            if isinstance(value, int) and not isinstance(value, bool)
            else [f"expected an integer, got {_short(value)}"]
        )
    if kind == "number":
        ok = (
            isinstance(value, (int, float)) and not isinstance(value, bool) or value in ("NaN", "Infinity", "-Infinity")
        )
        return [] if ok else [f"expected a number, got {_short(value)}"]
    if kind == "string":
        if fmt in ("int64", "uint64") and isinstance(value, int) and not isinstance(value, bool):
            return []  # proto3 JSON accepts a number for a 64-bit integer too
        if not isinstance(value, str):
            return [f"expected a string, got {_short(value)}"]
        return _scalar_text(schema, value)
    return []


def _scalar_text(schema: dict[str, Any], text: str) -> list[str]:
    """What is wrong with ``text`` as a value of a string-encoded parameter or field."""
    kind, fmt = schema.get("type", "string"), schema.get("format")
    if "enum" in schema and text not in schema["enum"]:
        return [f"{text!r} is not one of {schema['enum']}"]
    if kind == "boolean" and text not in ("true", "false"):
        return [f"{text!r} is not a boolean"]
    if (kind == "integer" or fmt in ("int64", "uint64", "int32", "uint32")) and not _INT.match(text):
        return [f"{text!r} is not an integer"]
    if fmt == "google-duration" and not _DURATION.match(text):
        return [f"{text!r} is not a duration (e.g. '3.5s')"]
    if fmt in ("google-datetime", "date-time") and not _DATETIME.match(text):
        return [f"{text!r} is not an RFC 3339 time"]
    if fmt == "byte":
        try:
            base64.b64decode(text.replace("-", "+").replace("_", "/") + "==", validate=False)
        except ValueError:
            return [f"{text!r} is not base64"]
    return []


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def vetter(
    api: str, http_method: str, path: str, query: dict[str, list[str]], body: Any
) -> tuple[int, dict[str, Any]] | None:
    """The vetter the tests give the fakes (:func:`infra.emulated.api_traffic.set_vetter`): Google's
    error for a request the document refuses (404 for a method it does not have, else 400
    INVALID_ARGUMENT, the message listing what is wrong), None for one it accepts."""
    method, problems = check_request(document(*api.split(".", 1)), http_method, path, query, body)
    if not problems:
        return None
    code, status = (404, "NOT_FOUND") if method is None else (400, "INVALID_ARGUMENT")
    return code, {"error": {"code": code, "message": "; ".join(problems), "status": status}}


def traffic_problems(exchanges: list[dict[str, Any]], *, requests: bool = True) -> list[str]:
    """What the documents refuse in recorded exchanges (:class:`infra.emulated.api_traffic.Exchange`
    as dicts): each request (unless ``requests`` is False) and each response, one line each with
    the exchange's verb and path."""
    problems: list[str] = []
    for exchange in exchanges:
        doc = document(*exchange["api"].split(".", 1))
        method, found = check_request(doc, exchange["method"], exchange["path"], exchange["query"], exchange["body"])
        found = found if requests else []
        if not exchange.get("media"):  # a media download answers an object's bytes, not the API's JSON
            found += check_response(doc, method, exchange["status"], exchange["response"])
        head = f"{exchange['method']} {exchange['path']} ({doc.label})"
        problems += [f"{head}: {p}" for p in found]
    return problems


def refuse_with(monkeypatch: Any, api: str, change: Any) -> None:
    """For the test's length, judge ``api``'s requests (``tpu.v2``) by a copy of its document that
    ``change(data)`` edits: as if Google had renamed a parameter or a field the product sends, so the
    fake refuses it in Google's error shape (the test is marked ``schema_refusals``)."""
    real = document
    name, version = api.split(".", 1)
    data: dict[str, Any] = copy.deepcopy(real(name, version).data)
    change(data)
    edited = Document(name, version, f"{real(name, version).revision}-edited", data)
    monkeypatch.setattr(
        sys.modules[__name__], "document", lambda n, v: edited if (n, v) == (name, version) else real(n, v)
    )

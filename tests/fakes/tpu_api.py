"""A loopback fake of the Cloud TPU v2 REST API, for driving the real ``google.cloud.tpu_v2``
client (REST transport) in tests.

What it serves (the paths of ``tpu_v2.services.tpu.transports.rest_base``)::

    POST   /v2/projects/*/locations/*/queuedResources?queuedResourceId=&requestId=   CreateQueuedResource
    GET    /v2/projects/*/locations/*/queuedResources                                ListQueuedResources
    GET    /v2/projects/*/locations/*/queuedResources/*                              GetQueuedResource
    DELETE /v2/projects/*/locations/*/queuedResources/*?force=                       DeleteQueuedResource
    POST   /v2/projects/*/locations/*/queuedResources/*:reset                        ResetQueuedResource
    GET    /v2/projects/*/locations/*/nodes?pageSize=&pageToken=                     ListNodes
    GET    /v2/projects/*/locations/*/nodes/*                                        GetNode
    PATCH  /v2/projects/*/locations/*/nodes/*?updateMask=                            UpdateNode
    GET    /v2/projects/*/locations/*/operations/*                                   GetOperation
    POST   /v1/projects/-/serviceAccounts/*:generateAccessToken   (IAM Credentials)  GenerateAccessToken

Every body is parsed and every response built with the client library's own message types
(``tpu_v2.QueuedResource``, ``tpu_v2.Node``, ``operations_pb2.Operation``,
``google.rpc.Status``) and ``json_format`` with unknown fields rejected, so a field name the
provider gets wrong fails here exactly as it would against the real service.

Scripting (all thread-safe; the server runs in a daemon thread on 127.0.0.1:0):

* ``progression``: the states a new queued resource passes, one per GET (default
  CREATING → ACCEPTED → WAITING_FOR_RESOURCES → PROVISIONING → ACTIVE); the last one sticks.
  End it in WAITING_FOR_RESOURCES to model a stockout.
* ``fail_after(states, active_slices, message)``: pass ``states`` then go FAILED with the first
  ``active_slices`` nodes READY and the rest never created, ``failedData.error`` = message.
* ``fault(rpc, status, ...)`` and ``flaky(rate, statuses, ...)``: injected errors
  (:mod:`tests.fakes.tpu_faults`; ``google.rpc.Status`` JSON with typed ``details``,
  :mod:`tests.fakes.rpc_errors`).
* ``op_polls``: GETs before a long-running operation reports ``done``; ``delete_polls``: GETs
  a deleted queued resource stays DELETING before it is gone. A reset puts every node of the
  queued resource in ``RESTARTING`` until its operation is done, then ``READY`` again
  (``node_restarts`` counts them); with ``op_polls=0`` it is done at once and they stay READY.
* ``preempt(qr_name)``: a Spot preemption: the nodes are PREEMPTED, the QR SUSPENDING, then
  (next GET) SUSPENDED with its nodes deleted. ``lose_node(name)``: a node deleted under an
  ACTIVE QR.
* A queued resource read back (Get, List, the create operation's response) lists one
  ``nodeSpec`` entry per node, each with its ``nodeId`` and no ``multisliceParams``, as the
  service answers (docs/cloud-tpu.md); ``expand_node_specs=False`` answers with the single
  entry that was sent instead (the request's shape, which readers accept too).
* ``page_size``: nodes per ``ListNodes`` page (default 50); ``latency``: seconds each request
  takes (slept outside the lock), so concurrent clients overlap as against the real service;
  ``max_in_flight`` is the most requests seen at once.
* ``auth``: callers, permissions and disabled APIs (:mod:`tests.fakes.tpu_auth`: 401, 403,
  SERVICE_DISABLED per quota project, self-signed service-account JWTs, impersonation).

Every request is vetted and every answer recorded (:mod:`infra.emulated.api_traffic`): the tests judge
both by Google's discovery documents (tpu v2; iamcredentials v1 for ``generateAccessToken``).

``calls`` records every request (rpc name, method, path, query, parsed body, status, the
Authorization and X-Goog-User-Project headers) so tests can assert e.g. "UpdateNode on every
node, then ResetQueuedResource, and no delete"; ``counts()`` tallies them by RPC.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from google.cloud import tpu_v2
from google.longrunning import operations_pb2
from google.protobuf import empty_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2

from infra.emulated import api_traffic
from tests.fakes.rpc_errors import ApiError, error_response, quota_failure, rate_limited, service_disabled
from tests.fakes.tpu_auth import FakeAuth
from tests.fakes.tpu_faults import FaultPlan

__all__ = ["ApiError", "Call", "FakeTpuApi", "quota_failure", "rate_limited", "service_disabled"]

DEFAULT_PROGRESSION = ("CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE")

_LOC = r"(?P<parent>projects/[^/]+/locations/[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(rf"^/v2/{_LOC}/queuedResources$"), "CreateQueuedResource"),
    ("GET", re.compile(rf"^/v2/{_LOC}/queuedResources$"), "ListQueuedResources"),
    ("GET", re.compile(rf"^/v2/{_LOC}/queuedResources/(?P<id>[^/:]+)$"), "GetQueuedResource"),
    ("DELETE", re.compile(rf"^/v2/{_LOC}/queuedResources/(?P<id>[^/:]+)$"), "DeleteQueuedResource"),
    ("POST", re.compile(rf"^/v2/{_LOC}/queuedResources/(?P<id>[^/:]+):reset$"), "ResetQueuedResource"),
    ("GET", re.compile(rf"^/v2/{_LOC}/nodes$"), "ListNodes"),
    ("GET", re.compile(rf"^/v2/{_LOC}/nodes/(?P<id>[^/:]+)$"), "GetNode"),
    ("PATCH", re.compile(rf"^/v2/{_LOC}/nodes/(?P<id>[^/:]+)$"), "UpdateNode"),
    ("GET", re.compile(rf"^/v2/{_LOC}/operations/(?P<id>[^/:]+)$"), "GetOperation"),
    (
        "POST",
        re.compile(r"^/v1/projects/-/serviceAccounts/(?P<email>[^/:]+):generateAccessToken$"),
        "GenerateAccessToken",
    ),
]

#: RPCs of the IAM Credentials API (authenticated, but not billed to a TPU quota project).
_IAM_RPCS = ("GenerateAccessToken",)


@dataclass
class Call:
    """One request the fake answered."""

    rpc: str
    method: str
    path: str
    query: dict[str, list[str]]
    body: dict[str, Any] | None
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _QueuedResourceRecord:
    qr: tpu_v2.QueuedResource
    states: list[str]
    step: int = 0
    active_slices_on_failure: int = 0
    failure_message: str = ""
    deleting_left: int | None = None
    resets: int = 0


@dataclass
class _Operation:
    op: operations_pb2.Operation
    polls_left: int
    #: Nodes that turn READY when the operation is done (a reset's restarting nodes).
    restarting: list[str] = field(default_factory=list)


def _json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(message, preserving_proto_field_name=False)


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


class FakeTpuApi:
    """The fake server. Use as a context manager; ``endpoint`` is ``http://127.0.0.1:<port>``."""

    def __init__(
        self,
        progression: tuple[str, ...] | list[str] = DEFAULT_PROGRESSION,
        *,
        op_polls: int = 1,
        delete_polls: int = 1,
        hosts_per_slice: int = 1,
        expand_node_specs: bool = True,
    ) -> None:
        self.progression = list(progression)
        self.expand_node_specs = expand_node_specs
        self.op_polls = op_polls
        self.delete_polls = delete_polls
        self.hosts_per_slice = hosts_per_slice
        self.calls: list[Call] = []
        self.queued_resources: dict[str, _QueuedResourceRecord] = {}
        self.nodes: dict[str, tpu_v2.Node] = {}
        self.operations: dict[str, _Operation] = {}
        #: Node name → times a reset restarted it.
        self.node_restarts: dict[str, int] = {}
        self.faults = FaultPlan()
        self.auth = FakeAuth()
        self._failure: tuple[list[str], int, str] | None = None
        self.page_size = 50
        self.latency = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # lifecycle --------------------------------------------------------------------------

    def start(self) -> FakeTpuApi:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as separate writes

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def _serve(self) -> None:
                fake._handle(self)

            do_GET = do_POST = do_PATCH = do_DELETE = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, name="fake-tpu-api", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeTpuApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        assert self._server is not None, "start() the fake first"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # scripting --------------------------------------------------------------------------

    def fault(
        self,
        rpc: str,
        status: str,
        message: str = "",
        *,
        details: tuple[Message, ...] = (),
        times: int = 1,
        path_contains: str = "",
    ) -> None:
        """Answer the next ``times`` calls of ``rpc`` (whose path contains ``path_contains``) with
        an error of google.rpc code ``status`` (:class:`~tests.fakes.tpu_faults.FaultPlan`)."""
        with self._lock:
            self.faults.add(rpc, status, message, details=details, times=times, path_contains=path_contains)

    def flaky(
        self, rate: float, statuses: tuple[str, ...] = ("RESOURCE_EXHAUSTED", "UNAVAILABLE"), **kwargs: Any
    ) -> None:
        """Fail a fraction ``rate`` of calls (:meth:`~tests.fakes.tpu_faults.FaultPlan.flaky`)."""
        with self._lock:
            self.faults.flaky(rate, statuses, **kwargs)

    def counts(self) -> Counter[str]:
        """Calls served per RPC."""
        with self._lock:
            return Counter(c.rpc for c in self.calls)

    def continue_with(self, qr_name: str, *states: str) -> None:
        """Let an existing queued resource move on through ``states`` (one per GET)."""
        with self._lock:
            self.queued_resources[qr_name].states.extend(states)

    def set_state(self, qr_name: str, state: str, *, active_slices: int = 0, message: str = "") -> None:
        """Force a queued resource into ``state`` now (e.g. FAILED after a preemption)."""
        with self._lock:
            record = self.queued_resources[qr_name]
            record.states = record.states[: record.step + 1] + [state]
            record.step += 1
            record.active_slices_on_failure, record.failure_message = active_slices, message
            self._set_state(record, state)

    def fail_after(self, states: list[str], active_slices: int, message: str) -> None:
        """New queued resources pass ``states``, then turn FAILED with ``active_slices`` nodes READY."""
        with self._lock:
            self._failure = (list(states), active_slices, message)

    def rpcs(self, *, include_reads: bool = True) -> list[str]:
        """Names of the RPCs served, in order (optionally without Get/List)."""
        with self._lock:
            names = [c.rpc for c in self.calls]
        if include_reads:
            return names
        return [n for n in names if not n.startswith(("Get", "List"))]

    def preempt(self, qr_name: str) -> None:
        """A Spot preemption: nodes PREEMPTED and the QR SUSPENDING now; at the next GET the QR is
        SUSPENDED and its nodes are deleted (Spot VMs cannot be restarted, only recreated)."""
        with self._lock:
            record = self.queued_resources[qr_name]
            for node in self.nodes.values():
                if node.queued_resource == qr_name:
                    node.state = "PREEMPTED"
            record.states = record.states[: record.step + 1] + ["SUSPENDING", "SUSPENDED"]
            record.step += 1
            self._set_state(record, "SUSPENDING")

    def lose_node(self, name: str) -> None:
        """Delete node ``name`` (full resource name) while its QR stays as it is."""
        with self._lock:
            del self.nodes[name]

    def recreate_node(self, name: str) -> tpu_v2.Node:
        """Cloud TPU recreates node ``name`` (full resource name) from its QR's node spec, as it
        does after a repair or a Spot slice's return: the node gets the QR's creation-time
        metadata, labels and tags, whatever ``UpdateNode`` had set on the old one (there is no
        API to change a QR's spec). Returns the new node."""
        with self._lock:
            record = self.queued_resources[self.nodes[name].queued_resource]
            del self.nodes[name]
            node_id = name.rsplit("/", 1)[1]
            index = self._node_ids(record.qr).index(node_id)
            self._materialize_nodes(record, index + 1, "READY")
            return self.nodes[name]

    def add_active(self, qr: tpu_v2.QueuedResource) -> None:
        """Seed an existing ACTIVE queued resource (with its nodes), as if created earlier."""
        with self._lock:
            if self.expand_node_specs:
                self._expand(qr)
            record = _QueuedResourceRecord(qr=qr, states=["ACTIVE"])
            qr.state = tpu_v2.QueuedResourceState(state="ACTIVE")
            self.queued_resources[qr.name] = record
            self._materialize_nodes(record, len(self._node_ids(qr)), "READY")

    # request handling -------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        url = urlsplit(handler.path)
        query = parse_qs(url.query)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        body = json.loads(raw) if raw else None
        rpc, match = "Unknown", None
        for method, pattern, name in _ROUTES:
            if handler.command == method and (match := pattern.match(url.path)):
                rpc = name
                break
        headers = {
            k.lower(): v for k, v in handler.headers.items() if k.lower() in ("authorization", "x-goog-user-project")
        }
        call = Call(rpc=rpc, method=handler.command, path=url.path, query=query, body=body, headers=headers)
        api = "iamcredentials.v1" if url.path.startswith("/v1/") else "tpu.v2"
        refusal = api_traffic.vet(api, handler.command, url.path, query, body)
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.latency:
                time.sleep(self.latency)
            with self._lock:
                self.calls.append(call)
                try:
                    if refusal is not None:
                        raise ApiError(refusal[1]["error"]["status"], refusal[1]["error"]["message"])
                    if match is None:
                        raise ApiError("NOT_FOUND", f"no route for {handler.command} {url.path}")
                    identity = self.auth.authenticate(headers)
                    if rpc not in _IAM_RPCS:
                        self.auth.authorize(rpc, identity, headers)
                    self.faults.inject(rpc, url.path)
                    if rpc == "GenerateAccessToken":
                        status, payload = 200, self.auth.generate_access_token(match["email"])
                    else:
                        status, payload = 200, getattr(self, f"_rpc_{rpc}")(match, query, raw)
                except ApiError as err:
                    status, payload = error_response(err)
                except json_format.ParseError as err:  # the client sent a field the API does not have
                    status, payload = error_response(ApiError("INVALID_ARGUMENT", f"Invalid JSON payload: {err}"))
                call.status = status
        finally:
            with self._lock:
                self.in_flight -= 1
        api_traffic.record(api_traffic.Exchange(api, handler.command, url.path, query, body, status, payload))
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json; charset=UTF-8")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _operation(self, parent: str, verb: str, target: str, response: Message | None) -> dict[str, Any]:
        name = f"{parent}/operations/operation-{next(self._ids)}"
        meta = tpu_v2.OperationMetadata(verb=verb, target=target, api_version="v2")
        op = operations_pb2.Operation(name=name, done=self.op_polls <= 0)
        op.metadata.Pack(tpu_v2.OperationMetadata.pb(meta))
        op.response.Pack(response if response is not None else empty_pb2.Empty())
        self.operations[name] = _Operation(op=op, polls_left=self.op_polls)
        return _json(op)

    # queued resources ---------------------------------------------------------------------

    @staticmethod
    def _node_specs(qr: tpu_v2.QueuedResource) -> list[tuple[str, tpu_v2.QueuedResource.Tpu.NodeSpec]]:
        """``(node id, the entry that specifies it)`` for every node of ``qr``, in node order, from
        either shape: an entry with ``multisliceParams`` stands for ``nodeCount`` nodes
        ``<prefix>-0…``; an entry with a ``nodeId`` for that one node."""
        specs = []
        for spec in qr.tpu.node_spec:
            if "multislice_params" in spec:
                params = spec.multislice_params
                prefix = params.node_id_prefix or qr.name.rsplit("/", 1)[1]
                specs += [(f"{prefix}-{i}", spec) for i in range(params.node_count)]
            else:
                specs.append((spec.node_id, spec))
        return specs

    @classmethod
    def _node_ids(cls, qr: tpu_v2.QueuedResource) -> list[str]:
        return [node_id for node_id, _spec in cls._node_specs(qr)]

    @classmethod
    def _expand(cls, qr: tpu_v2.QueuedResource) -> None:
        """List one ``nodeSpec`` entry per node, as the service answers a multislice queued
        resource (docs/cloud-tpu.md, "A multislice queued resource read back"): each entry has
        the request's ``parent`` and ``node`` and the node's own ``nodeId``, and no
        ``multisliceParams``."""
        entries = [
            tpu_v2.QueuedResource.Tpu.NodeSpec(
                parent=spec.parent, node_id=node_id, node=tpu_v2.Node.wrap(tpu_v2.Node.pb(spec.node).__deepcopy__())
            )
            for node_id, spec in cls._node_specs(qr)
        ]
        qr.tpu = tpu_v2.QueuedResource.Tpu(node_spec=entries)

    def _materialize_nodes(self, record: _QueuedResourceRecord, count: int, state: str) -> None:
        qr = record.qr
        for index, (node_id, spec) in enumerate(self._node_specs(qr)[:count]):
            name = f"{spec.parent}/nodes/{node_id}"
            if name in self.nodes:
                continue
            node = tpu_v2.Node.wrap(tpu_v2.Node.pb(spec.node).__deepcopy__())
            node.name = name
            node.state = state
            node.health = "HEALTHY"
            node.queued_resource = qr.name
            node.multislice_node = len(self._node_ids(qr)) > 1
            node.create_time = _now()
            for host in range(self.hosts_per_slice):
                node.network_endpoints.append(
                    tpu_v2.NetworkEndpoint(ip_address=f"10.130.{index}.{host + 2}", port=8470)
                )
            self.nodes[name] = node

    def _set_state(self, record: _QueuedResourceRecord, state: str) -> None:
        qr = record.qr
        qr.state = tpu_v2.QueuedResourceState(state=state)
        if state == "ACTIVE":
            self._materialize_nodes(record, len(self._node_ids(qr)), "READY")
        elif state == "SUSPENDED":
            for name in [n for n, node in self.nodes.items() if node.queued_resource == qr.name]:
                del self.nodes[name]
        elif state == "FAILED":
            self._materialize_nodes(record, record.active_slices_on_failure, "READY")
            qr.state = tpu_v2.QueuedResourceState(
                state="FAILED",
                failed_data=tpu_v2.QueuedResourceState.FailedData(
                    error=status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=record.failure_message)
                ),
            )

    def _rpc_CreateQueuedResource(
        self, match: re.Match[str], query: dict[str, list[str]], raw: bytes
    ) -> dict[str, Any]:
        parent = match["parent"]
        qr_id = (query.get("queuedResourceId") or [""])[0]
        if not qr_id:
            raise ApiError("INVALID_ARGUMENT", "queued_resource_id is required")
        qr = tpu_v2.QueuedResource.from_json(raw, ignore_unknown_fields=False)
        name = f"{parent}/queuedResources/{qr_id}"
        if name in self.queued_resources:
            raise ApiError("ALREADY_EXISTS", f"QueuedResource {name} already exists")
        if len(qr.tpu.node_spec) != 1:
            raise ApiError("INVALID_ARGUMENT", "exactly one node_spec is supported")
        spec = qr.tpu.node_spec[0]
        if "multislice_params" in spec and spec.multislice_params.node_count <= 1:
            raise ApiError("INVALID_ARGUMENT", "multislice_params.node_count must be > 1")
        if "multislice_params" not in spec and not spec.node_id:
            raise ApiError("INVALID_ARGUMENT", "node_id or multislice_params is required")
        qr.name = name
        qr.create_time = _now()
        if self.expand_node_specs:
            self._expand(qr)
        if self._failure is not None:
            states, active, message = self._failure
            record = _QueuedResourceRecord(
                qr=qr, states=[*states, "FAILED"], active_slices_on_failure=active, failure_message=message
            )
        else:
            record = _QueuedResourceRecord(qr=qr, states=list(self.progression))
        self.queued_resources[name] = record
        self._set_state(record, record.states[0])
        return self._operation(parent, "create", name, tpu_v2.QueuedResource.pb(qr))

    def _rpc_ListQueuedResources(self, match: re.Match[str], query: dict[str, list[str]], raw: bytes) -> dict[str, Any]:
        prefix = match["parent"] + "/queuedResources/"
        items = [r.qr for n, r in sorted(self.queued_resources.items()) if n.startswith(prefix)]
        return _json(tpu_v2.ListQueuedResourcesResponse.pb(tpu_v2.ListQueuedResourcesResponse(queued_resources=items)))

    def _record(self, match: re.Match[str]) -> _QueuedResourceRecord:
        name = f"{match['parent']}/queuedResources/{match['id']}"
        record = self.queued_resources.get(name)
        if record is None:
            raise ApiError("NOT_FOUND", f"Resource '{name}' was not found")
        return record

    def _rpc_GetQueuedResource(self, match: re.Match[str], query: dict[str, list[str]], raw: bytes) -> dict[str, Any]:
        record = self._record(match)
        if record.deleting_left is not None:
            if record.deleting_left <= 0:
                self._forget(record)
                raise ApiError("NOT_FOUND", f"Resource '{record.qr.name}' was not found")
            record.deleting_left -= 1
        elif record.step < len(record.states) - 1:
            record.step += 1
            self._set_state(record, record.states[record.step])
        return _json(tpu_v2.QueuedResource.pb(record.qr))

    def _forget(self, record: _QueuedResourceRecord) -> None:
        del self.queued_resources[record.qr.name]
        for name in [n for n, node in self.nodes.items() if node.queued_resource == record.qr.name]:
            del self.nodes[name]

    def _rpc_DeleteQueuedResource(
        self, match: re.Match[str], query: dict[str, list[str]], raw: bytes
    ) -> dict[str, Any]:
        record = self._record(match)
        force = (query.get("force") or ["false"])[0].lower() == "true"
        has_nodes = any(node.queued_resource == record.qr.name for node in self.nodes.values())
        if has_nodes and not force:
            raise ApiError("FAILED_PRECONDITION", "the queued resource has nodes; delete them first or use force")
        if record.deleting_left is None:
            record.deleting_left = self.delete_polls
            record.qr.state = tpu_v2.QueuedResourceState(state="DELETING")
            if self.delete_polls <= 0:
                self._forget(record)
        return self._operation(match["parent"], "delete", record.qr.name, None)

    def _rpc_ResetQueuedResource(self, match: re.Match[str], query: dict[str, list[str]], raw: bytes) -> dict[str, Any]:
        record = self._record(match)
        json_format.Parse(raw or b"{}", tpu_v2.ResetQueuedResourceRequest.pb(tpu_v2.ResetQueuedResourceRequest()))
        if record.qr.state.state != tpu_v2.QueuedResourceState.State.ACTIVE:
            raise ApiError(
                "FAILED_PRECONDITION", f"cannot reset a queued resource in state {record.qr.state.state.name}"
            )
        record.resets += 1
        answer = self._operation(match["parent"], "reset", record.qr.name, tpu_v2.QueuedResource.pb(record.qr))
        # Every VM reboots: its node is RESTARTING until the operation is done, then READY.
        restarting = [name for name, node in self.nodes.items() if node.queued_resource == record.qr.name]
        for name in restarting:
            self.node_restarts[name] = self.node_restarts.get(name, 0) + 1
        entry = self.operations[answer["name"]]
        if entry.op.done:
            return answer
        for name in restarting:
            self.nodes[name].state = "RESTARTING"
        entry.restarting = restarting
        return answer

    # nodes ----------------------------------------------------------------------------------

    def _node(self, match: re.Match[str]) -> tpu_v2.Node:
        name = f"{match['parent']}/nodes/{match['id']}"
        node = self.nodes.get(name)
        if node is None:
            raise ApiError("NOT_FOUND", f"Resource '{name}' was not found")
        return node

    def _rpc_ListNodes(self, match: re.Match[str], query: dict[str, list[str]], raw: bytes) -> dict[str, Any]:
        prefix = match["parent"] + "/nodes/"
        names = sorted(n for n in self.nodes if n.startswith(prefix))
        size = int((query.get("pageSize") or [0])[0]) or self.page_size
        start = int((query.get("pageToken") or ["0"])[0] or 0)
        page = [self.nodes[n] for n in names[start : start + size]]
        token = str(start + size) if start + size < len(names) else ""
        return _json(tpu_v2.ListNodesResponse.pb(tpu_v2.ListNodesResponse(nodes=page, next_page_token=token)))

    def _rpc_GetNode(self, match: re.Match[str], query: dict[str, list[str]], raw: bytes) -> dict[str, Any]:
        return _json(tpu_v2.Node.pb(self._node(match)))

    #: UpdateNode's update_mask paths (tpu_v2 UpdateNodeRequest docs).
    UPDATABLE = ("description", "tags", "labels", "metadata", "network_config.enable_external_ips")

    def _rpc_UpdateNode(self, match: re.Match[str], query: dict[str, list[str]], raw: bytes) -> dict[str, Any]:
        node = self._node(match)
        mask = [p for item in query.get("updateMask", []) for p in item.split(",") if p]
        if not mask:
            raise ApiError("INVALID_ARGUMENT", "update_mask is required")
        patch = tpu_v2.Node.from_json(raw, ignore_unknown_fields=False)
        for path in mask:
            snake = re.sub(r"([A-Z])", lambda m: "_" + m[1].lower(), path)
            if snake not in self.UPDATABLE:
                raise ApiError("INVALID_ARGUMENT", f"update_mask path {path!r} is not updatable")
            if snake == "network_config.enable_external_ips":
                node.network_config.enable_external_ips = patch.network_config.enable_external_ips
            elif snake in ("labels", "metadata"):
                target = getattr(node, snake)
                target.clear()
                target.update(dict(getattr(patch, snake)))
            elif snake == "tags":
                del node.tags[:]
                node.tags.extend(patch.tags)
            else:
                setattr(node, snake, getattr(patch, snake))
        return self._operation(match["parent"], "update", node.name, tpu_v2.Node.pb(node))

    # operations -----------------------------------------------------------------------------

    def _rpc_GetOperation(self, match: re.Match[str], query: dict[str, list[str]], raw: bytes) -> dict[str, Any]:
        name = f"{match['parent']}/operations/{match['id']}"
        entry = self.operations.get(name)
        if entry is None:
            raise ApiError("NOT_FOUND", f"Operation '{name}' was not found")
        entry.polls_left -= 1
        if entry.polls_left <= 0:
            entry.op.done = True
            for node in entry.restarting:
                if node in self.nodes:
                    self.nodes[node].state = "READY"
            entry.restarting = []
        return _json(entry.op)

    # views for assertions -----------------------------------------------------------------

    def resets(self, qr_name: str) -> int:
        with self._lock:
            record = self.queued_resources.get(qr_name)
            return record.resets if record else 0

    def node(self, name: str) -> tpu_v2.Node:
        with self._lock:
            return self.nodes[name]

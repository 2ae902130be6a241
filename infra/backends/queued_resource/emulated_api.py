"""deleteOnComplete and reset in the local emulation: a loopback Cloud TPU API that serves the
call the VMs make (delete) and the one ``multislice local reset`` makes (reset), and what the
emulated queued resource does for each.

On Cloud TPU, once the run is complete, worker 0 of slice 0 deletes the queued resource named
by its metadata attribute ``multislice-delete-queued-resource`` (``infra/startup/delete_on_complete.sh``,
docs/deploying.md) with the VM's service-account token. The emulation does the same:

* the VMs get the attribute exactly as ``pulumi up`` sets it
  (:func:`infra.vm_contract.delete_on_complete_metadata`: only with
  ``multislice:queuedResource.deleteOnComplete``), the token from their emulated metadata
  server (:data:`infra.emulated.metadata.EMULATED_TOKEN`), and ``MULTISLICE_TPU_API_ENDPOINT``
  pointing at :class:`EmulatedTpuApi` on 127.0.0.1 (always: an emulated VM never reaches
  Google's API);
* :class:`EmulatedTpuApi` answers ``DELETE /v2/projects/P/locations/Z/queuedResources/ID?force=true``
  (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/delete)
  with a long-running ``Operation``
  (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.operations#Operation,
  its ``metadata`` an ``OperationMetadata``), done at once: the emulated queued resource is
  deleted when the answer is sent. Refusals are ``google.rpc.Status`` JSON with the HTTP code of
  its status (https://cloud.google.com/apis/design/errors#http_mapping): another method of the API
  than these two 501 ``UNIMPLEMENTED``; a delete of anything but the stack's queued resource, or of
  one already deleted, 404 ``NOT_FOUND``; a missing or
  wrong bearer token 401 ``UNAUTHENTICATED``; with deleteOnComplete off 403
  ``PERMISSION_DENIED`` (the VMs' service account then has no ``tpu.nodes.delete``); without
  ``force=true`` 400 ``FAILED_PRECONDITION`` (the reference: without force the queued resource
  is deleted only once its nodes are, and the emulated one has running VMs);
* it also answers ``POST /v2/projects/P/locations/Z/queuedResources/ID:reset``
  (https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.queuedResources/reset)
  with an ``Operation`` done at once whose response is the ``QueuedResource`` (its name and
  state ``ACTIVE``), for the stack's queued resource while it is not deleted (else 404, a wrong
  token 401); the emulator then restarts every VM (``Repairs.reset`` of :mod:`infra.local.repairs`), as the
  reset reboots every VM of a queued resource and their startup scripts run again;
* every request is vetted and every answer recorded (:mod:`infra.emulated.api_traffic`): the tests judge
  both by Google's discovery document of the Cloud TPU API v2 (a request it refuses, such as a
  method the API does not have, is answered with the vetter's error);
* :class:`DeleteOnComplete` records the deletion in the stack's state (``deleted.json``,
  :func:`infra.emulated.state.record_deletion`; ``multislice local status`` reports ``DELETED``)
  and tells the emulator to stop the VMs still running :data:`infra.local.options.NODE_DELETE_DELAY_S` after it
  (the force delete deletes the nodes). ``local up``'s summary says ``capacity``:
  ``deleted`` (the queued resource was deleted on completion) or ``kept`` (it was not:
  deleteOnComplete off; on Cloud TPU it stays, and is billed, until ``pulumi destroy``).
"""

from __future__ import annotations

import http.server
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlsplit

from infra.backends.interface import DELETED, KEPT
from infra.config import StackConfig
from infra.emulated.kit import (
    EMULATED_TOKEN,
    EmulatedVM,
    LocalPaths,
    LoopbackServer,
    api_traffic,
    forget_deletion,
    record_deletion,
    stop_groups,
)
from infra.vm_contract import DELETE_QUEUED_RESOURCE_KEY, TPU_API_ENDPOINT_ENV, delete_on_complete_metadata

#: ``/v2/<queued resource name>``, the path of queuedResources.delete.
DELETE_PATH = re.compile(r"^/v2/(?P<name>projects/[^/]+/locations/[^/]+/queuedResources/[^/:]+)$")
#: ``/v2/<queued resource name>:reset``, the path of queuedResources.reset.
RESET_PATH = re.compile(r"^/v2/(?P<name>projects/[^/]+/locations/[^/]+/queuedResources/[^/:]+):reset$")
#: Seconds between SIGTERM and SIGKILL for those VMs.
STOP_GRACE_S = 5.0
_HTTP = {
    "FAILED_PRECONDITION": 400,
    "UNAUTHENTICATED": 401,
    "PERMISSION_DENIED": 403,
    "NOT_FOUND": 404,
    "UNIMPLEMENTED": 501,
}
#: The API this serves, as its discovery document is named (:mod:`infra.emulated.api_traffic`).
API = "tpu.v2"


def _rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


#: The sender in the ``User-Agent`` of delete_on_complete.sh's DELETE (``… slice/1 worker/0``).
_SENDER = re.compile(r"\bslice/([0-9]+)\b")


class EmulatedTpuApi:
    """Serve ``DELETE`` and ``:reset`` of one queued resource (see the module docstring) until
    :meth:`stop`.

    Args:
      queued_resource: its resource name, ``projects/P/locations/Z/queuedResources/ID``; None:
        no delete is permitted (deleteOnComplete off: 403 for every well-formed request).
      on_delete: called with the name once the delete is accepted, before the answer is sent
        (in the server's thread).
      token: the bearer token a request must carry.
      resettable: the resource name a reset may name (None: ``queued_resource``; no reset is
        served when both are None).
      on_reset: called with the name once a reset is accepted, before the answer is sent.
    """

    def __init__(
        self,
        queued_resource: str | None,
        on_delete: Callable[[str], None] = lambda name: None,
        token: str = EMULATED_TOKEN,
        *,
        resettable: str | None = None,
        on_reset: Callable[[str], None] = lambda name: None,
    ) -> None:
        self.queued_resource = queued_resource
        self._on_delete = on_delete
        self._token = token
        self.resettable = resettable or queued_resource
        self._on_reset = on_reset
        #: ``time.monotonic()`` when the delete was accepted; None while it exists.
        self.deleted_at: float | None = None
        #: The slice whose VM sent the accepted delete (its ``User-Agent``), where it said.
        self.deleted_by: int | None = None
        #: (method, path with query, HTTP status) of every request, in order.
        self.requests: list[tuple[str, str, int]] = []
        #: Resets accepted.
        self.resets = 0
        self._lock = threading.Lock()
        self._operations = itertools.count(1)
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                length = int(self.headers.get("Content-Length") or 0)
                body = api_traffic.parse_json(self.rfile.read(length)) if length else None
                self.exchange = api_traffic.Exchange(API, self.command, url.path, query, body)
                refusal = api_traffic.vet(API, self.command, url.path, query, body)
                authorization = self.headers.get("Authorization", "")
                if refusal is not None:
                    self._reply(*refusal)
                elif self.command == "DELETE":  # another resource than the stack's queued resource: none here
                    self._reply(*api._delete(self.path, authorization, self.headers.get("User-Agent", "")))
                elif self.command == "POST" and RESET_PATH.fullmatch(url.path):
                    self._reply(*api._reset(self.path, authorization))  # the request's name is in the path
                else:
                    self._reply(
                        *_error("UNIMPLEMENTED", f"the emulated Cloud TPU API does not serve {self.command} {url.path}")
                    )

            do_DELETE = do_POST = do_GET = do_PUT = do_PATCH = _serve  # noqa: N815 (http.server naming)

            def _reply(self, code: int, body: dict) -> None:
                with api._lock:
                    api.requests.append((self.command, self.path, code))
                self.exchange.status, self.exchange.response = code, body
                api_traffic.record(self.exchange)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # keep the emulator's console clean
                pass

        self._server = LoopbackServer(Handler, "tpu-api")

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``, the value for ``MULTISLICE_TPU_API_ENDPOINT``."""
        host, port = self._server.host_port
        return f"http://{host}:{port}"

    def _delete(self, target: str, authorization: str, agent: str = "") -> tuple[int, dict]:
        """(HTTP status, JSON body) of ``DELETE target``; ``agent``: the request's ``User-Agent``, which
        names the slice of the VM that sent it (delete_on_complete.sh: ``slice/S``)."""
        parts = urlsplit(target)
        match = DELETE_PATH.fullmatch(parts.path)
        if match is None:
            return _error("NOT_FOUND", f"the emulated Cloud TPU API has no resource at {parts.path}")
        name = match["name"]
        if authorization != f"Bearer {self._token}":
            return _error(
                "UNAUTHENTICATED",
                "Request had invalid authentication credentials: expected the emulated VMs' access token",
            )
        if self.queued_resource is None:
            return _error(
                "PERMISSION_DENIED",
                f"Permission 'tpu.nodes.delete' denied on '{name}' "
                "(multislice:queuedResource.deleteOnComplete is off: the VMs' service account has no such role)",
            )
        force = (parse_qs(parts.query).get("force") or ["false"])[0].lower() == "true"
        with self._lock:
            if name != self.queued_resource or self.deleted_at is not None:
                return _error("NOT_FOUND", f"Resource '{name}' was not found")
            if not force:
                return _error(
                    "FAILED_PRECONDITION",
                    f"queued resource '{name}' has running nodes: delete them first or set force=true",
                )
            self._on_delete(name)
            self.deleted_at = time.monotonic()
            sender = _SENDER.search(agent)
            self.deleted_by = int(sender[1]) if sender else None
        return 200, self._done_operation(name, "delete", {"@type": "type.googleapis.com/google.protobuf.Empty"})

    def _done_operation(self, name: str, verb: str, response: dict) -> dict:
        """A finished long-running operation ``verb`` (``delete``, ``reset``) on queued resource
        ``name`` with its ``response``, as the TPU API returns one (``google.longrunning.Operation``
        with ``OperationMetadata``)."""
        now = time.time()
        parent = name.split("/queuedResources/", 1)[0]
        return {
            "name": f"{parent}/operations/operation-{next(self._operations)}",
            "metadata": {
                "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
                "createTime": _rfc3339(now),
                "endTime": _rfc3339(now),
                "target": name,
                "verb": verb,
                "apiVersion": "v2",
            },
            "done": True,
            "response": response,
        }

    def _reset(self, target: str, authorization: str) -> tuple[int, dict]:
        """(HTTP status, JSON body) of ``POST target`` (``…/queuedResources/ID:reset``)."""
        match = RESET_PATH.fullmatch(urlsplit(target).path)
        assert match is not None  # do_POST routes only this path here
        name = match["name"]
        if authorization != f"Bearer {self._token}":
            return _error(
                "UNAUTHENTICATED",
                "Request had invalid authentication credentials: expected the emulated VMs' access token",
            )
        with self._lock:
            if name != self.resettable or self.deleted_at is not None:
                return _error("NOT_FOUND", f"Resource '{name}' was not found")
            self._on_reset(name)
            self.resets += 1
        queued_resource = {"name": name, "state": {"state": "ACTIVE"}}
        return 200, self._done_operation(
            name, "reset", {"@type": "type.googleapis.com/google.cloud.tpu.v2.QueuedResource", **queued_resource}
        )

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> EmulatedTpuApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _error(status: str, message: str) -> tuple[int, dict]:
    code = _HTTP[status]
    return code, {"error": {"code": code, "message": message, "status": status}}


class DeleteOnComplete:
    """The emulated queued resource's side of deleteOnComplete, for
    :class:`infra.local.emulated_stack.EmulatedStack`: :meth:`start` when the queued resource is
    created, :meth:`stop` with its VMs.

    Args:
      config: the stack (its ``delete_on_complete`` and queued resource name).
      paths: where the deletion is recorded.
    """

    def __init__(self, config: StackConfig, paths: LocalPaths) -> None:
        self.config = config
        self.paths = paths
        #: The metadata attribute every VM gets, as ``pulumi up`` sets it (``{}`` when off).
        self.metadata = delete_on_complete_metadata(
            config.queued_resource_name, delete_on_complete=config.delete_on_complete
        )
        self.queued_resource = self.metadata.get(DELETE_QUEUED_RESOURCE_KEY)
        self.api: EmulatedTpuApi | None = None
        #: Set by an accepted reset, cleared by :meth:`take_reset`.
        self._reset_due = threading.Event()

    def start(self) -> None:
        """The queued resource is (created again and) not deleted: forget an earlier deletion
        and serve the API for this run."""
        forget_deletion(self.paths)
        self.stop()
        self._reset_due.clear()
        self.api = EmulatedTpuApi(
            self.queued_resource,
            on_delete=self._record,
            resettable=self.config.queued_resource_name,
            on_reset=lambda name: self._reset_due.set(),
        )

    def _record(self, name: str) -> None:
        record_deletion(self.paths, name, self.config.run_dir)

    def environment(self) -> dict[str, str]:
        """What the VMs' environment needs: the TPU API endpoint (:meth:`start` first)."""
        assert self.api is not None, "DeleteOnComplete.start() first"
        return {TPU_API_ENDPOINT_ENV: self.api.endpoint}

    def take_reset(self) -> bool:
        """Whether a reset was accepted since the last call (``multislice local reset``)."""
        due = self._reset_due.is_set()
        self._reset_due.clear()
        return due

    @property
    def deleted(self) -> bool:
        """Whether the VMs deleted the queued resource in this run."""
        return self.api is not None and self.api.deleted_at is not None

    def delete_nodes(self, vms: list[EmulatedVM], delay_s: float, report: Callable[[str], None]) -> bool:
        """The force delete deletes the nodes: once ``delay_s`` seconds passed since the delete,
        stop the VMs still running (SIGTERM, a short grace, SIGKILL; reported) and return True;
        else False."""
        deleted_at = self.api.deleted_at if self.api is not None else None  # None: not deleted (``deleted``)
        if deleted_at is None or time.monotonic() - deleted_at < delay_s:
            return False
        groups = [vm.group for vm in vms if vm.group is not None]
        running = [vm.name for vm in vms if vm.group is not None and vm.group.poll() is None]
        if running:
            report(f"capacity: the queued resource was deleted; stopping its VMs still running: {', '.join(running)}")
        stop_groups(groups, STOP_GRACE_S)
        return True

    @property
    def outcome(self) -> str:
        """``summary["capacity"]``: :data:`DELETED` or :data:`KEPT`."""
        return DELETED if self.deleted else KEPT

    def line(self) -> str:
        """What ``local up`` reports about the capacity once the VMs are gone, naming the capacity
        mode and what it costs on Cloud TPU (as ``QueuedResourceSpec.capacity_plan`` says it)."""
        mode = self.config.capacity
        if self.deleted:
            by = self.api.deleted_by if self.api is not None else None
            who = "a VM" if by is None else f"worker 0 of slice {by}"
            return (
                f"capacity: deleted: {who} deleted the queued resource {self.queued_resource} once "
                f"the run was complete (multislice:queuedResource.deleteOnComplete); its {mode} VMs' billing "
                "ended there"
            )
        cost = "the reservation is paid for either way" if mode == "reserved" else "billed until pulumi destroy"
        if self.queued_resource is None:
            return (
                "capacity: kept: multislice:queuedResource.deleteOnComplete is off, so the VMs do not delete the "
                f"queued resource (on Cloud TPU its {mode} VMs: {cost})"
            )
        return (
            f"capacity: kept: the queued resource {self.queued_resource} was not deleted; "
            f"see the log of slice 0 worker 0 (on Cloud TPU its {mode} VMs: {cost})"
        )

    def stop(self) -> None:
        """Stop serving the API (the record stays)."""
        if self.api is not None:
            self.api.stop()

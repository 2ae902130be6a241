"""A loopback Compute API for the compute-engine backend: the slices' managed instance groups and
their VMs, as a Compute Engine TPU VM's ``boot.sh`` asks for them (its startup tests and the local
emulation).

Serves the methods ``boot.sh`` and ``slice-watch.sh`` call (Compute API v1,
https://cloud.google.com/compute/docs/reference/rest/v1; the shapes of gcloud's own client,
``googlecloudsdk/generated_clients/apis/compute/v1/compute_v1_client.py`` and
``compute_v1_messages.py``):

* ``instanceGroupManagers.listManagedInstances``: ``POST compute/v1/projects/P/zones/Z/
  instanceGroupManagers/G/listManagedInstances`` (query ``pageToken``, ``maxResults``) →
  ``{"managedInstances": [{"instance": <the VM's URL>, "name", "id", "instanceStatus",
  "currentAction"}], "nextPageToken"}`` (the token only when more pages follow);
* ``instances.get``: ``GET compute/v1/projects/P/zones/Z/instances/NAME`` → ``{"kind", "id", "name",
  "zone", "selfLink", "status", "networkInterfaces": [{"name": "nic0", "networkIP"}]}``, and ``"metadata": {"items":
  [{"key", "value"}]}`` where the VM was given metadata of its own (:meth:`ComputeApi.add_vm`:
  e.g. the ``agent-worker-number`` Compute Engine may set);
* ``instanceGroupManagers.get``: ``GET compute/v1/projects/P/zones/Z/instanceGroupManagers/G`` →
  ``{"kind", "id", "name", "zone", "selfLink", "baseInstanceName", "targetSize"}`` (what gcloud's ``managed
  resize`` reads back after its request: the fake is checked with that command, docs/compute-engine.md
  section 7);
* ``autoscalers.list``: ``GET compute/v1/projects/P/zones/Z/autoscalers`` → none (``{"kind", "id",
  "items": [], "selfLink"}``): gcloud's ``managed describe`` asks whether the group is autoscaled;
* ``instanceGroupManagers.resize``: ``POST compute/v1/projects/P/zones/Z/instanceGroupManagers/G/
  resize?size=N`` → an ``Operation`` marked ``DONE`` ("when the resize actions are scheduled even
  if the group has not yet added or deleted any instances"). As a group in bulk mode: size 0
  deletes every VM of the group (they are no longer listed); a size above 0 adds VMs only to an
  empty group ("About bulk mode"; else HTTP 400), all at once, listed ``CREATING`` under the
  names the group had (a simplification: Compute Engine names new VMs anew), and is recorded
  (:meth:`ComputeApi.take_recreations`) for the emulation to carry out.

Every request is vetted and every answer recorded (:mod:`infra.emulated.api_traffic`): the tests
judge both by Google's discovery document of the Compute API v1, and each answer for the fields
Google always returns (``kind``, ``id``, ``name``, ``selfLink``, ``zone``; a managed instance's
``name``). An unknown group or VM is HTTP 404 and a request without ``Authorization: Bearer`` 401,
each with Google's error JSON (``{"error": {"code", "message", "status"}}``); a POST without
``Content-Length`` is 411 with the page Google's front end answers it with, before the API. A VM can
be listed before it exists (its ``currentAction`` is ``CREATING`` and ``instances.get`` is 404 until
it has an IP), as ``ManagedInstance.instance`` "can exist even if the instance has not yet been
created".

Bound to 127.0.0.1 on a free port; point ``boot.sh`` at it with
``MULTISLICE_COMPUTE_API_ENDPOINT=http://127.0.0.1:<port>``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import random
import string
import threading
import urllib.parse

from infra.emulated.kit import LoopbackServer, api_traffic

#: The API this serves, as its discovery document is named (:mod:`infra.emulated.api_traffic`).
API = "compute.v1"
#: What Google's front end answers a POST without ``Content-Length`` (HTTP 411, an HTML page of the
#: front end's, before any API sees the request): its sentence, as the page words it.
FRONT_END_411 = (
    "<!DOCTYPE html><title>Error 411 (Length Required)!!1</title><p><b>411.</b> That’s an error."
    "<p>POST requests require a <code>Content-length</code> header. That’s all we know.\n"
)

#: A managed instance group's VM names: its base instance name, ``-`` and four characters
#: (``InstanceGroupManager.baseInstanceName``: "When a VM is created in the group, the MIG appends
#: a hyphen and a random four-character string to the base instance name": gcloud's
#: compute_v1_messages.py; pulumi_gcp/compute/instance_group_manager.py: "lowercase letters,
#: numbers, and hyphens").
SUFFIX_ALPHABET = string.ascii_lowercase + string.digits
SUFFIX_LENGTH = 4


def resource_id(name: str) -> str:
    """A resource's ``id`` as Compute Engine answers it ("[Output Only] The unique identifier for the
    resource. This identifier is defined by the server": a uint64 in decimal), the same for a name
    in every run (the sha256 of the name)."""
    return str(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big"))


def instance_name(base_instance_name: str, rng: random.Random | None = None) -> str:
    """A new VM name of a group with ``base_instance_name``: ``<base>-<4 of [a-z0-9]>``."""
    pick = (rng or random.Random()).choice
    return f"{base_instance_name}-{''.join(pick(SUFFIX_ALPHABET) for _ in range(SUFFIX_LENGTH))}"


@dataclasses.dataclass
class ManagedVm:
    """One VM of a group: its name, internal IP (None: not created yet) and current action."""

    name: str
    ip: str | None = None
    current_action: str = "NONE"
    #: ``instanceStatus`` when set (e.g. ``TERMINATED``); None: RUNNING with an IP, else PROVISIONING.
    status: str | None = None
    #: The VM's own metadata items, as ``instances.get`` answers them (``metadata.items``).
    metadata: dict[str, str] = dataclasses.field(default_factory=dict)


class ComputeApi:
    """Serve the groups of ``project``/``zone`` until :meth:`stop`; usable as a context manager.

    Args:
      project: the project id the VMs' paths name.
      zone: the zone the VMs' paths name.
      page_size: at most this many VMs per ``listManagedInstances`` page (None: one page, as a
        group whose ``listManagedInstancesResults`` is ``PAGELESS``, the default, answers).
    """

    def __init__(self, project: str, zone: str, *, page_size: int | None = None) -> None:
        self.project, self.zone, self.page_size = project, zone, page_size
        self._groups: dict[str, list[ManagedVm]] = {}
        self._lock = threading.Lock()
        #: ``(method, path)`` of every request so far, in order.
        self.requests: list[tuple[str, str]] = []
        self._recreations: list[tuple[str, list[str]]] = []
        #: The VM names of each group resized to 0, which a resize back reuses.
        self._emptied: dict[str, list[str]] = {}
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._answer("POST")

            def _answer(self, method: str) -> None:
                api.requests.append((method, self.path))
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                self.exchange = api_traffic.Exchange(API, method, url.path, query)
                body = b""
                if method == "POST":
                    if self.headers.get("Content-Length") is None:
                        self._front_end_411()
                        return
                    body = self.rfile.read(int(self.headers["Content-Length"]))
                    self.exchange.body = api_traffic.parse_json(body)
                if not (self.headers.get("Authorization") or "").startswith("Bearer "):
                    self._error(401, "UNAUTHENTICATED", "Request is missing required authentication credential.")
                    return
                refusal = api_traffic.vet(API, method, url.path, query, self.exchange.body)
                if refusal is not None:
                    self._send(*refusal)
                    return
                prefix = f"/compute/v1/projects/{api.project}/zones/{api.zone}/"
                if not url.path.startswith(prefix):
                    self._error(404, "NOT_FOUND", f"The resource '{url.path}' was not found")
                    return
                parts = url.path[len(prefix) :].split("/")
                if method == "POST" and len(parts) == 3 and parts[0] == "instanceGroupManagers":
                    if parts[2] == "listManagedInstances":
                        self._reply(api._list(parts[1], query.get("pageToken", [""])[0]))
                        return
                    if parts[2] == "resize":
                        answer = api._resize(parts[1], query.get("size", [""])[0])
                        if isinstance(answer, str):
                            self._error(400, "INVALID_ARGUMENT", answer)
                        else:
                            self._reply(answer)
                        return
                if method == "GET" and len(parts) == 2 and parts[0] == "instances":
                    self._reply(api._instance(parts[1]))
                    return
                if method == "GET" and len(parts) == 2 and parts[0] == "instanceGroupManagers":
                    self._reply(api._group(parts[1]))
                    return
                if method == "GET" and parts == ["autoscalers"]:
                    self._reply(api._autoscalers())
                    return
                self._error(404, "NOT_FOUND", f"The resource '{url.path}' was not found")

            def _reply(self, answer: dict[str, object] | None) -> None:
                if answer is None:
                    self._error(404, "NOT_FOUND", f"The resource '{self.path}' was not found")
                else:
                    self._send(200, answer)

            def _front_end_411(self) -> None:
                """Google's front end refuses a POST without a length before the API sees it, with a
                page of its own, not the API's JSON (so it is no exchange with the API)."""
                data = FRONT_END_411.encode()
                self.send_response(411)
                self.send_header("Content-Type", "text/html; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, code: int, status: str, message: str) -> None:
                self._send(code, {"error": {"code": code, "message": message, "status": status}})

            def _send(self, code: int, body: dict[str, object]) -> None:
                self.exchange.status, self.exchange.response = code, body
                api_traffic.record(self.exchange)
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # keep the console clean
                pass

        self._server = LoopbackServer(Handler, "compute-api")

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:<port>``, the value for ``MULTISLICE_COMPUTE_API_ENDPOINT``."""
        host, port = self._server.host_port
        return f"http://{host}:{port}"

    @property
    def zone_url(self) -> str:
        """The zone's URL, as a zonal resource's ``zone`` spells it."""
        return f"https://www.googleapis.com/compute/v1/projects/{self.project}/zones/{self.zone}"

    def instance_url(self, name: str) -> str:
        """A VM's URL as ``ManagedInstance.instance`` and its ``selfLink`` spell it."""
        return f"{self.zone_url}/instances/{name}"

    def add_group(self, group: str) -> None:
        """Create an empty group (it exists: ``listManagedInstances`` answers, with no VMs)."""
        with self._lock:
            self._groups.setdefault(group, [])

    def remove_group(self, group: str) -> None:
        """Delete a group (``listManagedInstances`` answers 404 again)."""
        with self._lock:
            self._groups.pop(group, None)

    def add_vm(
        self,
        group: str,
        name: str,
        ip: str | None,
        current_action: str = "NONE",
        metadata: dict[str, str] | None = None,
    ) -> None:
        """List a VM in ``group`` (created with it); ``ip`` None: listed, not created yet;
        ``metadata``: its own metadata items (``instances.get``)."""
        with self._lock:
            self._groups.setdefault(group, []).append(
                ManagedVm(name, ip, current_action, metadata=dict(metadata or {}))
            )

    def set_vm(self, name: str, *, ip: str | None, current_action: str = "NONE", status: str | None = None) -> None:
        """Change a listed VM's IP, current action and status (e.g. its creation finished, or it was
        preempted: ``status="TERMINATED"``)."""
        with self._lock:
            for vms in self._groups.values():
                for vm in vms:
                    if vm.name == name:
                        vm.ip, vm.current_action, vm.status = ip, current_action, status

    def take_recreations(self) -> list[tuple[str, list[str]]]:
        """``(group, VM names)`` of each empty group resized back to its VMs since the last call."""
        with self._lock:
            taken, self._recreations = self._recreations, []
        return taken

    def remove_vm(self, name: str) -> None:
        with self._lock:
            for group, vms in self._groups.items():
                self._groups[group] = [vm for vm in vms if vm.name != name]

    def _list(self, group: str, page_token: str) -> dict[str, object] | None:
        with self._lock:
            if group not in self._groups:
                return None
            vms = list(self._groups[group])
        start = int(page_token or 0)
        end = len(vms) if self.page_size is None else min(len(vms), start + self.page_size)
        answer: dict[str, object] = {
            "managedInstances": [
                {
                    "instance": self.instance_url(vm.name),
                    "name": vm.name,  # "always exists even if the instance has not yet been created"
                    "id": resource_id(vm.name),
                    "instanceStatus": vm.status or ("RUNNING" if vm.ip else "PROVISIONING"),
                    "currentAction": vm.current_action,
                }
                for vm in vms[start:end]
            ]
        }
        if end < len(vms):
            answer["nextPageToken"] = str(end)
        return answer

    def _resize(self, group: str, size_text: str) -> dict[str, object] | str | None:
        try:
            size = int(size_text)
        except ValueError:
            return f"Invalid value for field 'size': '{size_text}'. Must be an integer."
        with self._lock:
            if group not in self._groups:
                return None
            vms = self._groups[group]
            if size == 0:
                self._emptied[group] = [vm.name for vm in vms] or self._emptied.get(group, [])
                self._groups[group] = []
            elif size != len(vms):
                if vms:
                    return (
                        f"Invalid value for field 'size': {size}. A managed instance group in bulk mode adds "
                        f"instances only when its target size is 0; group {group} has {len(vms)}."
                    )
                names = self._emptied.pop(group, [])[:size]
                names += [instance_name(group) for _ in range(size - len(names))]
                self._groups[group] = [ManagedVm(name, None, "CREATING") for name in names]
                self._recreations.append((group, names))
        zone = self.zone_url
        name = f"operation-resize-{group}-{len(self.requests)}"
        return {
            "kind": "compute#operation",
            "id": resource_id(name),
            "name": name,
            "zone": zone,
            "selfLink": f"{zone}/operations/{name}",
            "operationType": "compute.instanceGroupManagers.resize",
            "status": "DONE",
            "progress": 100,
            "targetLink": f"{zone}/instanceGroupManagers/{group}",
        }

    def _group(self, group: str) -> dict[str, object] | None:
        with self._lock:
            if group not in self._groups:
                return None
            size = len(self._groups[group])
        zone = self.zone_url
        return {
            "kind": "compute#instanceGroupManager",
            "id": resource_id(group),
            "name": group,
            "zone": zone,
            "selfLink": f"{zone}/instanceGroupManagers/{group}",
            "baseInstanceName": group,
            "targetSize": size,
        }

    def _autoscalers(self) -> dict[str, object]:
        """The zone's autoscalers: none (the groups are sized by the program and the slices, never
        autoscaled)."""
        return {
            "kind": "compute#autoscalerList",
            "id": resource_id(f"{self.zone_url}/autoscalers"),
            "items": [],
            "selfLink": f"{self.zone_url}/autoscalers",
        }

    def _instance(self, name: str) -> dict[str, object] | None:
        with self._lock:
            found = [vm for vms in self._groups.values() for vm in vms if vm.name == name and vm.ip]
        if not found:
            return None
        answer: dict[str, object] = {
            "kind": "compute#instance",
            "id": resource_id(name),
            "name": name,
            "zone": self.zone_url,
            "selfLink": self.instance_url(name),
            "status": "RUNNING",
            "networkInterfaces": [{"name": "nic0", "networkIP": found[0].ip}],
        }
        if found[0].metadata:
            answer["metadata"] = {"items": [{"key": k, "value": v} for k, v in found[0].metadata.items()]}
        return answer

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> ComputeApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

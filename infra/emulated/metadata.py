"""A loopback GCE metadata server for one emulated TPU VM.

Answers ``GET /computeMetadata/v1/instance/attributes/<key>`` with the ``Metadata-Flavor:
Google`` header required (403 without it, like GCE), 404 for unknown keys, and the
directory listing at ``.../attributes/``; and ``.../instance/service-accounts/default/token``
with an access token in GCE's JSON shape (``access_token``, ``expires_in``, ``token_type``;
https://cloud.google.com/compute/docs/access/authenticate-workloads#applications), which an
emulated GCS server accepts without checking. The keys a TPU VM of a multislice queued resource
has and that JAX and our startup script read: ``agent-worker-number``,
``worker-network-endpoints``, ``tpu-env`` (with ``MEGASCALE_*``), ``accelerator-type``,
``startup-script``, plus our ``multislice-run-dir``. Attributes can be replaced while it
runs (a repaired slice gets new values). Other values (``values``, by path under
``/computeMetadata/v1/``) are what a Compute Engine TPU VM's ``boot.sh`` reads besides:
``instance/name``, ``instance/zone`` (``projects/<number>/zones/<zone>``) and
``project/project-id`` (https://cloud.google.com/compute/docs/metadata/predefined-metadata-keys).

Bound to 127.0.0.1 on a free port; point a process at it with
``GCE_METADATA_IP=127.0.0.1:<port>`` (the variable JAX's cloud_tpu_cluster honours).
:meth:`MetadataServer.fail` scripts transient faults (e.g. HTTP 503 with a body, as a
metadata server answers while it is not ready) for the boot tests.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Mapping

from infra.emulated.loopback_http import LoopbackServer

ROOT = "/computeMetadata/v1/"
INSTANCE = ROOT + "instance/"
PREFIX = INSTANCE + "attributes/"
TOKEN_PATH = INSTANCE + "service-accounts/default/token"
#: The access token the emulated VMs get (an emulated GCS server does not check it).
EMULATED_TOKEN = "emulated-access-token"


class MetadataServer:
    """Serve ``attributes`` until :meth:`stop`; usable as a context manager."""

    def __init__(self, attributes: Mapping[str, str], values: Mapping[str, str] | None = None) -> None:
        self._attributes = dict(attributes)
        self._values = {ROOT + path: value for path, value in (values or {}).items()}
        self._lock = threading.Lock()
        self._faults: dict[str, list[tuple[int, str]]] = {}
        #: Paths requested so far, in order (what a VM asked its metadata server for).
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server naming)
                server.requests.append(self.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._reply(403, "Missing Metadata-Flavor:Google header.\n")
                    return
                path = self.path.split("?", 1)[0]
                fault = server._next_fault(path)
                if fault is not None:
                    self._reply(*fault)
                    return
                if path == TOKEN_PATH:
                    token = {"access_token": EMULATED_TOKEN, "expires_in": 3599, "token_type": "Bearer"}
                    self._reply(200, json.dumps(token), "application/json")
                    return
                if path in server._values:
                    self._reply(200, server._values[path])
                    return
                if not path.startswith(PREFIX):
                    self._reply(404, "not found\n")
                    return
                key = path[len(PREFIX) :]
                attributes = server.attributes
                if key == "":
                    self._reply(200, "".join(f"{name}\n" for name in sorted(attributes)))
                elif key in attributes:
                    self._reply(200, attributes[key])
                else:
                    self._reply(404, "not found\n")

            def _reply(self, code: int, body: str, content_type: str = "application/text") -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:  # keep the emulator's console clean
                pass

        self._server = LoopbackServer(Handler, "metadata")

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the value for ``GCE_METADATA_IP``."""
        host, port = self._server.host_port
        return f"{host}:{port}"

    @property
    def attributes(self) -> dict[str, str]:
        with self._lock:
            return dict(self._attributes)

    def update(self, attributes: Mapping[str, str]) -> None:
        with self._lock:
            self._attributes.update(attributes)

    def remove(self, *keys: str) -> None:
        """Answer 404 for the attributes ``keys`` from now on."""
        with self._lock:
            for key in keys:
                self._attributes.pop(key, None)

    def fail(self, key: str, times: int, code: int = 503, body: str = "Service Unavailable\n") -> None:
        """Answer the next ``times`` requests for ``key`` (a path under ``instance/``, e.g.
        ``attributes/multislice-run-dir``) with HTTP ``code`` and ``body``, then normally."""
        with self._lock:
            self._faults.setdefault(INSTANCE + key, []).extend([(code, body)] * times)

    def _next_fault(self, path: str) -> tuple[int, str] | None:
        with self._lock:
            queue = self._faults.get(path)
            return queue.pop(0) if queue else None

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> MetadataServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

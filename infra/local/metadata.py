"""A loopback GCE metadata server for one emulated TPU VM.

Answers ``GET /computeMetadata/v1/instance/attributes/<key>`` with the ``Metadata-Flavor:
Google`` header required (403 without it, like GCE), 404 for unknown keys, and the
directory listing at ``.../attributes/``. The keys a TPU VM of a multislice queued resource
has and that JAX and our startup script read: ``agent-worker-number``,
``worker-network-endpoints``, ``tpu-env`` (with ``MEGASCALE_*``), ``accelerator-type``,
``startup-script``, plus our ``multislice-run-dir``. Attributes can be replaced while it
runs (a repaired slice gets new values).

Bound to 127.0.0.1 on a free port; point a process at it with
``GCE_METADATA_IP=127.0.0.1:<port>`` (the variable JAX's cloud_tpu_cluster honours).
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Mapping

PREFIX = "/computeMetadata/v1/instance/attributes/"


class MetadataServer:
    """Serve ``attributes`` until :meth:`stop`; usable as a context manager."""

    def __init__(self, attributes: Mapping[str, str]):
        self._attributes = dict(attributes)
        self._lock = threading.Lock()
        #: Paths requested so far, in order (what a VM asked its metadata server for).
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server naming)
                server.requests.append(self.path)
                if self.headers.get("Metadata-Flavor") != "Google":
                    self._reply(403, "Missing Metadata-Flavor:Google header.\n")
                    return
                path = self.path.split("?", 1)[0]
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

            def _reply(self, code: int, body: str) -> None:
                data = body.encode()
                self.send_response(code)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Type", "application/text")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # keep the emulator's console clean
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metadata", daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the value for ``GCE_METADATA_IP``."""
        host, port = self._httpd.server_address[:2]
        return f"{host}:{port}"

    @property
    def attributes(self) -> dict[str, str]:
        with self._lock:
            return dict(self._attributes)

    def update(self, attributes: Mapping[str, str]) -> None:
        with self._lock:
            self._attributes.update(attributes)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetadataServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

"""An HTTP server on 127.0.0.1 that serves from a thread of this process: the emulation's
GCE metadata servers (``infra.emulated.metadata``) and its TPU API (``infra.backends.queued_resource.emulated_api``) are
each one, with their own request handler (stdlib ``http.server``)."""

from __future__ import annotations

import http.server
import threading


class LoopbackServer:
    """``handler`` served on a free port of 127.0.0.1 from a daemon thread named ``name``,
    one thread per connection, from construction until :meth:`stop`."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], name: str) -> None:
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def host_port(self) -> tuple[str, int]:
        """(``127.0.0.1``, the port it listens on)."""
        host, port = self._httpd.server_address[:2]
        return str(host), port  # str already: an AF_INET server's address

    def stop(self) -> None:
        """Stop serving and close the socket; waits up to 5 s for the serving thread."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

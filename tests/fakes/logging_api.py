"""A loopback fake of the Cloud Logging v2 REST API (``entries:write``, ``entries:list``), for
driving the real ``google.cloud.logging_v2`` client (HTTP transport, ``_use_grpc=False``).

REST reference: https://cloud.google.com/logging/docs/reference/v2/rest/v2/entries/write and
.../entries/list. It keeps written entries in memory (each gets the request's ``logName``,
``resource`` and ``labels`` unless it has its own, and an ``insertId``), and answers a list call
with the entries its filter matches, sorted by ``orderBy``, paged by ``pageSize`` /
``pageToken``. The filter language is the subset ``multislice logs`` sends (clauses joined by
`` AND ``; ``path = "v"``, ``path = ("a" OR "b")``, ``path >= "v"``, ``path > "v"``; paths
``resource.type``, ``resource.labels.K``, ``labels.K``, ``logName``, ``timestamp``): anything
else is answered 400 INVALID_ARGUMENT, so a filter the real service might read differently fails
here. Every request is vetted and every answer recorded (:mod:`infra.emulated.api_traffic`): the tests
judge both by Google's discovery document of the Logging API v2.
``lists`` records each list request body; ``fail_next(code, status, message)`` answers
the next call with an error.
"""

from __future__ import annotations

import http.server
import json
import re
import threading
import urllib.parse
from datetime import datetime
from typing import Any

from infra.emulated import api_traffic

_CLAUSE = re.compile(
    r'^(?P<path>[A-Za-z_][\w.]*)\s*(?P<op>>=|<=|=|>|<)\s*(?P<value>"[^"]*"|\((?:"[^"]*"(?: OR )?)+\))$'
)


class FilterError(ValueError):
    """A filter outside the supported subset."""


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _field(entry: dict[str, Any], path: str) -> Any:
    if path == "resource.type":
        return entry.get("resource", {}).get("type")
    if path.startswith("resource.labels."):
        return entry.get("resource", {}).get("labels", {}).get(path[len("resource.labels.") :])
    if path.startswith("labels."):
        return entry.get("labels", {}).get(path[len("labels.") :])
    if path in ("logName", "timestamp", "severity", "insertId"):
        return entry.get(path)
    raise FilterError(f"unsupported field {path!r}")


def compile_filter(text: str):
    """A predicate over entries for ``text`` (see the module docstring). Raises FilterError."""
    tests = []
    for clause in text.split(" AND "):
        match = _CLAUSE.match(clause.strip())
        if not match:
            raise FilterError(f"unsupported clause {clause!r}")
        path, op, value = match["path"], match["op"], match["value"]
        values = re.findall(r'"([^"]*)"', value)
        if value.startswith("(") and op != "=":
            raise FilterError(f"a value list needs '=': {clause!r}")
        _field({}, path)  # the path is known

        def test(entry, path=path, op=op, values=values):
            actual = _field(entry, path)
            if actual is None:
                return False
            if op == "=":
                return actual in values
            left, right = (_time(actual), _time(values[0])) if path == "timestamp" else (actual, values[0])
            return {">=": left >= right, ">": left > right, "<=": left <= right, "<": left < right}[op]

        tests.append(test)
    return lambda entry: all(test(entry) for test in tests)


class FakeLoggingApi:
    """Serve the API on 127.0.0.1 until :meth:`stop`; ``url`` is the client's ``api_endpoint``."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.lists: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []
        self._faults: list[tuple[int, str, str]] = []
        self._lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server naming)
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                url = urllib.parse.urlsplit(self.path)
                path, query = url.path, urllib.parse.parse_qs(url.query)
                self.exchange = api_traffic.Exchange("logging.v2", "POST", path, query, body)
                refusal = api_traffic.vet("logging.v2", "POST", path, query, body)
                if refusal is not None:
                    return self._send(*refusal)
                with fake._lock:
                    fault = fake._faults.pop(0) if fake._faults else None
                if fault:
                    return self._error(*fault)
                if path == "/v2/entries:write":
                    fake._write(body)
                    return self._reply({})
                if path == "/v2/entries:list":
                    try:
                        return self._reply(fake._list(body))
                    except FilterError as err:
                        return self._error(400, "INVALID_ARGUMENT", str(err))
                return self._error(404, "NOT_FOUND", f"no such method {path}")

            def _reply(self, payload: dict[str, Any]) -> None:
                self._send(200, payload)

            def _error(self, code: int, status: str, message: str) -> None:
                self._send(code, {"error": {"code": code, "status": status, "message": message}})

            def _send(self, code: int, payload: dict[str, Any]) -> None:
                self.exchange.status, self.exchange.response = code, payload
                api_traffic.record(self.exchange)
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-logging", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def fail_next(self, code: int, status: str, message: str) -> None:
        with self._lock:
            self._faults.append((code, status, message))

    def add(self, **entry: Any) -> None:
        """Store an entry as if written (``insertId`` assigned when absent)."""
        self._write({"entries": [entry]})

    def _write(self, body: dict[str, Any]) -> None:
        with self._lock:
            self.writes.append(body)
            for raw in body.get("entries", []):
                entry = dict(raw)
                for key in ("logName", "resource"):
                    if key not in entry and key in body:
                        entry[key] = body[key]
                entry["labels"] = {**body.get("labels", {}), **raw.get("labels", {})}
                entry.setdefault("insertId", f"fake-{len(self.entries):06d}")
                self.entries.append(entry)

    def _list(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.lists.append(body)
            matches = compile_filter(body["filter"]) if body.get("filter") else (lambda entry: True)
            found = [e for e in self.entries if matches(e)]
        found.sort(key=lambda e: _time(e["timestamp"]), reverse=body.get("orderBy") == "timestamp desc")
        start = int(body.get("pageToken") or 0)
        size = int(body.get("pageSize") or 50)
        page = {"entries": found[start : start + size]}
        if start + size < len(found):
            page["nextPageToken"] = str(start + size)
        return page

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

"""What the emulation's Google API fakes exchange, handed to whoever checks it.

The emulated APIs (``infra/backends/*/emulated_api.py``: the Cloud TPU API a queued resource's VMs
call, the Compute API a compute-engine stack's VMs call) stand in for Google's services, so what
they accept and answer must be what Google's would. They pass every request through :func:`vet`
before serving it and every answer through :func:`record`:

* :func:`vet` asks the process's vetter (:func:`set_vetter`; none unless a test sets one: the
  tests judge each request by Google's discovery documents, tests/fakes/discovery.py) and, when it
  refuses, the fake answers with the vetter's error instead of serving (Google's error shape:
  ``{"error": {"code": 400, "message": …, "status": "INVALID_ARGUMENT"}}``);
* :func:`record` appends the exchange, as one JSON line, to the file :data:`TRAFFIC_ENV` names
  (nothing when unset), so the tests judge the traffic of an emulation that runs in another process
  (``multislice local up``) once it is done.

Nothing here changes what the emulation does when neither is set.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

#: The file each exchange is appended to, one JSON object a line (unset: none is kept).
TRAFFIC_ENV = "MULTISLICE_API_TRAFFIC"

#: ``(api, method, path, query, body) -> (status, error body) | None``: the process's vetter.
Vetter = Callable[[str, str, str, dict[str, list[str]], Any], "tuple[int, dict[str, Any]] | None"]

_vetter: Vetter | None = None
_lock = threading.Lock()


@dataclass
class Exchange:
    """One request to an emulated Google API and its answer.

    Attributes:
      api: the API and version, as its discovery document is named (``compute.v1``, ``tpu.v2``).
      method: the HTTP verb.
      path: the URL's path, percent-encoded as sent (no query).
      query: its query parameters, each name → its values.
      body: the request's JSON body, parsed (None: none, or not JSON).
      status: the answer's HTTP status.
      response: the answer's JSON body, parsed (None: none, or not JSON).
      media: the answer is a media download's (``alt=media``): an object's bytes, not the API's JSON.
    """

    api: str
    method: str
    path: str
    query: dict[str, list[str]] = field(default_factory=dict)
    body: Any = None
    status: int = 200
    response: Any = None
    media: bool = False


def set_vetter(vetter: Vetter | None) -> Vetter | None:
    """Make ``vetter`` judge every request the fakes of this process serve; returns the one before."""
    global _vetter
    with _lock:
        previous, _vetter = _vetter, vetter
    return previous


def vet(api: str, method: str, path: str, query: dict[str, list[str]], body: Any) -> tuple[int, dict[str, Any]] | None:
    """The error to answer instead of serving the request (None: serve it)."""
    vetter = _vetter
    return None if vetter is None else vetter(api, method, path, query, body)


def record(exchange: Exchange) -> None:
    """Append ``exchange`` to the file :data:`TRAFFIC_ENV` names, if any (one write a line)."""
    path = os.environ.get(TRAFFIC_ENV)
    if not path:
        return
    line = json.dumps(asdict(exchange), sort_keys=True, default=repr) + "\n"
    with _lock, open(path, "a", encoding="utf-8") as sink:
        sink.write(line)


def parse_json(data: bytes) -> Any:
    """``data`` as JSON, or None (empty, or not JSON)."""
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return None

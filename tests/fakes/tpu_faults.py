"""Injected errors of the loopback TPU API fake:

* ``add(rpc, status, message, details=, times=, path_contains=)``: the next ``times`` calls of
  ``rpc`` (whose path contains ``path_contains``, e.g. one node's name) fail with that status.
* ``flaky(rate, statuses, rpcs=, seed=)``: a fraction ``rate`` of the calls (of ``rpcs``,
  default all) fail with one of ``statuses`` (RESOURCE_EXHAUSTED carries a rate-limit
  ErrorInfo: a retryable 429), drawn from a seeded generator so a run meets the same storm
  every time.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from google.protobuf.message import Message

from tests.fakes.rpc_errors import HTTP_FOR_CODE, ApiError, rate_limited


@dataclass
class _Fault:
    status: str
    message: str
    details: tuple[Message, ...]
    path_contains: str
    times: int


class FaultPlan:
    """The errors still to inject (not thread-safe: the fake calls it under its lock)."""

    def __init__(self) -> None:
        self._faults: dict[str, list[_Fault]] = {}
        self._flaky: (
            tuple[float, tuple[tuple[str, tuple[Message, ...]], ...], tuple[str, ...] | None, random.Random] | None
        ) = None

    def add(
        self,
        rpc: str,
        status: str,
        message: str = "",
        *,
        details: tuple[Message, ...] = (),
        times: int = 1,
        path_contains: str = "",
    ) -> None:
        if status not in HTTP_FOR_CODE:
            raise ValueError(f"unknown google.rpc code {status!r}")
        self._faults.setdefault(rpc, []).append(
            _Fault(status, message or f"injected {status}", details, path_contains, times)
        )

    def flaky(
        self, rate: float, statuses: tuple[str, ...], *, rpcs: tuple[str, ...] | None = None, seed: int = 0
    ) -> None:
        choices = tuple((s, rate_limited() if s == "RESOURCE_EXHAUSTED" else ()) for s in statuses)
        self._flaky = (rate, choices, rpcs, random.Random(seed))

    def inject(self, rpc: str, path: str) -> None:
        """Raise the error due for this call of ``rpc`` on ``path``, if any."""
        for fault in self._faults.get(rpc, ()):
            if fault.times > 0 and fault.path_contains in path:
                fault.times -= 1
                raise ApiError(fault.status, fault.message, fault.details)
        if self._flaky is not None:
            rate, choices, rpcs, rng = self._flaky
            if (rpcs is None or rpc in rpcs) and rng.random() < rate:
                status, details = choices[rng.randrange(len(choices))]
                raise ApiError(status, f"injected {status} (flaky)", details)

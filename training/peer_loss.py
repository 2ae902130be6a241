"""Whether a trainer's error is the expected consequence of another process of the job ending: a
collective or the coordination service losing its peer, not a fault of this process.

When one worker of a multi-process job is killed or preempted, every other worker's next collective
fails (on CPU, Gloo's TCP pair: ``Connection closed by peer``, ``Connection reset by peer``; on TPU,
the DCN transfer or the coordination service's heartbeat), and jax.distributed's client reports the
missing task (``UNAVAILABLE``/``DEADLINE_EXCEEDED`` from the coordination service). The survivor's
trainer then exits to be restarted (:func:`training.train.main`), which says so in one line: the
traceback is kept at DEBUG, not shown as a crash.

The fragments below are the errors' own words (gloo ``transport/tcp/pair.cc``; the coordination
service of XLA's ``xla/tsl/distributed_runtime/coordination``); anything else is a failure as before.
"""

from __future__ import annotations

import re

#: The words of an error that a peer's end causes.
_PEER_GONE = re.compile(
    r"Connection closed by peer"
    r"|Connection reset by peer"
    r"|Gloo.*(?:Broken pipe|Socket closed|Timed out waiting)"
    r"|coordination service.*(?:shut ?down|unavailable|heartbeat|has stopped)"
    r"|(?:task|peer)s? .{0,80}(?:disconnected|heartbeat timeout|has been restarted|is not connected)",
    re.IGNORECASE | re.DOTALL,
)


def is_peer_loss(err: BaseException) -> bool:
    """``err`` (or an error it was raised from) says a peer of the job is gone."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _PEER_GONE.search(str(current)[:20_000]):
            return True
        current = current.__cause__ or current.__context__
    return False


def summary(err: BaseException) -> str:
    """The first line of ``err``'s message, at most 200 characters: what the one log line quotes."""
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
    return first if len(first) <= 200 else first[:199] + "…"

"""A worker's "The TPU is already in use" in one line (``multislice exec`` and ``local exec``).

On a TPU VM the chips belong to one process: libtpu takes an exclusive ``lockf`` on
``/tmp/libtpu_lockfile`` and a second JAX process fails with "ABORTED: The TPU is already in use
by process with pid N" (tensorflow/core/tpu/tpu_initializer_helper.cc ``TryAcquireTpuLock``;
jax-ml/jax issue 13260), after a Python traceback of a dozen lines. While a run trains, every
worker's JAX command ends that way: what matters is one line per worker, the exception's own,
which names the holder. :class:`TracebackFold` holds each worker's traceback lines until the
traceback ends and shows them folded into that line when the exception says so, unchanged
otherwise; each worker's log keeps every line (:func:`infra.remote.fanout.run_all`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

#: The exception text libtpu gives a second process (and the emulation's VMs give, alike).
TPU_IN_USE = re.compile(r"The TPU is already in use by process with pid \S+")
_STARTS = "Traceback (most recent call last):"
#: Lines that chain one traceback to the next (a blank line and a ``Traceback`` line follow).
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")


class TracebackFold:
    """Lines ``[slice s worker w] text`` in, the same out through ``emit``, but a worker's
    traceback whose exception says the TPU is in use comes out as that exception's line alone, with
    a note that the traceback is in the worker's log. Not thread-safe: call it as ``run_all``'s
    ``emit`` (one call at a time), then :meth:`flush` once every worker exited."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.held: dict[str, list[str]] = {}
        #: Where each held traceback is: in its frames, past its exception's line, or chained to the next.
        self.state: dict[str, str] = {}

    def __call__(self, line: str) -> None:
        prefix, _, text = line.partition("] ")
        prefix += "]"
        held = self.held.get(prefix)
        if held is None:
            if text.startswith(_STARTS):
                self.held[prefix], self.state[prefix] = [line], "frames"
            else:
                self.emit(line)
            return
        state, blank = self.state[prefix], not text.strip()
        if state == "frames":  # a frame's lines are indented; the first line that is not is the exception's
            held.append(line)
            if not blank and text[0] not in " \t":
                self.state[prefix] = "ended"
        elif blank:
            held.append(line)
        elif text.startswith(_CHAINED):
            held.append(line)
            self.state[prefix] = "chained"
        elif state == "chained" and text.startswith(_STARTS):
            held.append(line)
            self.state[prefix] = "frames"
        else:  # the traceback is over: this line (perhaps the next traceback's first) is the command's own
            self._release(prefix)
            self(line)

    def flush(self) -> None:
        """Show every traceback still held (its worker's command exited)."""
        for prefix in list(self.held):
            self._release(prefix)

    def _release(self, prefix: str) -> None:
        held = self.held.pop(prefix)
        self.state.pop(prefix, None)
        in_use = [line for line in held if TPU_IN_USE.search(line)]
        if in_use:
            self.emit(f"{in_use[-1]} (its traceback: this worker's log)")
            return
        for line in held:
            self.emit(line)

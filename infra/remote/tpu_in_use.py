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
#: Lines that continue a traceback after an exception line: chaining, and JAX's note on its frames.
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause", _STARTS)


class TracebackFold:
    """Lines ``[slice s worker w] text`` in, the same out through ``emit``, but a worker's
    traceback whose exception says the TPU is in use comes out as that exception's line alone, with
    a note that the traceback is in the worker's log. Not thread-safe: call it as ``run_all``'s
    ``emit`` (one call at a time), then :meth:`flush` once every worker exited."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.held: dict[str, list[str]] = {}
        self.ended: dict[str, bool] = {}  # whether the held traceback's last line was an exception's

    def __call__(self, line: str) -> None:
        prefix, _, text = line.partition("] ")
        prefix += "]"
        held = self.held.get(prefix)
        if held is None:
            if text.startswith(_STARTS):
                self.held[prefix], self.ended[prefix] = [line], False
            else:
                self.emit(line)
            return
        inside = not text.strip() or text[0] in " \t" or text.startswith(_CHAINED)
        if self.ended[prefix] and not inside:  # the traceback is over: this line is the command's own
            self._release(prefix)
            self(line)
            return
        held.append(line)
        self.ended[prefix] = not inside

    def flush(self) -> None:
        """Show every traceback still held (its worker's command exited)."""
        for prefix in list(self.held):
            self._release(prefix)

    def _release(self, prefix: str) -> None:
        held = self.held.pop(prefix)
        self.ended.pop(prefix, None)
        in_use = [line for line in held if TPU_IN_USE.search(line)]
        if in_use:
            self.emit(f"{in_use[-1]} (its traceback: this worker's log)")
            return
        for line in held:
            self.emit(line)

"""Stop signals for the processes that supervise an emulation (``local up``, the emulator, the
benchmark's emulated slices): SIGTERM, SIGHUP and Ctrl-C turned into an exception in the main
thread (:func:`signals_raise`), deferred while a first signal's cleanup runs
(:func:`signals_deferred`), held until work that cannot be interrupted ends
(:func:`signals_held`), and remembered so that a stop whose exception was dropped or
rewrapped still ends the run (:func:`signal_received`, :func:`raise_if_signalled`).
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

#: How many :func:`signals_deferred` blocks are open (their signals are ignored meanwhile).
_deferred = 0
#: How many :func:`signals_held` blocks are open, and the first stop that arrived inside them.
_held = 0
_pending: tuple[Callable[[str], BaseException], str] | None = None


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Inside, a signal of :func:`signals_raise` is remembered instead of raised, and raised when
    the outermost block ends: for work that an exception from a signal handler cannot unwind.
    Importing jax is such work: its C++ extension (jaxlib, nanobind) runs Python code while it
    initializes, and an exception raised there aborts the process (``terminate called after
    throwing an instance of 'nanobind::python_error'``, SIGABRT) instead of stopping it cleanly."""
    global _held, _pending
    _held += 1
    try:
        yield
    finally:
        _held -= 1
        if not _held and _pending is not None:
            exception, name = _pending
            _pending = None
            raise exception(name)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Inside, the handlers of :func:`signals_raise` ignore their signals: the cleanup a first
    signal started (stopping every VM) is not cut short by a second one (a second Ctrl-C, or
    SIGINT delivered both to the process group and by a launcher that forwards it)."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1


@contextlib.contextmanager
def signals_raise(
    exception: Callable[[str], BaseException],
    signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGHUP),
) -> Iterator[None]:
    """While inside, each of ``signals`` raises ``exception(<signal name>)`` in the main
    thread (the default action of SIGTERM / SIGHUP would end the process without running
    ``finally`` blocks), except inside :func:`signals_deferred`. Every signal raises again
    outside it: Python runs handlers between any two bytecodes, garbage-collector callbacks
    included, where an exception is dropped (and, inside, not printed either: the
    ``sys.unraisablehook`` skips it), so a sender that needs the process to stop repeats its
    signal (``state.stop_recorded``).
    Previous handlers are restored on exit. Outside the main thread handlers cannot be set,
    and they are left alone."""

    def handler(signum: int, frame: FrameType | None) -> None:
        global _signalled, _pending
        if _deferred:
            return
        _signalled = (exception, signal.Signals(signum).name)
        if _held:
            _pending = _pending or _signalled
            return
        raise exception(signal.Signals(signum).name)

    def unraisable(info: sys.UnraisableHookArgs) -> None:  # a dropped raise: the sender repeats its signal
        if not isinstance(info.exc_value, Interrupt):
            hook(info)

    Interrupt = exception if isinstance(exception, type) else BaseException
    hook = sys.unraisablehook
    previous = {}
    for sig in signals:
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            pass
    if previous:
        sys.unraisablehook = unraisable
    global _depth
    _depth += 1
    try:
        yield
    finally:
        global _signalled
        _depth -= 1
        if not _depth:  # an outer block still needs to know (signal_received)
            _signalled = None
        for sig, old in previous.items():
            signal.signal(sig, old)
        if previous:
            sys.unraisablehook = hook


#: The stop signal :func:`signals_raise` received, as (exception, name); None before any.
#: Kept until the outermost :func:`signals_raise` block is left.
_signalled: tuple[Callable[[str], BaseException], str] | None = None
#: How many :func:`signals_raise` blocks are open.
_depth = 0


def signal_received() -> str | None:
    """The name of the stop signal (``"SIGTERM"``) a :func:`signals_raise` block still open
    received, or None. The exception its handler raised does not always arrive as itself:
    code that catches every exception can turn it into another (numpy's ``__init__`` re-raises
    anything raised while it imports as ``ImportError``), so a caller that sees an unexpected
    exception asks this to tell a stop from a failure."""
    return None if _signalled is None else _signalled[1]


def raise_if_signalled() -> None:
    """Raise again the stop signal :func:`signals_raise` received, if any (outside
    :func:`signals_deferred`): a loop that polls calls this, so that a signal whose exception
    was dropped (raised inside a garbage-collector callback) still stops it, even when the
    sender signals only once (Ctrl-C)."""
    if _signalled is not None and not _deferred:
        exception, name = _signalled
        raise exception(name)

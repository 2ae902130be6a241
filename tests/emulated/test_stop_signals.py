"""infra/emulated/stop_signals.py: stop signals raised in the main thread, deferred during cleanup,
remembered until the outermost block is left."""

from __future__ import annotations

import signal
import threading

import pytest

from infra.emulated import stop_signals


class Stop(Exception):
    pass


def test_signals_raise_in_the_main_thread_and_restore_the_handlers():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(Stop, match=sig.name):
            with stop_signals.signals_raise(Stop):
                assert signal.getsignal(signal.SIGINT) is before[signal.SIGINT]  # not asked for
                signal.raise_signal(sig)
    with pytest.raises(Stop, match="SIGINT"):
        with stop_signals.signals_raise(Stop, (signal.SIGINT,)):
            signal.raise_signal(signal.SIGINT)
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_signals_raise_leaves_handlers_alone_outside_the_main_thread():
    before = signal.getsignal(signal.SIGTERM)
    seen = []

    def body():
        with stop_signals.signals_raise(Stop):
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=30)
    assert seen == [before]


def test_signals_are_ignored_while_cleanup_runs_and_raise_again_after():
    # SIGINT sent to a process group reaches the CLI twice when its launcher forwards it too:
    # the second must not interrupt the cleanup the first one started.
    cleaned = []
    with pytest.raises(Stop, match="SIGINT"):
        with stop_signals.signals_raise(Stop, (signal.SIGINT, signal.SIGTERM)):
            try:
                signal.raise_signal(signal.SIGINT)
            finally:
                with stop_signals.signals_deferred():
                    signal.raise_signal(signal.SIGINT)  # ignored: the cleanup goes on
                    signal.raise_signal(signal.SIGTERM)
                    cleaned.append(True)
    assert cleaned == [True]
    # A raise that was dropped (a garbage-collector callback) is not the end: the next raises.
    with pytest.raises(Stop, match="SIGTERM"):
        with stop_signals.signals_raise(Stop):
            try:
                signal.raise_signal(signal.SIGTERM)
            except Stop:
                pass  # dropped
            signal.raise_signal(signal.SIGTERM)


def test_a_stop_signal_whose_exception_was_dropped_is_raised_again_by_the_poll():
    """Python can run a signal handler inside a garbage-collector callback, where its exception
    is dropped; Ctrl-C is sent once, so the emulator's poll loop asks again."""
    import os
    import signal as signal_lib

    from infra.emulated import stop_signals as stop_signals_lib

    class Stop(Exception):
        pass

    with stop_signals_lib.signals_raise(Stop, (signal_lib.SIGINT,)):
        stop_signals_lib.raise_if_signalled()  # nothing received yet: no-op
        try:
            os.kill(os.getpid(), signal_lib.SIGINT)
            for _ in range(1000):  # the handler runs between bytecodes
                pass
        except Stop:
            pass  # dropped, as inside a GC callback
        with pytest.raises(Stop, match="SIGINT"):
            stop_signals_lib.raise_if_signalled()
        with stop_signals_lib.signals_deferred():
            stop_signals_lib.raise_if_signalled()  # cleanup is not interrupted
    stop_signals_lib.raise_if_signalled()  # outside: forgotten


def test_an_outer_block_still_knows_the_stop_signal_an_inner_block_received():
    """numpy's ``__init__`` re-raises whatever is raised while it imports as ImportError: a
    SIGTERM that lands there arrives as an ImportError, and only ``signal_received`` tells
    ``local up`` that it was stopped."""

    class Inner(Exception):
        pass

    assert stop_signals.signal_received() is None
    with stop_signals.signals_raise(Stop, (signal.SIGTERM,)):
        with pytest.raises(ImportError):
            with stop_signals.signals_raise(Inner, (signal.SIGTERM,)):
                try:
                    signal.raise_signal(signal.SIGTERM)
                except Inner as err:
                    raise ImportError("numpy._core.multiarray failed to import") from err
        assert stop_signals.signal_received() == "SIGTERM"  # the inner block was left
    assert stop_signals.signal_received() is None  # forgotten once the outermost block is left


class _Stop(Exception):
    pass


def test_a_signal_inside_signals_held_is_raised_when_the_block_ends():
    """A stop during work a raise cannot unwind (jax's C++ import) waits for that work to end."""
    reached = []
    with pytest.raises(_Stop, match="SIGTERM"), stop_signals.signals_raise(_Stop):
        with stop_signals.signals_held():
            signal.raise_signal(signal.SIGTERM)
            reached.append("after the signal, inside")
        reached.append("after the block")  # not reached: the held stop is raised at its end
    assert reached == ["after the signal, inside"]

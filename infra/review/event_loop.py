"""The shared event loop and threads of repeated program evaluations in one process
(:mod:`infra.review.program_mocks`: the tests, ``multislice check`` and ``diff``): what a failed
evaluation leaves is cancelled and collected here (:func:`cancel_leftovers`), a loop is there for
Pulumi's runtime (:func:`ensure_event_loop`), and tracebacks parse nothing
(:func:`tracebacks_parse_nothing`).
"""

from __future__ import annotations

#: The function of Python 3.11's ``traceback`` that parses a source line (``ast.parse``) to draw the
#: ``^~~~`` markers under a failed expression; a formatting of a traceback calls it.
_CARET_ANCHORS = "_extract_caret_anchors_from_line_segment"


def tracebacks_parse_nothing() -> None:
    """Format tracebacks without their ``^~~~`` markers in this process, from its first evaluation on.
    A refused stack fails an Output while other threads of the mocks' monitor still run, and a
    traceback formatted for it in one thread parses the failed line with ``ast.parse``, whose recursion
    counter Python 3.11 does not keep per thread: a parse in another thread at that moment (the
    trainer's source, read for the release; a test reading modules) then fails with "AST constructor
    recursion depth mismatch" instead of the stack's one-line refusal
    (https://github.com/python/cpython/issues/106905; seen in 2 of 4 runs of tests/program with three
    workers). A failed evaluation's leftovers can still be collected, and their tracebacks formatted,
    after it returned, so the markers stay off for the rest of the process (``multislice check`` and
    ``diff``, or a test session). Without them, formatting parses nothing. Where a Python's
    ``traceback`` has no such function, nothing is changed."""
    import traceback

    if getattr(traceback, _CARET_ANCHORS, None) is not None:
        setattr(traceback, _CARET_ANCHORS, _no_anchors)


def _no_anchors(segment: str) -> None:
    """No ``^~~~`` markers for ``segment`` (what ``traceback`` draws when the function finds none)."""
    return None


def cancel_leftovers() -> None:
    """Cancel what a failed evaluation left pending (registrations waiting on the failed
    Output): on the shared event loop they would otherwise run into the next evaluation's mocks.
    Then collect the failed futures here, in this thread: asyncio logs each one's traceback when
    it is collected ("Future exception was never retrieved"), and Python 3.11 formats a
    traceback with ``ast.parse``, whose recursion counter is not thread-safe: formatted from
    another thread while the next evaluation parses the trainer's source
    (``infra.startup.shipped_source``), it fails that parse with "AST constructor recursion
    depth mismatch" (https://github.com/python/cpython/issues/106905)."""
    import asyncio
    import gc

    loop = asyncio.get_event_loop_policy().get_event_loop()
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    gc.collect()


def ensure_event_loop() -> None:
    """Pulumi's runtime asks for the main thread's current event loop; an earlier
    ``asyncio.run`` in this process (Orbax runs its I/O that way) leaves none, and asking then
    raises "There is no current event loop". Put one back, as the interpreter starts with."""
    import asyncio

    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())

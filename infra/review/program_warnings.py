"""The Pulumi program's warnings under mocks, each said once (``multislice diff``).

Pulumi's mock engine logs the program's ``pulumi.log.warn`` messages on the root logger
(``pulumi.runtime.mocks.MockEngine.Log``); ``diff`` evaluates the program of the working tree and of
a revision, so a warning the stack gets on both sides would be printed twice.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _OncePerMessage(logging.Filter):
    """Lets each distinct message through once (:func:`warnings_once`)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


@contextlib.contextmanager
def warnings_once() -> Iterator[None]:
    """While open, the program's warnings under mocks (which Pulumi's mock engine logs on the root
    logger) are each printed once, however many evaluations repeat them: ``diff`` evaluates the
    program of both sides, and a warning the stack gets on both is one line, not two."""
    once = _OncePerMessage()
    root = logging.getLogger()
    root.addFilter(once)
    try:
        yield
    finally:
        root.removeFilter(once)

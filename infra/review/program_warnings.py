"""The Pulumi program's warnings under mocks, printed the way the commands print their own
(``multislice check``, ``diff``).

Pulumi's mock engine logs the program's ``pulumi.log.warn`` messages on the logger it is given
(``pulumi.runtime.mocks.MockEngine.Log``): :data:`PROGRAM_LOG`, which :mod:`infra.review.program_mocks`
gives it. With no handler of its own, its records reach the root logger (the tests' ``caplog``);
while :func:`printed_as_warnings` is open, each record at WARNING or above goes to ``say`` instead
(``infra.cli.options.print_program_warning``: a ``warning:`` line, once per command run). The same
warning comes more than once: ``diff`` evaluates the program of the working tree and of a revision,
and ``check`` evaluates it after ``load_config`` printed the stack's deprecated keys.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

#: The logger the mock engine logs the program's messages on.
PROGRAM_LOG = logging.getLogger("multislice.program")


class _Relay(logging.Handler):
    """Hands each record's message to ``say``."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.say = say

    def emit(self, record: logging.LogRecord) -> None:
        self.say(record.getMessage())


@contextlib.contextmanager
def printed_as_warnings(say: Callable[[str], None]) -> Iterator[None]:
    """While open, each warning the program logs under mocks goes to ``say`` (and nowhere else)."""
    relay = _Relay(say)
    PROGRAM_LOG.addHandler(relay)
    propagate, PROGRAM_LOG.propagate = PROGRAM_LOG.propagate, False
    try:
        yield
    finally:
        PROGRAM_LOG.removeHandler(relay)
        PROGRAM_LOG.propagate = propagate

"""The root logger, kept as it was: :func:`root_logger_kept`."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


@contextlib.contextmanager
def root_logger_kept() -> Iterator[None]:
    """Put the root logger's handlers and level back on leaving the block.

    A command run in this process (typer's CliRunner: `python -m training run`, `data prepare`)
    calls ``logging.basicConfig(force=True)`` with a handler on the runner's stderr, which is
    closed once the command returns; every later record of the process would print
    "--- Logging error --- ValueError: I/O operation on closed file" in the suite's output."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
        root.setLevel(level)

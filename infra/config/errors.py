"""The error of a stack that cannot be used (its file or its values): defined beside the stack
file's reader (:mod:`infra.readers.stack_file`), which raises it first."""

from __future__ import annotations

from infra.readers.stack_file import StackConfigError

__all__ = ["StackConfigError"]

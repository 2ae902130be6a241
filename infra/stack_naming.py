"""How a printed command names a stack so that it works as printed.

A stack is named the same way on every command: ``--stack NAME`` for ``stacks/Pulumi.NAME.yaml``,
``--config-file PATH`` for a stack file anywhere. A hint the tool prints (``see: multislice plan
…``, ``start it with: multislice local up …``) names the stack the way this process read it, so
that a stack kept outside ``stacks/`` is not sent to a ``--stack`` that does not resolve.
"""

from __future__ import annotations

import shlex
from pathlib import Path

#: The file each stack was last read from in this process (``infra.config.load_stack_file``),
#: or None when that was its file in ``stacks/``.
_LOADED_FROM: dict[str, Path | None] = {}


def remember(stack: str, path: Path | None, *, in_stacks_dir: bool = False) -> None:
    """Record that ``stack`` was last read from ``path`` (its file in ``stacks/`` or not), or
    (None) from no file at all: a config map such as the Pulumi engine's."""
    _LOADED_FROM[stack] = None if path is None or in_stacks_dir else Path(path).absolute()


def stack_args(stack: str) -> str:
    """``--stack <stack>`` for a stack of ``stacks/`` (or one not read in this process),
    ``--config-file <absolute path>`` for one read from a file elsewhere, shell-quoted."""
    loaded = _LOADED_FROM.get(stack)
    if loaded is None:
        return f"--stack {shlex.quote(stack)}"
    return f"--config-file {shlex.quote(str(loaded))}"

"""The hints a command prints (``see: multislice …``, ``stop it with: …``, a command in
backticks) and the check that each works as printed: the command exists, its options parse, and
the stack it names resolves (``--stack`` or ``--config-file``), without running it (some start an
emulation). Used by tests/cli/test_hints.py and by the tests that run documented lines."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import typer
import typer.main

from infra.cli import app
from infra.cli.options import load_config

HINT = re.compile(r"(?:`|: )(multislice [^`)\n]+)")


def hints(text: str) -> list[list[str]]:
    """The ``multislice`` commands in ``text``, each as its argument list (without ``multislice``);
    a hint ends at its line's end (output that is not a terminal is never wrapped:
    ``infra.cli.options.UNWRAPPED_WIDTH``)."""
    return [shlex.split(found.strip())[1:] for line in text.splitlines() for found in HINT.findall(line)]


def works_as_printed(args: list[str]) -> None:
    """Parse ``args`` as the CLI would (subcommands, then the command's own options) and resolve
    the stack they name; raises if either fails (the command parser's error, or the ``typer.Exit``
    of the stack's ``error:`` line)."""
    command = typer.main.get_command(app)
    rest = list(args)
    while hasattr(command, "list_commands"):  # a group (typer's own click: no isinstance)
        name, rest = rest[0], rest[1:]
        found = command.get_command(command.context_class(command, info_name="multislice"), name)
        assert found is not None, f"no command {name!r} in {args}"
        command = found
    parsed = command.make_context(command.name, rest)
    assert "stack" in parsed.params, f"{args}: a hint names a command that takes no stack"
    config_file = parsed.params.get("config_file")
    load_config(parsed.params["stack"] or "dev", Path(config_file) if config_file else None)

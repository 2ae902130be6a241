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
from infra.invocation import invocation

#: A printed command: the invocation (``multislice``, a path to it, ``python -m infra.cli`` or
#: ``uv run --frozen [--project P] multislice``: infra.invocation), then its arguments.
INVOCATION = r"(?:(?:\S*uv run --frozen(?: --project \S+)? )?\S*multislice|\S*python\S* -m infra\.cli)"
HINT = re.compile(rf"(?:`|: )({INVOCATION} [^`)\n]+)")
_PREFIX = re.compile(rf"^{INVOCATION} ")


def printed(text: str) -> list[str]:
    """The commands in ``text`` as printed, invocation included; a hint ends at its line's end (output
    that is not a terminal is never wrapped: ``infra.cli.options.UNWRAPPED_WIDTH``)."""
    return [found.strip() for line in text.splitlines() for found in HINT.findall(line)]


def hints(text: str) -> list[list[str]]:
    """The commands in ``text`` (:func:`printed`), each as its argument list without the invocation."""
    return [shlex.split(_PREFIX.sub("", found)) for found in printed(text)]


#: The commands a hint may name that only read (offline: the emulation's state, the stack), which
#: :func:`check_output` runs as printed; the others start, stop or reach the cloud, and are parsed.
READING = (("plan",), ("local", "status"), ("local", "logs"), ("render",))


def works_as_printed(args: list[str]) -> None:
    """Parse ``args`` as the CLI would (subcommands, then the command's own options) and resolve
    the stack they name, if the command takes one; raises if either fails (the command parser's
    error, or the ``typer.Exit`` of the stack's ``error:`` line)."""
    command = typer.main.get_command(app)
    rest = list(args)
    while hasattr(command, "list_commands"):  # a group (typer's own click: no isinstance)
        name, rest = rest[0], rest[1:]
        found = command.get_command(command.context_class(command, info_name="multislice"), name)
        assert found is not None, f"no command {name!r} in {args}"
        command = found
    parsed = command.make_context(command.name, rest)
    if "stack" not in parsed.params:
        return  # a command of no stack (bench shardings): it parsed
    config_file = parsed.params.get("config_file")
    load_config(parsed.params["stack"] or "dev", Path(config_file) if config_file else None)


def check_output(output: str, run) -> list[str]:
    """Every hint in ``output`` (a command's, run in this process) starts with the invocation that
    reaches the CLI from where it ran (:func:`infra.invocation.invocation`), works as printed
    (:func:`works_as_printed`), and, if it only reads (:data:`READING`), runs: ``run(args)`` gives its
    ``(exit code, output)``, which must be 0 or 1 (the command's own failure: no run yet), never
    a usage or stack error (2) or a traceback. Returns the hints checked."""
    found = printed(output)
    for line in found:
        assert line.startswith(f"{invocation()} "), f"{line!r} does not start with {invocation()!r}"
        args = shlex.split(_PREFIX.sub("", line))
        works_as_printed(args)
        if tuple(args[:2]) in READING or tuple(args[:1]) in READING:
            code, text = run(args)
            assert code in (0, 1) and "Traceback" not in text, f"{line!r} as printed: exit {code}\n{text}"
    return found

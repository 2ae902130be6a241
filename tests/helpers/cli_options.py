"""Every parameter of ``multislice``'s command tree, as the tests that drive each option walk it,
with the commands stubbed out and a guard that nothing starts.

Used by tests/cli/test_option_fuzz.py (generated values for each option) and
tests/cli/test_option_refusals.py (the refusals of the command line, one by one)."""

from __future__ import annotations

import functools
import os
import subprocess
from typing import Any

import typer.main
from typer._click.exceptions import UsageError  # typer 0.29 carries its own click

from infra.cli import app
from infra.cli.option_values import error_line

#: The arguments a command needs besides the option under test, for its command line to be whole.
BASE_ARGS = {"data prepare": ["stdlib", "out"], "diff": ["--against", "HEAD"]}
#: The command after ``--`` of the commands that take one.
TRAILING_ARGS = {"exec": ["--", "true"], "local exec": ["--", "true"]}


def commands() -> dict[str, Any]:
    """Every command of the tree, by its path (``local up``), as typer builds it for a run."""
    found: dict[str, Any] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        if hasattr(command, "commands"):  # a group (typer's own click: no isinstance)
            for name, sub in command.commands.items():
                walk(sub, (*path, name))
        else:
            found[" ".join(path)] = command

    walk(typer.main.get_command(app), ())
    return found


def name_of(param: Any) -> str:
    """An option by its longest name (``--stack``), an argument by its name in capitals (``SOURCE``)."""
    opts = [opt for opt in param.opts if opt.startswith("-")]
    return max(opts, key=len) if opts else str(param.name).upper()


def parameters() -> dict[tuple[str, str], Any]:
    """``(command path, parameter name)`` → the parameter, for every parameter of every command."""
    return {(path, name_of(param)): param for path, command in commands().items() for param in command.params}


def parser_of(param: Any) -> Any:
    """The ``parser=`` the parameter was declared with (None: typer's own type)."""
    return param.type_descriptor.parameter_info.parser


def callback_of(param: Any) -> Any:
    """The ``callback=`` the parameter was declared with (typer calls it through a wrapper)."""
    return param.type_descriptor.parameter_info.callback


def command_line(path: str, option: str, value: str) -> list[str]:
    """The arguments (after the command's path) that give ``option`` the value ``value``."""
    return [*BASE_ARGS.get(path, []), f"{option}={value}", *TRAILING_ARGS.get(path, [])]


def parse(path: str, args: list[str], command: Any | None = None) -> Any:
    """``args`` read as the command ``path`` reads its command line, nothing run: its context, or
    the one error line it is refused with (a ``str``: :func:`infra.cli.option_values.error_line`)."""
    command = command or commands()[path]
    try:
        return command.make_context(path.split()[-1], list(args))
    except UsageError as error:
        return error_line(error)


def stub_commands(monkeypatch) -> list[str]:
    """Replace every command's function by one that only records its name (same signature, so the
    options are read as before); the list it records into."""
    ran: list[str] = []

    def apps(typer_app: typer.Typer):
        yield typer_app
        for group in typer_app.registered_groups:
            if group.typer_instance is not None:
                yield from apps(group.typer_instance)

    for typer_app in apps(app):
        for info in typer_app.registered_commands:
            original = info.callback
            assert original is not None

            @functools.wraps(original)
            def stub(*args, __name=original.__name__, **kwargs):
                ran.append(__name)

            monkeypatch.setattr(info, "callback", stub)
    return ran


def forbid_starting_anything(monkeypatch) -> None:
    """A process started (an emulator, a storage server, any subprocess) fails the test."""

    def started(*args, **kwargs):
        raise AssertionError(f"something was started: {args[:2]!r}")

    monkeypatch.setattr(subprocess.Popen, "__init__", started)
    for name in ("fork", "posix_spawn", "posix_spawnp"):
        monkeypatch.setattr(os, name, started)

"""What every ``multislice`` command shares: the consoles, :func:`say` (a progress line),
:func:`fail` (the one ``error:`` line and the exit status), :func:`print_warning` (a ``warning:``
line, once per command run, worded by :mod:`training.warning_text`), the ``--stack`` /
``--config-file`` options and :func:`load_config`, and :func:`state_root` (where local
emulations keep their state).

Errors end with one ``error:`` line naming the cause and a non-zero exit: 2 for bad input
(stack file, options, the tool's environment variables), 1 for a failed run, 130 for Ctrl-C
(SIGINT), 143 for SIGTERM. Before any command runs, :class:`ClosedPipeGroup` refuses, each in that
one line with exit 2, a ``MULTISLICE_*`` variable that cannot mean what it names
(:func:`infra.readers.environment.check_all`) and an option value the command line's parsers
refuse (:mod:`infra.cli.option_values`: numbers, paths, fault specs, ``--stack`` with
``--config-file``).
"""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text
from typer._click.exceptions import UsageError  # typer 0.29 carries its own click
from typer._click.globals import get_current_context
from typer.core import TyperGroup

from infra.cli.option_values import PATH, error_line, one_stack_source
from training.warning_text import PREFIX as WARNING_PREFIX, WarningText


# No emoji codes (":train:" in a key typo is not an emoji) and no markup in user-provided text:
# messages that carry paths, keys or globs are printed with markup=False or as Text.
class _StdoutConsole(Console):
    """rich exits with a silent SystemExit(1) when stdout's reader goes away; raise
    BrokenPipeError instead (after rich's own switch of stdout to /dev/null), so that the
    command can stop its work and say why (:func:`infra.cli.local.stops_when_stdout_closes`)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        stdout_closed()
        raise BrokenPipeError("standard output was closed")


def stdout_closed() -> None:
    """Point standard output at ``/dev/null`` once its reader has gone (``| head``), so that nothing
    written or flushed after that (at the interpreter's exit too) raises again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor (an in-process test runner's stream)
        pass


def _closed_pipe(error: BaseException | None) -> bool:
    """Whether ``error`` (what an exit was raised while handling) is a write to a closed pipe:
    click exits 1 on an EPIPE ``OSError``, rich on a ``BrokenPipeError``; a command's own exit
    (``typer.Exit``) is never one."""
    return isinstance(error, BrokenPipeError) or (isinstance(error, OSError) and error.errno == errno.EPIPE)


class ClosedPipeGroup(TyperGroup):
    """The ``multislice`` group: a command whose standard output's reader goes away (``| head -1``,
    ``| less`` quit early) ends quietly with exit 0 once it has printed what the reader took,
    not with a traceback (rich's console raises BrokenPipeError: :class:`_StdoutConsole`) or click's
    exit 1 (a ``print``'s EPIPE). A command that must stop its work says so itself first
    (``local up``: :func:`infra.cli.local.stops_when_stdout_closes`).

    Before any command runs it refuses, in one ``error:`` line with exit 2, a ``MULTISLICE_*``
    variable :func:`infra.readers.environment.check_all` refuses and a command line the parsers
    refuse (:func:`infra.cli.option_values.error_line`; typer would print a usage box)."""

    def main(self, *args, **kwargs):
        try:
            return super().main(*args, **kwargs)
        except SystemExit as stop:
            # Help and usage are printed before any command runs, by click (exit 1 on EPIPE) or rich
            # (SystemExit(1)): a closed pipe there is still no failure.
            if stop.code == 1 and _closed_pipe(stop.__context__):
                stdout_closed()
                raise SystemExit(0) from None
            raise

    def parse_args(self, ctx, args):
        try:
            return super().parse_args(ctx, args)
        except UsageError as error:
            raise _refused(error) from None

    def invoke(self, ctx):
        from infra.readers import environment

        try:
            environment.check_all()
            return super().invoke(ctx)
        except environment.VariableError as err:
            raise fail(str(err)) from None
        except UsageError as error:  # a subcommand's options (typer would print a multi-line box)
            raise _refused(error) from None
        except BrokenPipeError:
            stdout_closed()
            raise typer.Exit(0) from None
        except OSError as err:
            if err.errno != errno.EPIPE:
                raise
            stdout_closed()
            raise typer.Exit(0) from None


def _refused(error: UsageError) -> Exception:
    """The ``error:`` line of a command line the parsers refused (:func:`infra.cli.option_values.error_line`),
    printed; the exit (2) to raise. A group called without a command shows its help as typer does."""
    if type(error).__name__ == "NoArgsIsHelpError":
        return error
    print_error(error_line(error))
    return typer.Exit(error.exit_code)


#: Width of output that is not a terminal: lines are never wrapped or padded there (a grep for
#: a printed sentence finds it, whatever ``COLUMNS`` says).
UNWRAPPED_WIDTH = 100_000

console = _StdoutConsole(stderr=False, highlight=False, log_path=False, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)
for _console in (console, err_console):
    if not _console.is_terminal:
        _console.width = UNWRAPPED_WIDTH


def say(message: str) -> None:
    """A timestamped progress line; the text is printed as is. In a terminal rich's log line
    (wrapped to the window); otherwise ``[HH:MM:SS] message`` on one line, unpadded."""
    if console.is_terminal:
        console.log(message, markup=False)
    else:
        console.print(f"[{time.strftime('%H:%M:%S')}] {message}", markup=False, soft_wrap=True)


def _flags_take_no_value() -> None:
    """typer 0.29's help shows a ``<bool>`` type next to flags (``--fresh``, ``--json``,
    ``--help``), which take no value; show none (a counting or valued option keeps its type)."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self, ctx):
        return None if self.is_flag and not self.count else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich


_flags_take_no_value()

STACK_OPTION = typer.Option(
    "dev",
    "--stack",
    "-s",
    metavar="NAME",
    callback=one_stack_source,
    help="Stack name: the file stacks/Pulumi.NAME.yaml, or the stack file a local run of NAME was started from.",
)
CONFIG_FILE_OPTION = typer.Option(
    None,
    "--config-file",
    metavar="PATH",
    parser=PATH,
    callback=one_stack_source,
    help="A stack file anywhere (instead of --stack, which it cannot be given with); the stack name is taken from it.",
)


def print_error(message: str) -> None:
    """The ``error: <message>`` line, on stderr."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)


def print_warning(warning: WarningText) -> None:
    """The ``warning: <text>`` line of ``warning`` (:mod:`training.warning_text`: it says whether the
    user must act), on stderr, unless this command run printed it already."""
    _print_warning_once(warning)


def print_program_warning(text: str) -> None:
    """A warning the Pulumi program gave under mocks (``check``, ``diff``:
    :func:`infra.review.program_warnings.printed_as_warnings`), as :func:`print_warning` prints one:
    once per command run, so a deprecated key ``load_config`` named is not named again, nor a warning
    both sides of a ``diff`` give."""
    _print_warning_once(text)


def _print_warning_once(text: str) -> None:
    context = get_current_context(silent=True)
    printed: set[str] = set() if context is None else context.find_root().meta.setdefault("multislice.warned", set())
    if text in printed:
        return
    printed.add(text)
    err_console.print(Text.assemble((WARNING_PREFIX, "bold yellow"), " ", text), soft_wrap=True)


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print the ``error:`` line; the exit to raise (``raise fail(...)``)."""
    print_error(message)
    return typer.Exit(code)


def recorded_stack_file(stack: str) -> Path | None:
    """The stack file a ``local up --config-file`` of stack ``stack`` ran from, if it still
    exists (``infra.emulated.state.LocalPaths.stack_file_record``); the ``error:`` line and exit 2
    when that record is damaged."""
    from infra.emulated.state import LocalPaths
    from infra.readers.state_records import DamagedRecord, recorded_stack_file as read_record

    record = LocalPaths(state_root() / stack).stack_file_record
    try:
        return read_record(record)
    except DamagedRecord as err:
        raise fail(
            f"the record of the stack file a local run of stack {stack} started from ({record}) is damaged: "
            f"{err.why}; remove it, or name the stack file with --config-file"
        ) from None


def stack_source(stack: str, config_file: Path | None) -> Path | None:
    """The file that names the stack, the same way for every command: ``--config-file``, else
    ``stacks/Pulumi.<stack>.yaml``, else the stack file a local run of ``stack`` was started from;
    None when neither exists."""
    from infra.config import stack_file

    if config_file is not None:
        return config_file
    in_stacks = stack_file(stack)
    return in_stacks if in_stacks.is_file() else recorded_stack_file(stack)


def resolved_stack_source(stack: str, config_file: Path | None) -> Path:
    """:func:`stack_source`, or the ``error:`` line and exit 2 that every command gives when
    neither ``stacks/`` nor a local run's record names the stack (the stacks there listed)."""
    from infra.config import StackConfigError, load_stack, stack_file

    source = stack_source(stack, config_file)
    if source is not None:
        return source
    try:
        load_stack(stack)  # missing: its error lists the stacks there
    except StackConfigError as err:
        suffix = "; no local run of it was started from a stack file; a stack file anywhere: --config-file PATH"
        raise fail(f"{err}{suffix}") from None
    return stack_file(stack)  # made since stack_source looked


def load_config(stack: str, config_file: Path | None):
    """The stack named by ``--stack`` / ``--config-file`` (:func:`stack_source`), validated; the
    ``error:`` line and exit 2 when it cannot be read or named."""
    from infra.config import StackConfigError, load_stack, load_stack_file, stack_file

    source = resolved_stack_source(stack, config_file)
    try:
        config = load_stack(stack) if source == stack_file(stack) else load_stack_file(source)
    except StackConfigError as err:
        raise fail(str(err)) from None
    for warning in config.deprecation_warnings:
        print_warning(warning)
    return config


def render_release(config):
    """The stack's rendered startup script (:func:`infra.startup.render`), or the ``error:`` line and
    exit 2 when the release cannot be built from the stack's input (a workload's requirements or
    source, a script over its limit: every such error is a ``ValueError`` naming the key). Every
    review command calls it, so each refuses what ``render`` refuses, the same way."""
    from infra import startup

    try:
        return startup.render(config)
    except ValueError as err:
        raise fail(str(err)) from None


def state_root() -> Path:
    """Where local emulations keep their state: ``$MULTISLICE_STATE_DIR`` or
    ``<project>/.multislice/local``."""
    from infra.config import default_stacks_dir
    from infra.readers import environment

    return environment.state_dir() or default_stacks_dir().resolve().parent / ".multislice" / "local"

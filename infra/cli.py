"""``multislice``: the command line.

    multislice local up [--stack dev] [--kill 1@40] [--preempt 0@80] [--fresh] [--summary-json F]
    multislice local down [--stack dev]
    multislice local status [--stack dev]                           (infra/local_cli.py)
    multislice status --stack prod [--json] [--watch] [--plot F]    (infra/status_cli.py)
    multislice render --stack prod [-o script.sh] [--config]
    multislice check --stack prod [--policy-config policy.json]     (infra/review_cli.py)
    multislice plan --stack prod [--json]
    multislice bench shardings --ici-fsdp 4 [--dcn-data 2] [--json]

Errors end with one ``error:`` line naming the cause and a non-zero exit: 2 for bad input
(stack file, options), 1 for a failed run, 130 for Ctrl-C (SIGINT), 143 for SIGTERM.

Commands that neither train nor evaluate the program import nothing heavy (no jax, orbax,
tensorstore: tests/test_cli_imports.py; benchmarks/cli_speed.py times them): each command
imports what it needs inside its function, after checking its options.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer
from rich.console import Console
from rich.text import Text

from training.bench_spec import BenchOptions, with_bench_options

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Converge and emulate Cloud TPU Multislice training environments.",
)

# No emoji codes (":train:" in a key typo is not an emoji) and no markup in user-provided text:
# messages that carry paths, keys or globs are printed with markup=False or as Text.
class _StdoutConsole(Console):
    """rich exits with a silent SystemExit(1) when stdout's reader goes away; raise
    BrokenPipeError instead (after rich's own switch of stdout to /dev/null), so that the
    command can stop its work and say why (:func:`infra.local_cli.stops_when_stdout_closes`)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise BrokenPipeError("standard output was closed")


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

STACK_OPTION = typer.Option("dev", "--stack", "-s", metavar="NAME", help="Stack name: the file stacks/Pulumi.NAME.yaml.")
CONFIG_FILE_OPTION = typer.Option(
    None, "--config-file", metavar="PATH", help="A stack file anywhere (instead of --stack); the stack name is taken from it."
)


def fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    return typer.Exit(code)


def load_config(stack: str, config_file: Path | None):
    from infra.config import StackConfigError, load_stack, load_stack_file

    try:
        return load_stack_file(config_file) if config_file else load_stack(stack)
    except StackConfigError as err:
        raise fail(str(err)) from None


def state_root() -> Path:
    """Where local emulations keep their state: ``$MULTISLICE_STATE_DIR`` or
    ``<project>/.multislice/local``."""
    from infra.config import default_stacks_dir

    env = os.environ.get("MULTISLICE_STATE_DIR")
    return Path(env) if env else default_stacks_dir().resolve().parent / ".multislice" / "local"


@app.command()
def render(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write the script here instead of stdout."),
    resolved_config: bool = typer.Option(
        False, "--config", help="Print the resolved stack config (every key, defaults filled in) instead of the script."
    ),
) -> None:
    """Print the stack's startup script: the exact bytes every TPU VM of the stack boots."""
    from infra import startup

    config = load_config(stack, config_file)
    if resolved_config:
        from infra.config.resolved import resolved_config_yaml

        typer.echo(resolved_config_yaml(config), nl=False)
        return
    try:
        script = startup.render(config)
    except ValueError as err:
        raise fail(str(err)) from None
    if output:
        try:
            output.write_text(script.text)
        except OSError as err:
            raise fail(f"--output {output}: {err.strerror or err}") from None
        err_console.print(
            f"wrote {output}: {script.size_bytes} bytes, script sha256 {script.sha256}, " f"bundle sha256 {script.bundle_sha256}"
        )
    else:
        typer.echo(script.text, nl=False)


@app.command("plan")
def plan_command(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    json_output: bool = typer.Option(False, "--json", help="Print the plan as JSON (for machines)."),
) -> None:
    """Before `pulumi up`: the mesh, per-chip memory against HBM, and the Multislice overview's DCN check."""
    from infra import planner
    from infra.planner.render import print_plan

    config = load_config(stack, config_file)
    try:
        result = planner.plan(config)
    except ValueError as err:
        raise fail(str(err)) from None
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        print_plan(result, console)


bench_app = typer.Typer(no_args_is_help=True, help="Measure what a mesh achieves (training/bench.py).")
app.add_typer(bench_app, name="bench")


@bench_app.command("shardings")
@with_bench_options
def bench_shardings(
    options: BenchOptions,
    timeout: float = typer.Option(600, "--timeout", min=1, help="Give up on emulated slices after this many seconds."),
) -> None:
    """The Multislice overview's MLP-stack experiment over a (dcn × ici) mesh: TFLOP/s per device and the
    efficiency against one large matmul measured in the same run. --dcn-* > 1 without TPU
    slices runs one emulated slice per local CPU process."""
    from infra.local import bench_slices
    from training import bench

    try:
        spec = options.spec()
        result = bench_slices.run(spec, timeout_s=timeout, report=lambda line: err_console.print(line, markup=False, soft_wrap=True))
    except bench.BenchConfigError as err:
        raise fail(str(err)) from None
    except bench.BenchError as err:
        raise fail(str(err), 1) from None
    except KeyboardInterrupt:
        raise fail("interrupted; every benchmark process was stopped", 130) from None
    except Exception as err:  # jax raises JaxRuntimeError (RESOURCE_EXHAUSTED) when arrays do not fit
        if "memory" not in str(err).lower() and "RESOURCE_EXHAUSTED" not in str(err):
            raise
        first = str(err).splitlines()[0]
        raise fail(f"out of memory: {first}; reduce --batch-size, --embedding-dimension or --layers", 1) from None
    if options.json_output:
        typer.echo(json.dumps(result, indent=2))
    else:
        console.print(bench.summary(result), markup=False, soft_wrap=True)


if __name__ == "__main__":
    # ``python -m infra.cli``: run the module as imported (``infra.cli``), where the command
    # modules below register on ``app``; they import their helpers from ``infra.cli``.
    from infra.cli import app as _app

    _app()
else:
    from infra import local_cli, review_cli  # their commands use the helpers above

    local_cli.register(app)
    review_cli.register(app)
    from infra.status_cli import register as register_status  # `multislice status`: infra/status_cli.py

    register_status(app)

    from infra import logs_cli  # `multislice logs`, `multislice local logs`
    logs_cli.register(app)

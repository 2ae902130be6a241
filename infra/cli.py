"""``multislice``: the command line.

    multislice local up [--stack dev] [--kill 1@40] [--preempt 0@80] [--fresh] [--summary-json F]
    multislice local down [--stack dev]
    multislice local status [--stack dev]
    multislice render --stack prod [-o script.sh] [--config]
    multislice check --stack prod [--policy-config policy.json]     (infra/review_cli.py)
    multislice plan --stack prod [--json]
    multislice bench shardings --ici-fsdp 4 [--dcn-data 2] [--json]

Errors end with one ``error:`` line naming the cause and a non-zero exit: 2 for bad input
(stack file, options), 1 for a failed run, 130 for Ctrl-C.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from training.bench_spec import BenchOptions, with_bench_options

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Converge and emulate Cloud TPU Multislice training environments.",
)
local_app = typer.Typer(no_args_is_help=True, help="Run a stack's queued resource on this machine (no cloud).")
app.add_typer(local_app, name="local")

# No emoji codes (":train:" in a key typo is not an emoji) and no markup in user-provided text:
# messages that carry paths, keys or globs are printed with markup=False or as Text.
class _StdoutConsole(Console):
    """rich exits with a silent SystemExit(1) when stdout's reader goes away; raise
    BrokenPipeError instead (after rich's own switch of stdout to /dev/null), so that the
    command can stop its work and say why (:func:`stops_when_stdout_closes`)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise BrokenPipeError("standard output was closed")


console = _StdoutConsole(stderr=False, highlight=False, log_path=False, emoji=False)
err_console = Console(stderr=True, highlight=False, emoji=False)


def say(message: str) -> None:
    """A timestamped progress line; the text is printed as is."""
    console.log(message, markup=False)

STACK_OPTION = typer.Option("dev", "--stack", "-s", help="Stack name: stacks/Pulumi.<stack>.yaml.")
CONFIG_FILE_OPTION = typer.Option(
    None, "--config-file", help="A stack file anywhere (instead of --stack); the stack name is taken from it."
)


def fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    return typer.Exit(code)


def load_config(stack: str, config_file: Optional[Path]):
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


def local_paths(config):
    from infra.local.state import LocalPaths

    return LocalPaths(state_root() / config.stack, config.effective_run_name)


def print_summary(result: dict) -> None:
    table = Table(title="run summary", show_header=False, title_justify="left")
    for key in ("complete", "steps_completed", "total_steps", "final_loss", "final_eval_loss", "restarts",
                "steps_lost", "training_seconds", "wall_seconds", "faults", "run_dir", "logs_dir"):
        if key in result:
            value = result[key]
            if isinstance(value, float):
                value = f"{value:.4f}"
            elif isinstance(value, list):
                value = "; ".join(value) or "none"
            table.add_row(key, Text(str(value)))
    console.print(table)


def stops_when_stdout_closes(command):
    """``multislice local up | head``: when the reader goes away, the next progress line
    raises BrokenPipeError and the emulation stops (its ``finally`` stops every VM). Say so on
    stderr instead of rich's silent exit 1. (A run that completed anyway exits 0: local_up
    handles that case itself.)"""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
            raise fail("standard output was closed (e.g. by `| head`); every emulated VM was stopped "
                       "(run `multislice local up` again to resume)", 1) from None

    return wrapper


@local_app.command("up")
@stops_when_stdout_closes
def local_up(
    stack: str = STACK_OPTION,
    config_file: Optional[Path] = CONFIG_FILE_OPTION,
    kill: list[str] = typer.Option([], "--kill", metavar="SLICE@STEP", help="SIGKILL a slice's VMs at a step (hardware fault). Repeatable."),
    preempt: list[str] = typer.Option([], "--preempt", metavar="SLICE@STEP", help="SIGTERM a slice's VMs at a step (preemption notice), SIGKILL after the grace period. Repeatable."),
    fresh: bool = typer.Option(False, "--fresh", help="Discard the stack's previous local run and start over."),
    summary_json: Optional[Path] = typer.Option(None, "--summary-json", help="Also write the summary as JSON here."),
    coordinator_port: Optional[int] = typer.Option(None, "--coordinator-port", min=1, max=65535, help="Fixed jax.distributed coordinator port (default: a free one)."),
    timeout: float = typer.Option(3600, "--timeout", min=1, help="Give up after this many seconds."),
    stall_timeout: float = typer.Option(600, "--stall-timeout", min=1, help="Give up after this many seconds without a new training step."),
    preempt_grace: float = typer.Option(30, "--preempt-grace", min=0, help="Seconds between SIGTERM and SIGKILL for --preempt (GCE: 30)."),
    heartbeat_timeout: int = typer.Option(10, "--heartbeat-timeout", min=2, help="jax.distributed heartbeat timeout (s) in the emulated VMs."),
) -> None:
    """Run the stack's multislice queued resource as local processes and train to completion.

    Resumes an unfinished run; reports a finished one without retraining (--fresh starts over).
    """
    from infra import startup
    from infra.local import emulator, summary
    from infra.local import state as local_state
    from infra.local.faults import FaultSpecError, parse_fault
    from training.checkpointing import is_complete

    config = load_config(stack, config_file)
    paths = local_paths(config)
    total = config.training.steps
    check_local_data_source(config.training.data.source)
    try:
        faults = [parse_fault("kill", spec, slices=config.slices, total_steps=total) for spec in kill]
        faults += [parse_fault("preempt", spec, slices=config.slices, total_steps=total) for spec in preempt]
    except FaultSpecError as err:
        raise fail(str(err)) from None
    lock = local_state.acquire_lock(paths)
    state = local_state.read_state(paths)
    if lock is None:
        pid = state.get("pid", "?") if state else "?"
        raise fail(
            f"a local run of stack {config.stack!r} is already running (pid {pid}); "
            f"stop it with: multislice local down --stack {config.stack}"
        )
    if state:  # leftovers of an emulator that died (we hold the lock: it is not running)
        for action in local_state.stop_recorded(paths, signal_emulator=False):
            say(f"cleanup of an earlier run: {action}")
    if summary_json is not None:
        problem = _unwritable(summary_json)
        if problem:
            raise fail(f"--summary-json {summary_json}: {problem}")
    if coordinator_port is not None:
        try:
            emulator.check_port_free(coordinator_port)
        except emulator.EmulationError as err:
            raise fail(str(err)) from None
    if fresh:
        if local_state.discard_run(paths):
            say(f"--fresh: discarded the previous run of stack {config.stack!r}")
    elif is_complete(str(paths.run_dir), total):
        result = summary.summarize(paths.run_dir, total) | {"wall_seconds": 0.0}
        say(f"run {paths.run_dir} is already complete; nothing to do (use --fresh to start over)")
        if faults:
            say("note: the requested faults were not injected: the run is complete")
        print_summary(result)
        _write_summary(summary_json, result)
        return
    try:
        script = startup.render(config)
    except ValueError as err:
        raise fail(str(err)) from None
    say(
        f"stack {config.stack}: {config.slices} × {config.accelerator_type} ({config.total_workers} VMs), "
        f"{total} steps, run dir {paths.run_dir}"
    )
    cores = os.cpu_count() or 1
    if config.total_workers > 2 * cores:
        say(
            f"warning: {config.total_workers} emulated VMs × {config.accelerator.chips_per_host} CPU devices on "
            f"{cores} cores: expect slow steps and long compiles"
        )
    resource = emulator.LocalQueuedResource(config, paths, script.text, report=say)
    options = emulator.Options(
        faults=faults,
        coordinator_port=coordinator_port,
        heartbeat_timeout_s=heartbeat_timeout,
        preempt_grace_s=preempt_grace,
        timeout_s=timeout,
        stall_timeout_s=stall_timeout,
    )
    try:
        result = resource.up(options)
    except BrokenPipeError:
        if not is_complete(str(paths.run_dir), total):
            raise  # stops_when_stdout_closes says so
        result = summary.summarize(paths.run_dir, total)  # the last step's line found no reader
    except emulator.Interrupted as err:
        why = "stopped by SIGTERM (e.g. `multislice local down`)" if str(err) == "SIGTERM" else f"interrupted ({err})"
        raise fail(f"{why}; every emulated VM was stopped (run `multislice local up` again to resume)", 130) from None
    except emulator.EmulationError as err:
        raise fail(str(err), 1) from None
    _write_summary(summary_json, result)
    try:
        print_summary(result)
    except BrokenPipeError:
        if not result["complete"]:
            raise
        return  # the run is complete; nobody reads the summary table
    if not result["complete"]:
        raise fail("the VMs exited but the run is not complete", 1)


def check_local_data_source(source: str) -> None:
    """Fail before anything starts if the emulated VMs could not read the training data."""
    from training.data import DataError, list_source_files

    if source == "stdlib":
        return
    if "://" in source:
        raise fail(
            f"multislice:training.data.source {source!r}: the local emulation reads only 'stdlib' or local "
            "files; use a stack whose data source is local (e.g. --config-file with source: /path/*.txt)"
        )
    try:
        list_source_files(source)
    except DataError as err:
        raise fail(f"multislice:{err}") from None


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file, or None (checked before any work starts)."""
    if path.is_dir():
        return "is a directory"
    parent = path.parent if str(path.parent) else Path(".")
    existing = next((p for p in [parent, *parent.parents] if p.exists()), None)
    if existing is None or not existing.is_dir():
        return f"{existing or parent} is not a directory"
    if not os.access(existing, os.W_OK):
        return f"{existing} is not writable"
    return None


def _write_summary(path: Optional[Path], result: dict) -> None:
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        except OSError as err:
            raise fail(f"--summary-json {path}: {err.strerror or err}", 1) from None


@local_app.command("down")
def local_down(stack: Optional[str] = typer.Option(None, "--stack", "-s", help="Only this stack (default: every stack).")) -> None:
    """Stop local runs (every emulated VM process and the emulator), keeping their run directories."""
    from infra.local.state import LocalPaths, stop_recorded

    root = state_root()
    stacks = [stack] if stack else sorted(p.parent.name for p in root.glob("*/emulator.json"))
    stopped = False
    for name in stacks:
        actions = stop_recorded(LocalPaths(root / name, name))
        for action in actions:
            console.print(f"{name}: {action}", markup=False)
        stopped = stopped or bool(actions)
    if not stopped:
        console.print("no local run is running")


@local_app.command("status")
def local_status(stack: str = STACK_OPTION, config_file: Optional[Path] = CONFIG_FILE_OPTION) -> None:
    """Show whether the stack's local run is running, and its progress."""
    from infra.local import state as local_state
    from infra.local import summary

    config = load_config(stack, config_file)
    paths = local_paths(config)
    state = local_state.read_state(paths)
    running = bool(state and local_state.emulator_alive(state))
    orphans = local_state.find_processes(state["emulation_id"]) if state and state.get("emulation_id") else []
    if running:
        console.print(f"stack {config.stack}: running (pid {state['pid']})", markup=False)
    elif orphans:
        console.print(
            f"stack {config.stack}: the emulator is gone but {len(orphans)} emulated VM process(es) still run; "
            f"stop them with: multislice local down --stack {config.stack}",
            markup=False,
        )
    else:
        console.print(f"stack {config.stack}: not running", markup=False)
    if paths.run_dir.exists():
        print_summary(summary.summarize(paths.run_dir, config.training.steps))


@app.command()
def render(
    stack: str = STACK_OPTION,
    config_file: Optional[Path] = CONFIG_FILE_OPTION,
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write the script here instead of stdout."),
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
            f"wrote {output}: {script.size_bytes} bytes, script sha256 {script.sha256}, bundle sha256 {script.bundle_sha256}"
        )
    else:
        typer.echo(script.text, nl=False)


@app.command("plan")
def plan_command(
    stack: str = STACK_OPTION,
    config_file: Optional[Path] = CONFIG_FILE_OPTION,
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


from infra import review_cli  # noqa: E402  (its commands use the helpers above)

review_cli.register(app)

if __name__ == "__main__":
    app()



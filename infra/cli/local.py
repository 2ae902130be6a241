"""``multislice local up | down | status``: a stack's queued resource emulated on this machine.

The ``local`` command group (``local logs``: :mod:`infra.cli.logs`). ``local up`` checks its
options, runs :func:`infra.local.lifecycle.run_recorded` (the lock, the recorded state, the
stop signals, the emulation: :mod:`infra.local`) and prints the summary. Errors as in
:mod:`infra.cli.options`: one ``error:`` line, exit 2 for bad input, 1 for a failed run, 130
for Ctrl-C, 143 for SIGTERM. A stack state that cannot be read (the state directory is not one,
``emulator.json`` is damaged: :class:`infra.emulated.state.StateError`) is bad input to every
command of the group (:class:`LocalGroup`).
"""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import typer
from typer.core import TyperGroup

from infra.cli import option_values as values
from infra.cli.options import (
    CONFIG_FILE_OPTION,
    STACK_OPTION,
    console,
    err_console,
    fail,
    load_config,
    print_error,
    say,
    state_root,
)
from infra.cli.run_summary import print_summary, summary_path_problem, write_summary_json
from infra.cli.status import INTERVAL_OPTION, JSON_OPTION, PLOT_OPTION, WATCH_OPTION, show_local


class LocalGroup(TyperGroup):
    """The ``local`` group: any of its commands (``exec``, ``reset`` and ``logs`` too, declared in
    their own modules) that meets a state it cannot read (:class:`infra.emulated.state.StateError`,
    raised by ``read_state`` wherever the command reads it) ends with its ``error:`` line, exit 2."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except Exception as err:
            state = sys.modules.get("infra.emulated.state")  # not imported: the error is not one of its
            if state is None or not isinstance(err, state.StateError):
                raise
            raise fail(str(err)) from None


#: The ``local`` command group.
app = typer.Typer(
    cls=LocalGroup, no_args_is_help=True, help="Run a stack's queued resource on this machine (no cloud)."
)


def local_paths(config):
    from infra.emulated.state import LocalPaths

    return LocalPaths(state_root() / config.stack)


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
            import shlex

            from infra.invocation import invocation

            named = kwargs.get("config_file")
            stack = f"--config-file {shlex.quote(str(named))}" if named else f"--stack {shlex.quote(kwargs['stack'])}"
            raise fail(
                "standard output was closed (e.g. by `| head`); every emulated VM was stopped "
                f"(run `{invocation()} local up {stack}` again to resume)",
                1,
            ) from None

    return wrapper


@app.command("up")
@stops_when_stdout_closes
def local_up(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    kill: list[str] = typer.Option(
        [],
        "--kill",
        metavar="SLICE@STEP",
        parser=values.KILL,
        help="SIGKILL a slice's VMs at a step (hardware fault). Repeatable.",
    ),
    preempt: list[str] = typer.Option(
        [],
        "--preempt",
        metavar="SLICE@STEP",
        parser=values.PREEMPT,
        help="SIGTERM a slice's VMs at a step (preemption notice), SIGKILL after the grace period. Repeatable.",
    ),
    crash: list[str] = typer.Option(
        [],
        "--crash",
        metavar="SLICE@STEP",
        parser=values.CRASH,
        help="SIGKILL a slice's trainers at a step (application failure); the VMs stay up. Repeatable.",
    ),
    withhold: list[str] = typer.Option(
        [],
        "--withhold",
        metavar="SLICE:WHEN",
        parser=values.WITHHOLD,
        callback=values.distinct_withholds,
        help="After the first fault that strikes SLICE, leave it without capacity: WHEN is a duration (1:120s) or "
        "until-step-STEP, until the run reaches STEP (1:until-step-80; elastic stacks: docs/faults.md). Once a slice.",
    ),
    hold_at: list[int] = typer.Option(
        [],
        "--hold-at",
        parser=values.STEP,
        metavar="STEP",
        envvar="MULTISLICE_HOLD_AT",
        help="The emulated trainers wait after STEP until the file <state dir>/<stack>/holds/STEP exists "
        "(for scripts and tests that act on a run in progress: docs/emulation.md). Repeatable; "
        "$MULTISLICE_HOLD_AT: steps separated by spaces.",
    ),
    fresh: bool = typer.Option(False, "--fresh", help="Discard the stack's previous local run and start over."),
    summary_json: Path | None = typer.Option(
        None, "--summary-json", metavar="PATH", parser=values.PATH, help="Also write the summary as JSON here."
    ),
    coordinator_port: int | None = typer.Option(
        None,
        "--coordinator-port",
        parser=values.PORT,
        metavar="PORT",
        help="Fixed jax.distributed coordinator port (default: a free one).",
    ),
    gcs_port: int | None = typer.Option(
        None,
        "--gcs-port",
        parser=values.PORT,
        metavar="PORT",
        help="Fixed port of the emulated Cloud Storage (default: a free one).",
    ),
    timeout: float = typer.Option(
        3600, "--timeout", parser=values.seconds(1), metavar="SECONDS", help="Give up after this many seconds."
    ),
    stall_timeout: float = typer.Option(
        600,
        "--stall-timeout",
        parser=values.seconds(1),
        metavar="SECONDS",
        help="Give up after this many seconds without a new training step.",
    ),
    boot_timeout: float | None = typer.Option(
        None,
        "--boot-timeout",
        parser=values.seconds(1),
        metavar="SECONDS",
        help="Name a VM whose trainer has not started this many seconds after its boot "
        "(default: $MULTISLICE_BOOT_TIMEOUT, else 120).",
    ),
    preempt_grace: float = typer.Option(
        30,
        "--preempt-grace",
        parser=values.seconds(0),
        metavar="SECONDS",
        help="Seconds between SIGTERM and SIGKILL for --preempt (GCE: 30).",
    ),
    heartbeat_timeout: int = typer.Option(
        10,
        "--heartbeat-timeout",
        parser=values.seconds(2, 86_400, whole=True, note="a day; jax.distributed takes a C integer"),
        metavar="SECONDS",
        help="jax.distributed heartbeat timeout (s) in the emulated VMs.",
    ),
) -> None:
    """Run the stack's multislice queued resource as local processes and train to completion.

    Resumes an unfinished run; reports a finished one without retraining (--fresh starts over).
    """
    from infra.emulated.ports import bind_error
    from infra.local import lifecycle
    from infra.local.faults import FaultSpecError
    from infra.local.options import Options, fault_options

    # Options first, with nothing heavy imported: a typo is reported at once.
    config = load_config(stack, config_file)
    total = config.total_steps
    try:
        faults, withheld = fault_options(config, kill=kill, preempt=preempt, crash=crash, withhold=withhold)
    except FaultSpecError as err:
        raise fail(str(err)) from None
    for step in hold_at:
        if step >= total:
            raise fail(f"--hold-at {step}: step {step} is outside the run: a hold can wait at steps 1..{total - 1}")
    if summary_json is not None:
        problem = summary_path_problem(summary_json)
        if problem:
            raise fail(f"--summary-json {summary_json}: {problem}")
    if coordinator_port is not None and (problem := bind_error(coordinator_port)):
        raise fail(
            f"--coordinator-port {coordinator_port} is already in use ({problem}); choose another port or "
            "omit the option to use a free one"
        )
    from infra.local.boot_watch import BootTimeoutError, default_boot_timeout

    try:  # without --boot-timeout: $MULTISLICE_BOOT_TIMEOUT, else 120; a value that is no number is refused
        options = Options(
            faults=faults,
            withhold=withheld,
            holds=sorted(set(hold_at)),
            coordinator_port=coordinator_port,
            heartbeat_timeout_s=heartbeat_timeout,
            preempt_grace_s=preempt_grace,
            timeout_s=timeout,
            stall_timeout_s=stall_timeout,
            boot_timeout_s=default_boot_timeout() if boot_timeout is None else boot_timeout,
        )
    except BootTimeoutError as err:
        raise fail(f"{err} (or give --boot-timeout)") from None
    _record_stack_file(config, config_file)
    try:
        lifecycle.check_data_source(config, stored=False)
        outcome = lifecycle.run_recorded(
            config,
            local_paths(config),
            options,
            fresh=fresh,
            gcs_port=gcs_port,
            say=say,
            progress=_progress_display,
            on_stop=_print_stop,
        )
    except lifecycle.UpError as err:
        raise fail(str(err), err.exit_code) from None
    result = outcome.summary
    if outcome.already_complete:  # reported, nothing started
        print_summary(result)
        write_summary_json(summary_json, result)
        return
    write_summary_json(summary_json, result)
    try:
        print_summary(result)
    except BrokenPipeError:
        if not result["complete"]:
            raise
        return  # the run is complete; nobody reads the summary table
    if not result["complete"]:
        raise fail("the VMs exited but the run is not complete", 1)


def _print_stop(stop) -> None:
    """A stop the user asked for (``local down``, Ctrl-C) is one plain line; any other an error."""
    if stop.on_purpose:
        err_console.print(str(stop), markup=False, soft_wrap=True)
    else:
        print_error(str(stop))


def _record_stack_file(config, config_file: Path | None) -> None:
    """Record where the stack came from, so that ``--stack <name>`` reaches this run on every
    command (``infra.cli.options.stack_source``); a run from ``stacks/`` needs no record. A state
    directory that cannot be written is left to the run's own check, which names the problem."""
    record = local_paths(config).stack_file_record
    try:
        if config_file is None:
            record.unlink(missing_ok=True)
        else:
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(f"{config_file.resolve()}\n")
    except OSError:
        pass


def _progress_display(total: int):
    """In a terminal, a live progress bar (lines printed meanwhile appear above it); else plain
    progress lines (:mod:`infra.local.progress`)."""
    from infra.local import progress

    if console.is_terminal:
        return progress.live_reporter(console, total)
    return progress.plain_reporter(say)


@app.command("down")
def local_down(
    stack: str | None = typer.Option(
        None,
        "--stack",
        "-s",
        metavar="NAME",
        callback=values.one_stack_source,
        help="Only this stack (default: every stack).",
    ),
    config_file: Path | None = typer.Option(
        None,
        "--config-file",
        metavar="PATH",
        parser=values.PATH,
        callback=values.one_stack_source,
        help="Only the stack of this stack file (instead of --stack).",
    ),
) -> None:
    """Stop local runs (every emulated VM process and the emulator), keeping their run directories."""
    from infra.emulated.state import (
        DamagedState,
        LocalPaths,
        discard_damaged,
        state_dir_problem,
        unusable_state_dir,
    )
    from infra.emulated.teardown import stop_recorded

    root = state_root()
    if problem := state_dir_problem(root):  # else a file named as the state directory would hold "no run"
        raise fail(str(unusable_state_dir(root, problem)))
    if config_file is not None:
        stack = load_config(stack or "dev", config_file).stack
    elif stack is not None:
        _check_stack_name(stack, root)
    stacks = [stack] if stack else sorted(p.parent.name for p in root.glob("*/emulator.json"))
    stopped = False
    for name in stacks:
        paths = LocalPaths(root / name)
        try:
            actions = stop_recorded(paths)
        except DamagedState as damage:  # no emulator can be found through it: remove it (LocalGroup: if held)
            actions = [discard_damaged(paths, damage)]
        for action in actions:
            console.print(f"{name}: {action}", markup=False)
        stopped = stopped or bool(actions)
    if not stopped:
        console.print(
            f"no local run of stack {stack!r} is running" if stack else "no local run is running", markup=False
        )


def _check_stack_name(stack: str, root: Path) -> None:
    """Refuse a ``--stack`` that names neither a stack file nor a stack that ever ran locally
    (a typo must not look like "nothing to stop" while the real run goes on)."""
    from infra.config import available_stacks, stack_file

    if stack_file(stack).is_file() or (root / stack).is_dir():
        return
    known = available_stacks()
    ran = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    running = sorted(p.parent.name for p in root.glob("*/emulator.json"))
    raise fail(
        f"--stack {stack!r}: no such stack ({stack_file(stack)} does not exist and no local run of it was "
        f"ever made under {root}); stacks: {', '.join(known) or 'none'}; local runs: {', '.join(ran) or 'none'}"
        + (f"; running now: {', '.join(running)}" if running else "")
    )


@app.command("status")
def local_status(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    json_output: bool = JSON_OPTION,
    watch: bool = WATCH_OPTION,
    interval: float = INTERVAL_OPTION,
    plot: Path | None = PLOT_OPTION,
) -> None:
    """Whether the stack's local run is running, and its progress, as `multislice status`
    shows a deployed one (read through the emulated Cloud Storage: the running emulator's, or
    one started for this command)."""
    config = load_config(stack, config_file)
    show_local(config, local_paths(config), json_output=json_output, watch=watch, interval=interval, plot=plot)

"""``multislice local up | down | status``: a stack's queued resource emulated on this machine.

Registered on :data:`infra.cli.app` by :func:`register`; the emulation itself is
:mod:`infra.local`. Errors as in :mod:`infra.cli`: one ``error:`` line, exit 2 for bad input,
1 for a failed run, 130 for Ctrl-C, 143 for SIGTERM.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import typer
from rich.table import Table
from rich.text import Text

from infra.cli import CONFIG_FILE_OPTION, STACK_OPTION, console, fail, load_config, say, state_root
from infra.status import options as status_options

local_app = typer.Typer(no_args_is_help=True, help="Run a stack's queued resource on this machine (no cloud).")


def register(app: typer.Typer) -> None:
    """Add ``local up | down | status`` to ``app``."""
    app.add_typer(local_app, name="local")


def local_paths(config):
    from infra.local.state import LocalPaths

    return LocalPaths(state_root() / config.stack)


def print_summary(result: dict) -> None:
    table = Table(show_header=False)  # the title on its own line: a table title is padded to the table's width
    for key in ("complete", "steps_completed", "total_steps", "final_loss", "final_eval_loss", "restarts",
                "steps_lost", "training_seconds", "wall_seconds", "goodput", "badput", "faults", "capacity", "run_dir",
                "logs_dir"):
        if key in result:
            value = result[key]
            if isinstance(value, float):
                value = f"{value:.4f}"
            elif isinstance(value, list):
                value = "; ".join(value) or "none"
            table.add_row(key, Text(str(value)))
    console.print("run summary")
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
    config_file: Path | None = CONFIG_FILE_OPTION,
    kill: list[str] = typer.Option([], "--kill", metavar="SLICE@STEP", help="SIGKILL a slice's VMs at a step (hardware fault). Repeatable."),
    preempt: list[str] = typer.Option([], "--preempt", metavar="SLICE@STEP", help="SIGTERM a slice's VMs at a step (preemption notice), SIGKILL after the grace period. Repeatable."),
    fresh: bool = typer.Option(False, "--fresh", help="Discard the stack's previous local run and start over."),
    summary_json: Path | None = typer.Option(None, "--summary-json", metavar="PATH", help="Also write the summary as JSON here."),
    coordinator_port: int | None = typer.Option(None, "--coordinator-port", min=1, max=65535, metavar="PORT", help="Fixed jax.distributed coordinator port (default: a free one)."),
    gcs_port: int | None = typer.Option(None, "--gcs-port", min=1, max=65535, metavar="PORT", help="Fixed port of the emulated Cloud Storage (default: a free one)."),
    timeout: float = typer.Option(3600, "--timeout", min=1, metavar="SECONDS", help="Give up after this many seconds."),
    stall_timeout: float = typer.Option(600, "--stall-timeout", min=1, metavar="SECONDS", help="Give up after this many seconds without a new training step."),
    preempt_grace: float = typer.Option(30, "--preempt-grace", min=0, metavar="SECONDS", help="Seconds between SIGTERM and SIGKILL for --preempt (GCE: 30)."),
    heartbeat_timeout: int = typer.Option(10, "--heartbeat-timeout", min=2, metavar="SECONDS", help="jax.distributed heartbeat timeout (s) in the emulated VMs."),
) -> None:
    """Run the stack's multislice queued resource as local processes and train to completion.

    Resumes an unfinished run; reports a finished one without retraining (--fresh starts over).
    """
    from infra.local.faults import FaultSpecError, parse_fault
    from infra.local.ports import bind_error

    # Options first, with nothing heavy imported: a typo is reported at once.
    config = load_config(stack, config_file)
    total = config.training.steps
    try:
        faults = [parse_fault("kill", spec, slices=config.slices, total_steps=total) for spec in kill]
        faults += [parse_fault("preempt", spec, slices=config.slices, total_steps=total) for spec in preempt]
    except FaultSpecError as err:
        raise fail(str(err)) from None
    if summary_json is not None:
        problem = _unwritable(summary_json)
        if problem:
            raise fail(f"--summary-json {summary_json}: {problem}")
    if coordinator_port is not None and (problem := bind_error(coordinator_port)):
        raise fail(f"--coordinator-port {coordinator_port} is already in use ({problem}); choose another port or "
                   "omit the option to use a free one")
    check_data_source(config, stored=False)
    options = dict(faults=faults, coordinator_port=coordinator_port, heartbeat_timeout_s=heartbeat_timeout,
                   preempt_grace_s=preempt_grace, timeout_s=timeout, stall_timeout_s=stall_timeout)
    result = _run_recorded(config, local_paths(config), options, fresh=fresh, gcs_port=gcs_port, summary_json=summary_json)
    if result is None:
        return  # already complete: reported
    _write_summary(summary_json, result)
    try:
        print_summary(result)
    except BrokenPipeError:
        if not result["complete"]:
            raise
        return  # the run is complete; nobody reads the summary table
    if not result["complete"]:
        raise fail("the VMs exited but the run is not complete", 1)


def _run_recorded(config, paths, options: dict, *, fresh: bool, gcs_port, summary_json) -> dict | None:
    """Hold the stack's lock and record this process in the state file before anything is
    started (so that `local down` finds and stops it at any moment), run, and forget the
    state whatever happens. SIGTERM / SIGINT / SIGHUP anywhere in here stop what was started
    and exit 128 + the signal's number (143, 130, 129)."""
    import signal

    from infra.local import supervisor

    try:
        with supervisor.signals_raise(_Stopped, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
            try:
                return _run_locked(config, paths, options, fresh=fresh, gcs_port=gcs_port, summary_json=summary_json)
            except typer.Exit:
                raise
            except Exception:
                # A stop signal's exception that arrived as another one (raised inside an
                # import that re-raises everything as ImportError): still a stop, not a crash.
                name = supervisor.signal_received()
                if name is None:
                    raise
                raise _stopped(name) from None
    except typer.Exit as stop:
        if stop.exit_code not in (129, 130, 143):
            raise
        # Stopped by a signal, everything already stopped and forgotten: exit now. `local down`
        # repeats SIGTERM until this process is gone, and the interpreter's teardown (threads of
        # tensorstore and grpc) took seconds and could crash (SIGSEGV) when one arrived.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stop.exit_code)


def _run_locked(config, paths, options: dict, *, fresh: bool, gcs_port, summary_json) -> dict | None:
    """The body of :func:`_run_recorded`, inside its signal handlers."""
    import uuid

    from infra.local import state as local_state

    try:
        lock = local_state.acquire_lock(paths)
        state = local_state.read_state(paths)
        if lock is None:
            pid = state.get("pid", "?") if state else "?"
            raise fail(
                f"a local run of stack {config.stack!r} is already running (pid {pid}); "
                f"stop it with: multislice local down --stack {config.stack}"
            )
        try:
            if state:  # leftovers of an emulator that died (we hold the lock: it is not running)
                for action in local_state.stop_recorded(paths, signal_emulator=False):
                    say(f"cleanup of an earlier run: {action}")
            emulation_id = uuid.uuid4().hex
            local_state.write_state(paths, stack=config.stack, emulation_id=emulation_id, vms=[])
            return _emulate(config, paths, options, fresh=fresh, gcs_port=gcs_port,
                            summary_json=summary_json, emulation_id=emulation_id)
        finally:
            local_state.forget_state(paths)
    except _Stopped as err:
        raise _stopped(str(err)) from None


class _Stopped(Exception):
    """A stop signal reached ``local up``; the message is the signal's name."""


def _stopped(name: str) -> typer.Exit:
    import signal

    why = "stopped by SIGTERM (e.g. `multislice local down`)" if name == "SIGTERM" else f"interrupted ({name})"
    return fail(f"{why}; every emulated VM was stopped (run `multislice local up` again to resume)",
                128 + signal.Signals[name].value)


def _emulate(config, paths, options: dict, *, fresh: bool, gcs_port, summary_json, emulation_id: str) -> dict | None:
    """Render the startup script, serve the stack's storage, boot the VMs and train."""
    from infra import startup
    from infra.local import emulator, state as local_state
    from infra.local.gcs import GcsServerError

    try:
        script = startup.render(config)
    except ValueError as err:
        raise fail(str(err)) from None
    if fresh:
        local_state.discard_machines(paths)
    with _progress_display(config.training.steps) as progress:
        resource = emulator.LocalQueuedResource(config, paths, script.text, report=say, gcs_port=gcs_port,
                                                progress=progress, emulation_id=emulation_id)
        try:
            with resource.running():
                return _train_locally(resource, emulator.Options(**options), fresh, summary_json)
        except GcsServerError as err:
            raise fail(f"{err}; nothing was started", 2) from None
        except emulator.Interrupted as err:
            raise _stopped(str(err)) from None
        except emulator.EmulationError as err:
            raise fail(str(err), 1) from None


def _progress_display(total: int):
    """In a terminal, a live progress bar (lines printed meanwhile appear above it); else plain
    progress lines (:mod:`infra.local.progress`)."""
    import contextlib

    from infra.local import progress

    if console.is_terminal:
        return progress.live_reporter(console, total)
    return contextlib.nullcontext(progress.plain_reporter(say))


def _train_locally(resource, options, fresh: bool, summary_json: Path | None) -> dict | None:
    """``local up`` once the stack's storage serves (inside ``resource.running()``): discard
    (``--fresh``) or report a finished run, else train; the summary, or None when reported."""
    from infra.local import state as local_state, summary
    from infra.status.report import clock
    from training.checkpointing import is_complete

    config, run_dir, total = resource.config, resource.run_dir, resource.config.training.steps
    if fresh:
        if local_state.discard_run(run_dir):
            say(f"--fresh: discarded the previous run of stack {config.stack!r}")
    elif is_complete(run_dir, total):
        # Converged, as the provider treats a QR gone after its run completed: nothing is created.
        released = local_state.read_release(resource.paths)
        result = summary.summarize(run_dir, total) | {"wall_seconds": _seconds_since_start(),
                                                      "capacity": "released" if released else "kept"}
        how = f"its queued resource was released at {clock(released.get('released_at'))}; " if released else ""
        say(f"run {run_dir} is already complete; nothing to do ({how}use --fresh to start over)")
        if options.faults:
            say("note: the requested faults were not injected: the run is complete")
        print_summary(result)
        _write_summary(summary_json, result)
        return None
    check_data_source(config, stored=True)
    say(
        f"stack {config.stack}: {config.slices} × {config.accelerator_type} ({config.total_workers} VMs), "
        f"{total} steps, run dir {run_dir} (emulated Cloud Storage at {resource.storage.url})"
    )
    cores = os.cpu_count() or 1
    if config.total_workers > 2 * cores:
        say(
            f"warning: {config.total_workers} emulated VMs × {config.accelerator.chips_per_host} CPU devices on "
            f"{cores} cores: expect slow steps and long compiles"
        )
    try:
        return resource.up(options)
    except BrokenPipeError:
        if not is_complete(run_dir, total):
            raise  # stops_when_stdout_closes says so
        result = summary.summarize(run_dir, total)  # the last step's line found no reader
        return result | {
            "wall_seconds": _seconds_since_start(),
            "repairs": resource.repairs,
            "faults": resource.faults_fired,
            "capacity": resource.release.outcome,
            "logs_dir": str(resource.paths.logs_dir),
        }


def _seconds_since_start() -> float:
    """Seconds since this command's process started (its wall time so far)."""
    import time

    from infra.local.supervisor import start_time

    started = start_time(os.getpid())
    return round(time.time() - started, 3) if started else 0.0


def check_data_source(config, *, stored: bool) -> None:
    """Fail before any VM starts if the emulated VMs could not read the training data: a local
    glob must match files; a ``gs://`` source must lie in the stack's bucket (the only one the
    emulation serves) and, once the storage serves (``stored``), match objects there."""
    source = config.training.data.source
    if source == "stdlib":
        return
    remote = "://" in source
    if remote and not source.startswith(f"gs://{config.bucket_name}/"):
        raise fail(
            f"multislice:training.data.source {source!r}: the local emulation serves only the stack's bucket "
            f"gs://{config.bucket_name}; put the data there (e.g. gs://{config.bucket_name}/data/*.txt) " "or use local files"
        )
    if remote != stored:
        return
    from training.data import DataError, list_source_files

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


def _write_summary(path: Path | None, result: dict) -> None:
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
        except OSError as err:
            raise fail(f"--summary-json {path}: {err.strerror or err}", 1) from None


@local_app.command("down")
def local_down(stack: str | None = typer.Option(None, "--stack", "-s", metavar="NAME", help="Only this stack (default: every stack).")) -> None:
    """Stop local runs (every emulated VM process and the emulator), keeping their run directories."""
    from infra.local.state import LocalPaths, stop_recorded

    root = state_root()
    stacks = [stack] if stack else sorted(p.parent.name for p in root.glob("*/emulator.json"))
    stopped = False
    for name in stacks:
        actions = stop_recorded(LocalPaths(root / name))
        for action in actions:
            console.print(f"{name}: {action}", markup=False)
        stopped = stopped or bool(actions)
    if not stopped:
        console.print("no local run is running")


@local_app.command("status")
def local_status(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    json_output: bool = status_options.JSON_OPTION,
    watch: bool = status_options.WATCH_OPTION,
    interval: float = status_options.INTERVAL_OPTION,
    plot: Path | None = status_options.PLOT_OPTION,
) -> None:
    """Whether the stack's local run is running, and its progress, as `multislice status`
    shows a deployed one (read through the emulated Cloud Storage: the running emulator's, or
    one started for this command)."""
    from infra import status_cli

    config = load_config(stack, config_file)
    status_cli.show_local(config, local_paths(config), json_output=json_output, watch=watch, interval=interval, plot=plot)

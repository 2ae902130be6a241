"""The lifecycle of ``multislice local up`` around the emulated stack (:mod:`infra.local.emulated_stack`):
the stack's lock and recorded state (so that ``local down`` finds and stops the run at any
moment), the stop signals, a run that is already complete, and the run's summary.

:func:`run_recorded` is the whole of it; the command (:mod:`infra.cli.local`) parses the
options before, and prints the summary after. Errors are :class:`UpError`: one line for the
user and the exit status (2: bad input, 1: a failed run, 128 + n: stopped by signal n).
Nothing heavy is imported before the emulation starts.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra import invocation
from training.warning_text import as_line, no_action

if TYPE_CHECKING:  # imported by the functions that need them: nothing heavy before the emulation
    from infra.config import StackConfig
    from infra.emulated.state import LocalPaths
    from infra.local.emulated_stack import EmulatedStack
    from infra.local.options import Options
    from infra.local.progress import ProgressSample

#: ``local up``'s progress display: called with the run's total steps, it opens a block that
#: yields the callback each :class:`infra.local.progress.ProgressSample` is given (or None).
ProgressDisplay = Callable[[int], AbstractContextManager[Callable[["ProgressSample"], None] | None]]

#: Exit statuses of a run stopped by SIGHUP, SIGINT, SIGTERM (128 + the signal's number).
STOP_EXIT_CODES = (129, 130, 143)


class UpError(Exception):
    """``local up`` cannot go on: the message (one line) and the exit status."""

    def __init__(self, message: str, exit_code: int = 2, *, on_purpose: bool = False) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.on_purpose = on_purpose  # a stop the user asked for: not an error (:func:`ending`)


@dataclass(frozen=True)
class Outcome:
    """What ``local up`` did: the run's ``summary`` (:mod:`infra.local.summary`, plus
    ``wall_seconds``, ``capacity``, …); ``already_complete`` when it found the run complete
    and only reported it (nothing was started)."""

    summary: dict[str, Any]
    already_complete: bool = False


class _Stopped(Exception):
    """A stop signal reached ``local up``; the message is the signal's name."""


def stopped(name: str) -> UpError:
    """The error of a run stopped by the signal ``name`` (exit 128 + its number)."""
    import signal

    down = invocation.command("local down")
    why = f"stopped by SIGTERM (e.g. `{down}`)" if name == "SIGTERM" else f"interrupted ({name})"
    return UpError(
        f"{why}; every emulated VM was stopped (run `{invocation.command('local up')}` again to resume)",
        128 + signal.Signals[name].value,
    )


def run_recorded(
    config: StackConfig,
    paths: LocalPaths,
    options: Options,
    *,
    fresh: bool,
    gcs_port: int | None,
    say: Callable[[str], None],
    progress: ProgressDisplay,
    on_stop: Callable[[UpError], None],
) -> Outcome:
    """Hold the stack's lock and record this process in the state file before anything is
    started (so that `local down` finds and stops it at any moment), run, and forget the
    state whatever happens. ``options``: the command's flags;
    ``say`` prints a progress line; ``progress(total_steps)`` opens the progress display.

    SIGTERM / SIGINT / SIGHUP anywhere in here stop what was started, ignore further stop
    signals, call ``on_stop`` with the error (to print it) and exit the process at once with
    128 + the signal's number (143, 130, 129): `local down` repeats SIGTERM until this process
    is gone, and the interpreter's teardown (threads of tensorstore and grpc) took seconds and
    could crash (SIGSEGV) when one arrived. Any other failure raises :class:`UpError`."""
    import signal

    from infra.emulated import state as local_state, stop_signals

    try:
        with stop_signals.signals_raise(_Stopped, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)):
            try:
                return _run_locked(config, paths, options, fresh=fresh, gcs_port=gcs_port, say=say, progress=progress)
            except UpError:
                raise
            except OSError as err:
                if err.errno not in local_state.DISK_ERRNOS or stop_signals.signal_received():
                    raise
                # A full or read-only disk under the run: say so, not a traceback.
                raise UpError(f"the local emulation cannot write: {local_state.disk_problem(err)}", 1) from None
            except Exception:
                # A stop signal's exception that arrived as another one (raised inside an
                # import that re-raises everything as ImportError): still a stop, not a crash.
                name = stop_signals.signal_received()
                if name is None:
                    raise
                raise stopped(name) from None
    except UpError as stop:
        if stop.exit_code not in STOP_EXIT_CODES:
            raise
        # Stopped by a signal, everything already stopped and forgotten: exit now.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        stop = ending(stop, config, paths)
        on_stop(stop)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(stop.exit_code)


def ending(stop: UpError, config: StackConfig | None, paths: LocalPaths | None) -> UpError:
    """How a run stopped by a signal ends: stopped on purpose — by ``multislice local down``
    (its SIGTERM, with the request it recorded: :attr:`LocalPaths.down_request`) or by Ctrl-C
    (SIGINT) — exit 0 or 130 and ``on_purpose`` (a line, not an error); any other SIGTERM or a
    SIGHUP (a closed terminal) keeps 143 or 129 and is an error. Each says how to resume."""
    again = invocation.command("local up", None if config is None else config.stack)
    resume = f"every emulated VM was stopped; resume with: {again}"
    if stop.exit_code == 143 and paths is not None and paths.down_request.exists():
        paths.down_request.unlink(missing_ok=True)
        return UpError(f"stopped by `{invocation.command('local down')}`: {resume}", 0, on_purpose=True)
    if stop.exit_code == 130:
        return UpError(f"interrupted (Ctrl-C): {resume}", 130, on_purpose=True)
    why = "stopped by SIGTERM" if stop.exit_code == 143 else "interrupted (SIGHUP: the terminal closed)"
    return UpError(f"{why}: {resume}", stop.exit_code)


def _run_locked(
    config: StackConfig,
    paths: LocalPaths,
    options: Options,
    *,
    fresh: bool,
    gcs_port: int | None,
    say: Callable[[str], None],
    progress: ProgressDisplay,
) -> Outcome:
    """The body of :func:`run_recorded`, inside its signal handlers."""
    import uuid

    from infra.emulated import state as local_state, teardown

    problem = local_state.check_writable(paths)
    if problem:
        raise UpError(
            f"the local state directory {paths.root} cannot be written: {problem}; "
            "set MULTISLICE_STATE_DIR to a writable directory with free space"
        )
    try:
        lock = local_state.acquire_lock(paths)
        state = local_state.read_state(paths)
        if lock is None:
            pid = state.get("pid", "?") if state else "?"
            raise UpError(
                f"a local run of stack {config.stack!r} is already running (pid {pid}); "
                f"stop it with: {invocation.command('local down', config.stack)}"
            )
        # The first line, at once: what the next seconds are spent on.
        say(
            f"local up of stack {config.stack}: rendering the startup script, starting the emulated Cloud Storage, "
            "then reading the run directory (seconds)"
        )
        try:
            if state:  # leftovers of an emulator that died (we hold the lock: it is not running)
                for action in teardown.stop_recorded(paths, signal_emulator=False):
                    say(f"cleanup of an earlier run: {action}")
            emulation_id = uuid.uuid4().hex
            paths.down_request.unlink(missing_ok=True)  # an earlier `local down`'s, not this run's
            local_state.write_state(paths, stack=config.stack, emulation_id=emulation_id, vms=[])
            return _emulate(
                config,
                paths,
                options,
                fresh=fresh,
                gcs_port=gcs_port,
                say=say,
                progress=progress,
                emulation_id=emulation_id,
            )
        finally:
            local_state.forget_state(paths)
    except _Stopped as err:
        raise stopped(str(err)) from None


def _emulate(
    config: StackConfig,
    paths: LocalPaths,
    options: Options,
    *,
    fresh: bool,
    gcs_port: int | None,
    say: Callable[[str], None],
    progress: ProgressDisplay,
    emulation_id: str,
) -> Outcome:
    """Render the startup script, serve the stack's storage, boot the VMs and train."""
    from infra import startup
    from infra.emulated import teardown
    from infra.emulated.gcs import GcsServerError
    from infra.local import emulated_stack

    try:
        script = startup.render(config)
    except ValueError as err:
        raise UpError(str(err)) from None
    if fresh:
        teardown.discard_machines(paths)
    with progress(config.total_steps) as reporter:
        # What pulumi up writes to the bucket: the release record (and the release it names),
        # which every boot and, on the compute-engine backend, the release watch read.
        uploads = startup.bucket_objects(config.stack, config.run_dir, script)
        resource = emulated_stack.EmulatedStack(
            config,
            paths,
            script.text,
            report=say,
            gcs_port=gcs_port,
            progress=reporter,
            emulation_id=emulation_id,
            uploads=uploads,
        )
        try:
            with resource.running():
                say(f"emulated Cloud Storage at {resource.storage.url}; reading the run directory")
                return train(resource, options, fresh, say)
        except GcsServerError as err:
            raise UpError(f"{err}; nothing was started", 2) from None
        except emulated_stack.Interrupted as err:
            raise stopped(str(err)) from None
        except emulated_stack.EmulationError as err:
            raise UpError(str(err), 1) from None


def train(resource: EmulatedStack, options: Options, fresh: bool, say: Callable[[str], None]) -> Outcome:
    """``local up`` once the stack's storage serves (inside ``resource.running()``): discard
    (``--fresh``) or report a finished run, else train."""
    from infra.backends.interface import DELETED, KEPT
    from infra.clock import clock
    from infra.emulated.stop_signals import signals_held

    with signals_held():  # a stop during an import would abort the process: it is raised after it
        from infra.emulated import state as local_state, teardown
        from infra.local import summary
        from training.checkpoint.completion import is_complete

    config, run_dir, total = resource.config, resource.run_dir, resource.config.total_steps
    if fresh:
        if teardown.discard_run(run_dir):
            say(f"--fresh: discarded the previous run of stack {config.stack!r}")
    elif is_complete(run_dir, total):
        # Converged, as the provider treats a QR gone after its run completed: nothing is created.
        deleted = local_state.read_deletion(resource.paths)
        result = summary.summarize(run_dir, total, config.training.eval_every_steps) | {
            "wall_seconds": _seconds_since_start(),
            "capacity": DELETED if deleted else KEPT,
        }
        how = f"its queued resource was deleted at {clock(deleted.get('deleted_at'))}; " if deleted else ""
        say(f"run {run_dir} is already complete; nothing to do ({how}use --fresh to start over)")
        if options.faults:
            say("note: the requested faults were not injected: the run is complete")
        return Outcome(result, already_complete=True)
    check_data_source(config, stored=True)
    say(
        f"stack {config.stack}: {config.slices} × {config.accelerator_type} ({config.total_workers} VMs), "
        f"{total} steps, run dir {run_dir} (emulated Cloud Storage at {resource.storage.url})"
    )
    cores = os.cpu_count() or 1
    if config.total_workers > 2 * cores:
        warning = no_action(
            f"{config.total_workers} emulated VMs × {config.accelerator.chips_per_host} CPU devices on {cores} cores: "
            "expect slow steps and long compiles",
            "the run is the same, only slower",
        )
        say(as_line(warning))
    try:
        return Outcome(resource.up(options))
    except BrokenPipeError:
        if not is_complete(run_dir, total):
            raise  # the command says so (infra.cli.local.stops_when_stdout_closes)
        result = summary.summarize(
            run_dir, total, config.training.eval_every_steps
        )  # the last step's line found no reader
        return Outcome(
            result
            | {
                "wall_seconds": _seconds_since_start(),
                **resource.repairs.summary(),
                "capacity": resource.capacity.outcome,
                "logs_dir": str(resource.paths.logs_dir),
            }
        )


def _seconds_since_start() -> float:
    """Seconds since this process started (the command's wall time so far)."""
    import time

    from infra.emulated.supervisor import start_time

    started = start_time(os.getpid())
    return round(time.time() - started, 3) if started else 0.0


def check_data_source(config: StackConfig, *, stored: bool) -> None:
    """Raise :class:`UpError` before any VM starts if the emulated VMs could not read the
    training data: a local glob must match files; a ``gs://`` source must lie in the stack's
    bucket (the only one the emulation serves) and, once the storage serves (``stored``),
    match objects there."""
    source = config.training.data.source
    if source == "stdlib":
        return
    remote = "://" in source
    if remote and not source.startswith(f"gs://{config.bucket_name}/"):
        raise UpError(
            f"multislice:training.data.source {source!r}: the local emulation serves only the stack's bucket "
            f"gs://{config.bucket_name}; put the data there (e.g. gs://{config.bucket_name}/data/*.txt) "
            "or use local files"
        )
    if remote != stored:
        return
    from training.data.base import DataError
    from training.data.sources import check_source

    try:
        check_source(source)  # a prepared dataset (its manifest) or a glob of text files
    except DataError as err:
        raise UpError(f"multislice:{err}") from None

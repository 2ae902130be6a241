"""``multislice logs`` and ``multislice local logs``: the trainer's log lines of every worker.

    multislice logs --stack S [--slice N] [--worker W] [--since 10m|2026-11-30T17:00:00Z] [--follow]
    multislice local logs --stack S [same options]

``logs`` reads a deployed stack's lines from Cloud Logging (:mod:`infra.logs.cloud`; the VMs
ship them, training/log_shipping.py), ``local logs`` the console logs of the stack's local
emulation (:mod:`infra.logs.local`). Both print ``[slice S worker W] <line>``, oldest first;
``--follow`` keeps printing new lines until Ctrl-C. Registered on :data:`infra.cli.app`
(``local logs`` in the ``local`` group); nothing heavy is imported before a command runs
(the Cloud Logging client only inside ``logs``). Errors: one ``error:`` line; exit 2 for bad
input (options, stack, credentials), 1 for a stack with no logs (never deployed / never run
locally) or a failed Cloud Logging call, 130 for Ctrl-C.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import typer

from infra import invocation
from infra.cli.option_values import SLICE, WORKER, Number, Since
from infra.cli.options import (
    CONFIG_FILE_OPTION,
    STACK_OPTION,
    err_console,
    fail,
    load_config,
    print_warning,
    state_root,
)
from training.warning_text import act

#: Seconds between two polls of ``local logs --follow`` (the files are on this machine).
LOCAL_POLL_SECONDS = 0.5

SLICE_OPTION = typer.Option(None, "--slice", parser=SLICE, metavar="N", help="Only this slice (0-based).")
WORKER_OPTION = typer.Option(
    None, "--worker", parser=WORKER, metavar="W", help="Only this worker (TPU VM, 0-based) of each slice."
)
FOLLOW_OPTION = typer.Option(False, "--follow", "-f", help="Keep printing new lines until Ctrl-C.")
SINCE_OPTION = typer.Option(
    None,
    "--since",
    metavar="TIME",
    parser=Since(),
    help="Only lines from this long ago (30s, 10m, 2h, 1d) or after an RFC 3339 time (2026-11-30T17:00:00Z).",
)
LIBRARIES_OPTION = typer.Option(
    False,
    "--libraries/--no-libraries",
    help="Show or leave out (default) the notices of libraries: gloo's connection lines and the "
    "C++ libraries' glog INFO lines (e.g. the emulated storage's auth notice); their warnings and errors "
    "always show.",
)
POLLS_OPTION = typer.Option(
    None,
    "--polls",
    hidden=True,
    parser=Number(1, 1_000_000, whole=True),
    help="With --follow: stop after this many polls (tests).",
)


def check_range(config, slice_id: int | None, worker: int | None) -> None:
    """Exit 2 with one line if ``--slice``/``--worker`` is outside the stack."""
    if slice_id is not None and slice_id >= config.slices:
        raise fail(
            f"--slice {slice_id}: stack {config.stack} has {config.slices} slice(s), 0-{config.slices - 1} "
            "(multislice:slices)"
        )
    hosts = config.workers_per_slice
    if worker is not None and worker >= hosts:
        raise fail(
            f"--worker {worker}: each slice of stack {config.stack} ({config.accelerator_type}) has {hosts} "
            f"worker(s), 0-{hosts - 1} (multislice:acceleratorType)"
        )


def parse_since_option(since: str | None):
    """The time ``--since`` names, or None; exit 2 with one line for a value that is none (or
    reaches back before the year 1: ``datetime`` holds no earlier time)."""
    from infra.logs.lines import SinceError, parse_since

    try:
        return parse_since(since) if since is not None else None
    except SinceError as err:
        raise fail(str(err)) from None
    except OverflowError:  # a duration past what timedelta or datetime holds (10**5000 seconds: inf)
        shown = since if since is None or len(since) <= 40 else f"{since[:20]}…{since[-5:]} ({len(since):,} characters)"
        raise fail(
            f"--since {shown!r}: reaches back before the year 1; give a shorter duration (30s, 10m, 2h, 1d) "
            "or an RFC 3339 time (2026-11-30T17:00:00Z)"
        ) from None


def without_library_notices(poll: Callable[[], list], libraries: bool) -> Callable[[], list]:
    """``poll``, leaving out library notices (:class:`infra.logs.lines.LibraryNotices`) unless
    ``libraries`` (``--libraries``)."""
    if libraries:
        return poll
    from infra.logs.lines import LibraryNotices

    notices = LibraryNotices()
    return lambda: notices.without_notices(poll())


def emit(lines: Iterable) -> int:
    """Print ``lines`` to stdout (flushed); their number."""
    count = 0
    for line in lines:
        sys.stdout.write(line.render() + "\n")
        count += 1
    sys.stdout.flush()
    return count


def stream(poll: Callable[[], list], follow: bool, polls: int | None, interval: float) -> int:
    """Print what ``poll`` returns, once or (``follow``) every ``interval`` seconds until Ctrl-C
    or ``polls`` polls; the number of lines printed. A closed stdout (``| head``) ends it quietly."""
    count, done = 0, 0
    try:
        while True:
            count += emit(poll())
            done += 1
            if not follow or (polls is not None and done >= polls):
                return count
            time.sleep(interval)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        raise typer.Exit(0) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def logs(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    slice_id: int | None = SLICE_OPTION,
    worker: int | None = WORKER_OPTION,
    follow: bool = FOLLOW_OPTION,
    since: str | None = SINCE_OPTION,
    libraries: bool = LIBRARIES_OPTION,
    polls: int | None = POLLS_OPTION,
) -> None:
    """The trainer's log lines of a deployed stack's workers, from Cloud Logging (oldest first).

    Reads the log multislice-trainer that the stack's TPU VMs write (docs/vm-boot.md), for the
    stack's run; needs roles/logging.viewer in the stack's project.
    """
    from infra.config import stack_file
    from infra.credentials import CredentialsError
    from infra.logs import cloud

    config = load_config(stack, config_file)
    check_range(config, slice_id, worker)
    start = parse_since_option(since)
    endpoint = os.environ.get(cloud.ENDPOINT_ENV) or None
    try:
        credentials = cloud.credentials_for(config, config_file or stack_file(config.stack), endpoint)
    except CredentialsError as err:
        raise fail(str(err)) from None
    try:
        client = cloud.client_for(config.project, credentials, endpoint)
        tail = cloud.CloudTail(client, config, slice_id=slice_id, worker=worker, since=start)

        def poll() -> list:
            try:
                return tail.poll()
            except cloud.CloudLogsError as err:
                if not follow:
                    raise
                print_warning(
                    act(
                        f"{err} (asking again every {cloud.POLL_SECONDS:g} s)",
                        "fix the cause it names",
                        when="no lines follow",
                    )
                )
                return []

        printed = stream(without_library_notices(poll, libraries), follow, polls, cloud.POLL_SECONDS)
        if printed == 0 and not follow and not tail.any_entry():
            from infra.backends.operations import backend_of

            whose = backend_of(config).log_source(config)
            raise fail(
                f"stack {config.stack} has no {whose}: it was never deployed (pulumi up), "
                "or its TPU VMs have not booted yet",
                1,
            )
    except cloud.CloudLogsError as err:
        raise fail(str(err), 1) from None
    if printed == 0 and not follow:
        err_console.print(
            f"no trainer lines of run {config.effective_run_name} match{' since ' + since if since else ''}",
            markup=False,
            soft_wrap=True,
        )


def local_logs(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    slice_id: int | None = SLICE_OPTION,
    worker: int | None = WORKER_OPTION,
    follow: bool = FOLLOW_OPTION,
    since: str | None = SINCE_OPTION,
    libraries: bool = LIBRARIES_OPTION,
    polls: int | None = POLLS_OPTION,
) -> None:
    """The console log lines of the stack's emulated VMs (multislice local up), oldest first."""
    from infra.logs.local import ConsoleLogError, ConsoleTail, vm_logs

    config = load_config(stack, config_file)
    check_range(config, slice_id, worker)
    start = parse_since_option(since)
    logs_dir = state_root() / config.stack / "logs"  # infra.emulated.state.LocalPaths.logs_dir
    if not vm_logs(logs_dir) and not follow:
        raise fail(
            f"stack {config.stack} was never run locally: no console logs in {logs_dir} "
            f"(start it with: {invocation.command('local up', config.stack)})",
            1,
        )
    tail = ConsoleTail(logs_dir, slice_id=slice_id, worker=worker, since=start)
    try:
        printed = stream(
            without_library_notices(lambda: tail.poll(final=not follow), libraries), follow, polls, LOCAL_POLL_SECONDS
        )
    except ConsoleLogError as err:  # a FIFO or a device where a VM's log is
        raise fail(str(err), 1) from None
    if printed == 0 and not follow:
        err_console.print(
            f"no lines match in {logs_dir}{' since ' + since if since else ''}", markup=False, soft_wrap=True
        )

"""``multislice status``: a stack's queued resource, its slices and its run, in one answer.

    multislice status --stack S [--json] [--watch [--interval 10]] [--plot run.png]
    multislice local status --stack S [same options]        (the local emulation: infra/cli/local.py)

Both read the run directory the same way (:mod:`infra.status`); only where the capacity comes
from differs: the Cloud TPU API, on the compute-engine backend the slices' instance groups
through gcloud (:func:`group_lister`), or the emulator's state file (:mod:`infra.status.reader`).
This module prints: once, refreshed in place (``--watch``), as JSON lines, and the plot.
Errors: one ``error:`` line; exit 2 for bad input (stack file, options, credentials), 1 when
there is nothing to show (no queued resource; no run and no capacity about to start one) or the API
cannot be read. A run whose capacity is up but whose VMs have not written the run directory yet is
starting: a line saying so, exit 0.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from infra.cli.option_values import PATH, seconds
from infra.cli.options import CONFIG_FILE_OPTION, STACK_OPTION, console, err_console, fail, load_config

if TYPE_CHECKING:
    from infra.status.reader import StackReader

# The options ``multislice status`` and ``multislice local status`` share.
JSON_OPTION = typer.Option(False, "--json", help="Print the status as JSON (stable keys: infra/status/report.py).")
WATCH_OPTION = typer.Option(False, "--watch", "-w", help="Refresh in place until the run is COMPLETE (Ctrl-C stops).")
INTERVAL_OPTION = typer.Option(
    10.0, "--interval", parser=seconds(0.5), metavar="SECONDS", help="Seconds between refreshes of --watch."
)
PLOT_OPTION = typer.Option(
    None,
    "--plot",
    metavar="PATH",
    parser=PATH,
    help="Also draw loss and tokens/s against step, restarts and preemptions marked, as a PNG.",
)


def status(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    json_output: bool = JSON_OPTION,
    watch: bool = WATCH_OPTION,
    interval: float = INTERVAL_OPTION,
    plot: Path | None = PLOT_OPTION,
) -> None:
    """A deployed stack: its queued resource and slices (Cloud TPU API; on the compute-engine
    backend its instance groups and VMs, through gcloud) and its run's progress
    (the run directory in the checkpoint bucket): step, loss, tokens/s, ETA, checkpoints,
    restarts and preemptions, goodput, COMPLETE."""
    from infra.status.reader import StatusError, cloud_reader

    config = load_config(stack, config_file)
    options = {"json_output": json_output, "watch": watch, "interval": interval, "plot": plot}
    try:
        with cloud_reader(config) as read:
            show(read, config.stack, capacity=config.backend_spec.capacity_plan(config), **options)
    except StatusError as err:
        raise fail(str(err), err.exit_code) from None


#: Capacity states in which a stack without a run record is not about to have one: ``status``
#: then exits 1 (nothing is running); in any other (``ACTIVE``, ``PROVISIONING``, ``READY``, …)
#: the run is starting and ``status`` exits 0.
NOT_STARTING = ("NOT_RUNNING", "DELETED", "FAILED", "SUSPENDED", "SUSPENDING")


def show_local(config, paths, *, json_output: bool, watch: bool, interval: float, plot: Path | None) -> None:
    """``multislice local status``: the emulated stack whose state is in ``paths``."""
    from infra.status.reader import StatusError, local_reader

    options = {"json_output": json_output, "watch": watch, "interval": interval, "plot": plot}
    try:
        with local_reader(config, paths) as read:
            show(read, config.stack, capacity=config.backend_spec.capacity_plan(config), **options)
    except StatusError as err:
        raise fail(str(err), err.exit_code) from None


def show(
    read: StackReader,
    stack: str,
    *,
    json_output: bool,
    watch: bool,
    interval: float,
    plot: Path | None,
    capacity: str | None = None,
) -> None:
    """Read and print the status once, or refresh it in place (``watch``); draw ``plot``.
    ``capacity``: the stack's capacity line (``BackendSpec.capacity_plan``: the mode and what it
    costs), printed under the headline."""
    import json

    from rich.console import Group
    from rich.text import Text

    from infra.status.report import headline, render

    if plot is not None and plot.is_dir():
        raise fail(f"--plot {plot}: is a directory")
    status = read()
    if watch and not json_output:
        from rich.live import Live

        def view(current):
            return Group(
                Text(headline(current) + (f"\n{capacity}" if capacity else "")),
                render(current),
                Text(f"refreshing every {interval:g} s (Ctrl-C stops)", style="dim"),
            )

        try:
            with Live(view(status), console=console, auto_refresh=False) as live:
                while not status.run.complete:
                    time.sleep(interval)
                    status = read()
                    live.update(view(status), refresh=True)
        except KeyboardInterrupt:
            return
    elif json_output:
        while True:
            typer.echo(json.dumps(status.to_json(), sort_keys=True))
            if not watch or status.run.complete:
                break
            time.sleep(interval)
            status = read()
    else:
        console.print(headline(status), markup=False, soft_wrap=True)
        if capacity:
            console.print(capacity, markup=False, soft_wrap=True)
        console.print(render(status))
    if plot is not None:
        _plot(read.store, status, plot)
    if not status.run.exists and not watch:
        if status.capacity.state in NOT_STARTING:
            raise fail(f"no run in {status.run.run_dir} yet ({headline(status)})", 1)
        # Capacity up or on its way, no run record yet: the VMs are booting. Not a problem.
        console.print(f"the run is starting: its VMs have not written {status.run.run_dir} yet", markup=False)


def _plot(store, status, path: Path) -> None:
    from infra.status import plot as plotting
    from infra.status.store import StoreError

    if store is None or not status.run.exists:
        raise fail(f"--plot {path}: no run in {status.run.run_dir} yet", 1)
    try:
        history = plotting.read_history(store)
    except StoreError as err:
        raise fail(str(err), 1) from None
    try:
        plotting.draw(history, status.run, path, title=f"stack {status.stack}: {status.run.run_dir}")
    except OSError as err:
        raise fail(f"--plot {path}: {err.strerror or err}", 1) from None
    note = "" if history.steps else f" ({plotting.NO_STEPS_YET})"
    err_console.print(f"wrote {path}{note}", markup=False, soft_wrap=True)

"""``multislice status``: a stack's queued resource, its slices and its run, in one answer.

    multislice status --stack S [--json] [--watch [--interval 10]] [--plot run.png]
    multislice local status --stack S [same options]        (the local emulation)

Registered on :data:`infra.cli.app` by :func:`register`; ``local status`` (infra/local_cli.py)
calls :func:`show_local`. Both read the run directory the same way (:mod:`infra.status`); only
where the capacity comes from differs: the Cloud TPU API, or the emulator's state file.
Credentials for a deployed stack are taken from the environment as the gcp provider takes them
(:mod:`infra.credentials`: ``GOOGLE_OAUTH_ACCESS_TOKEN``, ``GOOGLE_CREDENTIALS``, …, else
Application Default Credentials). Errors: one ``error:`` line; exit 2 for bad input (stack
file, options, credentials), 1 when there is nothing to show (no queued resource, no run yet)
or the API cannot be read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from infra.cli import CONFIG_FILE_OPTION, STACK_OPTION, console, err_console, fail, load_config
from infra.status.options import INTERVAL_OPTION, JSON_OPTION, PLOT_OPTION, WATCH_OPTION


def register(app: typer.Typer) -> None:
    """Add ``status`` to ``app``."""
    app.command("status")(status_command)


def status_command(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    json_output: bool = JSON_OPTION,
    watch: bool = WATCH_OPTION,
    interval: float = INTERVAL_OPTION,
    plot: Path | None = PLOT_OPTION,
) -> None:
    """A deployed stack: its queued resource and slices (Cloud TPU API) and its run's progress
    (the run directory in the checkpoint bucket): step, loss, tokens/s, ETA, checkpoints,
    restarts and preemptions, goodput, COMPLETE."""
    config = load_config(stack, config_file)
    with _cloud_reader(config) as read:
        show(read, config.stack, json_output=json_output, watch=watch, interval=interval, plot=plot)


@contextmanager
def _cloud_reader(config) -> Iterator[_Reader]:
    """A function that reads the deployed stack's status (credentials checked first)."""
    from infra import credentials as gcp
    from infra.status import capacity
    from infra.status.store import RunStore

    settings = gcp.CredentialSettings.resolve({}, os.environ)
    url = capacity.endpoint()
    emulated_storage = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
    needed = not (capacity.is_local_endpoint(url) and emulated_storage)
    problem = gcp.problem(settings, os.environ, require_credentials=needed)
    if problem:
        raise fail(problem)
    credentials = None
    if needed or settings.explicit:
        try:
            credentials = gcp.load(settings, quota_project=settings.quota_project(config.project))
        except gcp.CredentialsError as err:
            raise fail(str(err)) from None
    try:
        base, session = capacity.tpu_session(url, None if capacity.is_local_endpoint(url) and not settings.explicit else credentials)
    except capacity.CapacityError as err:
        raise fail(str(err)) from None
    store = RunStore(config.run_dir, None if emulated_storage else credentials)

    def read_capacity():
        try:
            return capacity.read_cloud(session, base, config.project, config.zone, config.queued_resource_id, config.node_ids)
        except capacity.CapacityError as err:
            raise fail(str(err), 1) from None

    yield _reader(config, store, read_capacity)


def show_local(config, paths, *, json_output: bool, watch: bool, interval: float, plot: Path | None) -> None:
    """``multislice local status``: the emulated stack whose state is in ``paths``, read
    through its emulated Cloud Storage (the running emulator's, else one started for this
    command over the stored objects)."""
    from infra.local import state as local_state
    from infra.local.gcs import GcsServerError, clients_pointed_at
    from infra.status import capacity
    from infra.status.store import RunStore

    def read_capacity():
        return capacity.read_local(paths, config.queued_resource_id, config.node_ids, config.workers_per_slice)

    state = local_state.read_state(paths)
    url = state.get("storage_url") if state and local_state.emulator_alive(state) else None
    try:
        with clients_pointed_at(paths.gcs_root, paths.gcs_log, url) as stored:
            store = RunStore(config.run_dir) if stored else None
            show(_reader(config, store, read_capacity), config.stack, json_output=json_output, watch=watch, interval=interval, plot=plot)
    except GcsServerError as err:
        raise fail(f"cannot read the run: {err}", 1) from None


@dataclass
class _Reader:
    """Called, reads a fresh :class:`~infra.status.report.StackStatus`; ``store`` is the run's
    :class:`~infra.status.store.RunStore` (``--plot`` reads it), None when no run was ever stored."""

    read: Callable[[], Any]
    store: Any

    def __call__(self) -> Any:
        return self.read()


def _reader(config, store, read_capacity: Callable) -> _Reader:
    """A :class:`_Reader` of a fresh :class:`~infra.status.report.StackStatus` (capacity and
    progress read concurrently); ``store`` None: no run was ever stored. A queued resource that
    ``read_capacity`` does not find is RELEASED when the run is complete (as the provider
    treats it), else an error."""
    from concurrent.futures import ThreadPoolExecutor

    from infra.status import capacity
    from infra.status.progress import RunProgress, read_progress
    from infra.status.report import StackStatus
    from infra.status.store import StoreError

    def read():
        gone = None
        with ThreadPoolExecutor(max_workers=1) as pool:
            progress = pool.submit(read_progress, store, config.training.steps) if store is not None else None
            try:
                cap = read_capacity()
            except capacity.QueuedResourceNotFound as err:
                cap, gone = None, fail(f"stack {config.stack}: {err}: the stack was never deployed, or its queued resource "
                                       f"was deleted (deploy it with: pulumi up -s {config.stack})", 1)
            try:
                run = progress.result() if progress is not None else RunProgress(config.run_dir, config.training.steps)
            except StoreError as err:
                raise (gone or fail(str(err), 1)) from None
        if cap is None:
            if not run.complete:
                assert gone is not None  # set with cap = None
                raise gone
            cap = capacity.released(config.queued_resource_id, f"gone after its run completed at step {run.completed_step} "
                                    "(releaseOnComplete, or deleted by hand); pulumi up does not create it again")
        return StackStatus(config.stack, cap, run)

    return _Reader(read, store)


def headline(status) -> str:
    """The first line: the stack and its capacity state in words."""
    cap = status.capacity
    if cap.emulated:
        if cap.state == "RELEASED":
            return f"stack {status.stack}: not running; its queued resource {cap.id} was released"
        if cap.state == "NOT_RUNNING":
            return f"stack {status.stack}: {cap.detail}" if cap.detail else f"stack {status.stack}: not running"
        return f"stack {status.stack}: running ({cap.detail})"
    return f"stack {status.stack}: queued resource {cap.id} is {cap.state}"


def show(read: _Reader, stack: str, *, json_output: bool, watch: bool, interval: float, plot: Path | None) -> None:
    """Read and print the status once, or refresh it in place (``watch``); draw ``plot``."""
    import json

    from rich.console import Group
    from rich.text import Text

    from infra.status.report import render

    if plot is not None and plot.is_dir():
        raise fail(f"--plot {plot}: is a directory")
    status = read()
    if watch and not json_output:
        from rich.live import Live

        def view(current):
            return Group(Text(headline(current)), render(current), Text(f"refreshing every {interval:g} s (Ctrl-C stops)", style="dim"))

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
        console.print(render(status))
    if plot is not None:
        _plot(read.store, status, plot)
    if not status.run.exists and not watch:
        raise fail(f"no run in {status.run.run_dir} yet ({headline(status)})", 1)


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
    err_console.print(f"wrote {path}", markup=False, soft_wrap=True)

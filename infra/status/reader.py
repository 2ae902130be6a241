"""Where ``multislice status`` reads a stack from: a function returning a fresh
:class:`~infra.status.report.StackStatus` each call, for a deployed stack
(:func:`cloud_reader`: the capacity as the stack's backend reads it, and the checkpoint bucket) or a local emulation
(:func:`local_reader`: the emulator's state file and its emulated Cloud Storage). Capacity
and progress are read concurrently.

Credentials for a deployed stack are taken from the environment as the gcp provider takes
them (:mod:`infra.credentials`: ``GOOGLE_OAUTH_ACCESS_TOKEN``, ``GOOGLE_CREDENTIALS``, …, else
Application Default Credentials). Failures are :class:`StatusError`: one line and the exit
status (2 bad input such as credentials, 1 nothing to read or an API that cannot be read).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class StatusError(Exception):
    """The status cannot be read: the message (one line) and the exit status."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


@contextmanager
def cloud_reader(config) -> Iterator[StackReader]:
    """A function that reads the deployed stack's status: its capacity as its backend reads it
    (:meth:`infra.backends.interface.Backend.capacity_source`, credentials checked first), its
    run from the bucket."""
    from infra import credentials as gcp
    from infra.backends.capacity import CapacityError
    from infra.backends.operations import backend_of
    from infra.status.store import RunStore
    from infra.vm_contract import STORAGE_ENDPOINT_ENV

    settings = gcp.CredentialSettings.resolve({}, os.environ)
    emulated_storage = bool(os.environ.get(STORAGE_ENDPOINT_ENV))
    try:
        source = backend_of(config).capacity_source(config, settings, emulated_storage)
    except CapacityError as err:
        raise StatusError(str(err), err.exit_code) from None
    store = RunStore(config.run_dir, None if emulated_storage else source.credentials)

    def read_capacity():
        try:
            return source.read()
        except CapacityError as err:
            raise StatusError(str(err), err.exit_code) from None

    yield StackReader(config, store, read_capacity)


@contextmanager
def local_reader(config, paths) -> Iterator[StackReader]:
    """A function that reads the emulated stack whose state is in ``paths`` (``multislice
    local status``), through its emulated Cloud Storage: the running emulator's, else one
    started over the stored objects while inside."""
    from infra.emulated import state as local_state
    from infra.emulated.gcs import GcsServerError
    from infra.emulated.gcs_clients import clients_pointed_at
    from infra.status import capacity
    from infra.status.store import RunStore

    def read_capacity():
        cap = capacity.read_local(paths, config.queued_resource_id, config.node_ids, config.workers_per_slice)
        cap.backend = config.backend  # what the emulation stands in for (the same state file)
        return cap

    state = local_state.read_state(paths)
    url = state.get("storage_url") if state and local_state.emulator_alive(state) else None
    try:
        with clients_pointed_at(paths.gcs_root, paths.gcs_log, url) as stored:
            store = RunStore(config.run_dir) if stored else None
            yield StackReader(config, store, read_capacity)
    except GcsServerError as err:
        raise StatusError(f"cannot read the run: {err}", 1) from None


class StackReader:
    """Called, returns a fresh :class:`~infra.status.report.StackStatus` (capacity and progress
    read concurrently); ``store`` (a :class:`~infra.status.store.RunStore`) is None when no run
    was ever stored. A queued resource that ``read_capacity`` does not find is DELETED when the
    run is complete (as the provider treats it), else a :class:`StatusError`."""

    def __init__(self, config, store, read_capacity: Callable) -> None:
        self.config = config
        self.store = store
        self.read_capacity = read_capacity

    def __call__(self):
        from concurrent.futures import ThreadPoolExecutor

        from infra.backends import capacity
        from infra.status.progress import RunProgress, read_progress
        from infra.status.report import StackStatus
        from infra.status.store import StoreError

        config, store, read_capacity = self.config, self.store, self.read_capacity
        gone = None
        with ThreadPoolExecutor(max_workers=1) as pool:
            progress = pool.submit(read_progress, store, config.total_steps) if store is not None else None
            try:
                cap = read_capacity()
            except capacity.QueuedResourceNotFound as err:
                spec = config.backend_spec
                what = f"{spec.capacity_noun} {'were' if spec.capacity_plural else 'was'}"
                cap, gone = (
                    None,
                    StatusError(
                        f"stack {config.stack}: {err}: the stack was never deployed, or its {what} "
                        f"deleted (deploy it with: pulumi up -s {config.stack})",
                        1,
                    ),
                )
            try:
                run = progress.result() if progress is not None else RunProgress(config.run_dir, config.total_steps)
            except StoreError as err:
                raise (gone or StatusError(str(err), 1)) from None
        if cap is None:
            if not run.complete:
                assert gone is not None  # cap is None only when the queued resource was not found
                raise gone
            from infra.backends.operations import backend_of

            cap = backend_of(config).gone_after_completion(config, run.completed_step)
        return StackStatus(config.stack, cap, run)

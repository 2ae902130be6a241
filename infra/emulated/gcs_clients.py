"""This process's storage clients pointed at a stack's emulated Cloud Storage (:mod:`infra.emulated.gcs`)
for a block: to read a run (``local status``, the tests), to write a dataset into the stack's bucket
(``data prepare --emulated``), or for a whole emulation (:func:`point_clients_at`). Each restores the
environment it changed; a server started only for the block is stopped after it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from infra.emulated.gcs import (
    STORAGE_ENDPOINT_ENV,
    GcsServer,
    GcsServerError,  # noqa: F401 (raised here through GcsServer and bucket_served; callers catch it)
    answers,
    bucket_name_error,
    client_env,
    create_bucket,
)


@contextlib.contextmanager
def clients_pointed_at(root: Path, log_path: Path, url: str | None = None) -> Iterator[bool]:
    """Point this process's storage clients (:meth:`GcsServer.client_env`) at a stack's
    emulated Cloud Storage for the block: the running server at ``url`` if it answers, else a
    temporary server over ``root`` (stopped on leaving). Yields False, starting nothing, when
    ``root`` does not exist (no run was ever stored). The environment is restored after.

    Raises:
      GcsServerError: a temporary server cannot start.
    """
    if url is not None and answers(url):
        server = None
    elif root.is_dir():
        server = GcsServer(root, log_path)
        server.start()
        url = server.url
    else:
        yield False
        return
    restore = point_clients_at(url)
    try:
        yield True
    finally:
        restore()
        if server is not None:
            server.stop()


def point_clients_at(url: str) -> Callable[[], None]:
    """Set :func:`client_env` of ``url`` in this process's environment; returns the function
    that restores the previous values."""
    env = client_env(url)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)

    def restore() -> None:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    return restore


@contextlib.contextmanager
def bucket_served(root: Path, log_path: Path, bucket: str, url: str | None = None) -> Iterator[str]:
    """Point this process's storage clients at a stack's emulated Cloud Storage for the block, as
    :func:`clients_pointed_at` does, but for writing: the stored root is created when no run
    was ever stored, and so is ``bucket``. Yields the server's URL.

    Raises:
      GcsServerError: the bucket name would be refused by Cloud Storage, or a temporary server
        cannot start.
    """
    problem = bucket_name_error(bucket)
    if problem:
        raise GcsServerError(f"bucket name {bucket!r} would be refused by Cloud Storage: {problem}")
    root.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with clients_pointed_at(root, log_path, url):
        served = os.environ[STORAGE_ENDPOINT_ENV]
        create_bucket(served, bucket)
        yield served

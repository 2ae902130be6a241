"""Test-session setup: JAX runs on CPU with 8 emulated devices in the test process.

Set before anything imports jax (the device count is fixed at import: docs/jax-on-cpu.md).
Subprocesses (the local emulation) get their own JAX environment from the emulator.
"""

import os
import uuid

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """One emulated Cloud Storage (fake-gcs-server, infra.local.gcs) for the whole session,
    started by the first test that asks for it; this process's gcsfs and tensorstore are
    pointed at it (their settings are read before their first gs:// request)."""
    from infra.local.gcs import GcsServer

    root = tmp_path_factory.mktemp("gcs")
    server = GcsServer(root / "data", root / "fake-gcs-server.log")
    server.start()
    saved = {key: os.environ.get(key) for key in server.client_env()}
    os.environ.update(server.client_env())
    yield server
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def bucket(gcs_server) -> str:
    """A new, empty bucket on the session's emulated Cloud Storage."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    assert gcs_server.create_bucket(name)
    return name

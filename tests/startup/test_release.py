"""The boot's release check (infra/startup/boot.sh.in, step 2) on an emulated VM: the record that the
last ``pulumi up`` wrote to the bucket (infra/components/release.py) decides which release the VM runs.
The record is read over the GCS JSON API (fake-gcs-server at STORAGE_EMULATOR_HOST) with the
metadata server's token; another release is fetched and verified before it runs; a payload
that fails verification stops the boot. The happy path of a recreated node is
tests/backends/queued_resource/test_release.py."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from infra import startup, vm_contract as contract
from tests.fakes.gcs_server import FakeGcs
from tests.fakes.startup_vm import BUCKET, RUN_DIR, dev_stack, prefixed, script, vm  # noqa: F401 (fixtures)


@pytest.fixture
def gcs():
    """A fresh fake GCS per test (the records differ between tests)."""
    with FakeGcs() as server:
        server.create_bucket(BUCKET)
        yield server


def record(stack: str, release_id: str, run_dir: str, payload: str | None = None) -> bytes:
    body = {
        "format": 1,
        "payload": payload or startup.release_object(stack, release_id),
        "release": release_id,
        "runDir": run_dir,
        "stack": stack,
    }
    return json.dumps(body).encode()


def test_no_record_runs_the_embedded_release(vm, script):
    result = vm.run()
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout)
    assert (
        f"release: {script.release_id[:12]} (the embedded one: no release record at gs://{BUCKET}/multislice/dev/release.json)"
        in lines
    )
    assert vm.attempts == 1


def test_a_record_of_this_release_runs_it(vm, gcs, script):
    gcs.put(BUCKET, startup.record_object("dev"), record("dev", script.release_id, RUN_DIR))
    result = vm.run()
    assert result.returncode == 0, result.stdout
    assert (
        f"release: {script.release_id[:12]} is the current release (gs://{BUCKET}/multislice/dev/release.json)"
        in prefixed(result.stdout)
    )
    assert vm.attempts == 1


def test_a_corrupt_payload_stops_the_boot(vm, gcs):
    other = hashlib.sha256(b"another release").hexdigest()
    gcs.put(BUCKET, startup.record_object("dev"), record("dev", other, RUN_DIR))
    gcs.put(BUCKET, startup.release_object("dev", other), base64.encodebytes(b"not that release"))
    result = vm.run()
    lines = prefixed(result.stdout)
    payload = startup.release_object("dev", other)
    assert any(f"error: release payload gs://{BUCKET}/{payload} is corrupt: sha256 " in line for line in lines), lines
    assert result.returncode == contract.RELEASE_UNVERIFIED_STATUS  # no retry mends it
    assert vm.attempts == 0, "no trainer may start when the current release cannot be verified"
    assert not (vm.home / "releases" / other).exists()


def test_a_missing_payload_stops_the_boot(vm, gcs):
    other = hashlib.sha256(b"another release").hexdigest()
    gcs.put(BUCKET, startup.record_object("dev"), record("dev", other, RUN_DIR))
    result = vm.run()
    assert any(
        "cannot be fetched; not starting the older embedded trainer beside updated slices" in line
        for line in prefixed(result.stdout)
    )
    assert vm.attempts == 0


def test_a_malformed_record_runs_the_embedded_release_with_a_warning(vm, gcs, script):
    gcs.put(BUCKET, startup.record_object("dev"), b"<html>not json</html>")
    result = vm.run()
    assert result.returncode == 0, result.stdout
    assert any(
        line.startswith("warning: release record ") and "is malformed" in line for line in prefixed(result.stdout)
    )
    assert vm.attempts == 1
    assert (vm.fake_dir / "cwd.1").read_text().strip() == str(vm.home / "releases" / script.release_id)

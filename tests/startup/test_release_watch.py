"""The release watch of a compute-engine VM (infra/startup/release_watch.sh, boot.sh step 5,
trainer.sh's check): a ``pulumi up`` that changes the trainer writes a new release record, and
a running VM boots the new release in place — its trainer is stopped with SIGTERM (it saves),
restarted from the new release, and the watch becomes the new release's. An older trainer never
starts after the record moved on (status 76, not restarted); a release that cannot be fetched
leaves the running trainer alone and is tried again; a queued resource's VM has no watch."""

from __future__ import annotations

import hashlib
import subprocess
import time

import pytest

from infra import startup, vm_contract as contract
from infra.backends.compute_engine.emulated_api import ComputeApi
from tests.fakes.gcs_server import FakeGcs
from tests.fakes.startup_vm import (  # noqa: F401 (fixtures)
    BUCKET,
    CE_GROUPS,
    CE_PROJECT,
    CE_ZONE,
    RUN_DIR,
    ce_script,
    ce_stack,
    compute_engine_vm,
    dev_stack,
    script,
    vm,
)

OWN = "multislice-dev-0-a1b2"
PREFIX = "[slice 0 worker 0] "
RECORD = f"gs://{BUCKET}/{startup.record_object('dev')}"


@pytest.fixture
def gcs():
    """A fresh fake GCS per test (the records differ between tests)."""
    with FakeGcs() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def api():
    with ComputeApi(CE_PROJECT, CE_ZONE) as server:
        for group in CE_GROUPS:
            server.add_group(group)
        server.add_vm(CE_GROUPS[0], OWN, "10.0.0.4")
        yield server


@pytest.fixture
def machine(tmp_path, ce_script, gcs):
    """Worker 0 of slice 0 (one VM a slice), its release recorded as the current one."""
    for name, data in startup.bucket_objects("dev", RUN_DIR, ce_script).items():
        gcs.put(BUCKET, name, data)
    vm = compute_engine_vm(tmp_path, ce_script.text, gcs, name=OWN, slice_id=0, workers_per_slice=1)
    vm.metadata.update({contract.INSTANCE_GROUPS_KEY: CE_GROUPS[0]})
    with vm.metadata:
        yield vm


@pytest.fixture(scope="module")
def second(ce_stack):
    """The release a later ``pulumi up`` records: the stack with 7 more steps."""
    training = ce_stack.training.model_copy(update={"steps": ce_stack.training.steps + 7})
    return startup.render(ce_stack.model_copy(update={"training": training}))


def own(console: str) -> list[str]:
    """The lines of worker 0 of slice 0 (once the boot knows it), without the prefix."""
    return [line[len(PREFIX) :] for line in console.splitlines() if line.startswith(PREFIX)]


def boot(machine, api, **env):
    return machine.popen(**{contract.COMPUTE_API_ENDPOINT_ENV: api.endpoint, "FAKE_MODE": "save-on-term", **env})


def test_a_new_record_is_booted_in_place_and_the_trainer_saves_first(machine, api, gcs, ce_script, second):
    assert second.release_id != ce_script.release_id
    proc = boot(machine, api)
    try:
        machine.wait_for_file("ready.1", proc)
        machine.wait_for_output(proc, f"release watch: release {ce_script.release_id[:12]}; the record {RECORD}")
        for name, data in startup.bucket_objects("dev", RUN_DIR, second).items():
            gcs.put(BUCKET, name, data)  # pulumi up #2
        machine.wait_for_file("ready.2", proc)
        machine.wait_for_output(proc, f"release watch: release {second.release_id[:12]}; the record {RECORD}")
        console = machine.console.read_text()
    finally:
        machine.kill_all(proc)
    lines = own(console)
    switch = lines.index(
        f"release: the record names release {second.release_id[:12]}, not this VM's {ce_script.release_id[:12]}: "
        "booting it (the trainer saves a checkpoint at the agreed step first)"
    )
    assert (
        f"release: running release {second.release_id[:12]} (verified) instead of the embedded "
        f"{ce_script.release_id[:12]}" in lines[switch:]
    )
    # The first trainer got systemd's SIGTERM and saved before the second one started.
    assert (machine.fake_dir / "saved.1").exists()
    assert (
        "trainer: exited with status 75: it saved a checkpoint after a stop notice "
        "(a preemption, a maintenance event, a stop)"
        " or to change its slice count (elastic)" in lines[switch:]
    )
    assert machine.argv(1)[5] == str(machine.home / "releases" / ce_script.release_id / "config.json")
    assert machine.argv(2)[5] == str(machine.home / "releases" / second.release_id / "config.json")
    # The units are the new release's; the old release is gone from the disk; the trainer knows the record.
    units = {p.name: p.read_text() for p in machine.unit_dir.iterdir()}
    for unit in (contract.TRAINER_UNIT, contract.RELEASE_WATCH_UNIT):
        assert f"(release {second.release_id})" in units[unit]
    assert f"release-watch.sh watch {second.release_id} " in units[contract.RELEASE_WATCH_UNIT]
    assert sorted(p.name for p in (machine.home / "releases").iterdir() if not p.name.startswith(".")) == [
        second.release_id
    ]
    assert machine.environ(2)[contract.RELEASE_RECORD_ENV] == RECORD


def test_an_older_trainer_never_restarts_after_the_record_moved_on(machine, api, gcs, ce_script):
    other = hashlib.sha256(b"a release whose payload never arrives").hexdigest()
    proc = boot(machine, api)
    try:
        machine.wait_for_file("ready.1", proc)
        gcs.put(
            BUCKET, startup.record_object("dev"), startup.release_objects.record_text("dev", other, RUN_DIR).encode()
        )
        # The watch cannot fetch it: the trainer of this release goes on.
        machine.wait_for_output(proc, f"release watch: warning: the boot of release {other[:12]} failed (status 1)")
        assert len(machine.trainer_processes()) == 1 and machine.attempts == 1
        # The trainer then fails (a crash): systemd restarts it, and trainer.sh refuses to start it.
        for pid in machine.trainer_processes():
            subprocess.run(["kill", "-KILL", str(pid)], check=True)
        machine.wait_for_output(proc, "trainer: exited with status 76: the release record names a newer release")
        # Not restarted (RestartPreventExitStatus=): the unit fails and stays so.
        machine.wait_for_output(proc, f"{contract.TRAINER_UNIT}: Failed with result 'exit-code'")
        # The emulated VM waits for its watch (five polls here), as a real VM goes on running.
        time.sleep(1.0)
        assert proc.poll() is None, machine.console.read_text()
        console = machine.console.read_text()
    finally:
        machine.kill_all(proc)
    lines = own(console)
    assert (
        f"trainer: the release record names release {other[:12]}, not this unit's {ce_script.release_id}: not "
        "starting an older trainer beside updated slices; multislice-release-watch.service boots the recorded one"
    ) in lines
    assert machine.attempts == 1, "no older trainer may start once the record names another release"


@pytest.mark.parametrize(("mode", "status"), [("ok", 0), ("config-error", startup.CONFIG_ERROR_STATUS)])
def test_the_emulated_vm_ends_with_its_trainer_and_stops_the_watch(machine, api, mode, status):
    """The watch runs as long as a real VM does; an emulated VM whose trainer completed, or will
    never be restarted, has nothing left to do: it stops the watch and ends with the trainer's status."""
    proc = boot(machine, api, FAKE_MODE=mode)
    try:
        assert proc.wait(timeout=120) == status, machine.console.read_text()
    finally:
        machine.kill_all(proc)
    console = machine.console.read_text()
    assert "release watch: starting multislice-release-watch.service (the release record every 0.2s)" in own(console)
    assert console.rstrip().endswith(f"{contract.RELEASE_WATCH_UNIT}: Deactivated successfully."), console


def test_a_queued_resource_vm_has_no_watch(vm, gcs, script):
    for name, data in startup.bucket_objects("dev", RUN_DIR, script).items():
        gcs.put(BUCKET, name, data)
    result = vm.run()
    assert result.returncode == 0, result.stdout
    assert not (vm.unit_dir / contract.RELEASE_WATCH_UNIT).exists()
    assert contract.RELEASE_RECORD_ENV not in vm.environ(1)
    assert "release watch" not in result.stdout


@pytest.mark.parametrize(
    ("objects", "status", "answer"),
    [
        ({}, 3, f"no release record at {RECORD}"),
        ({"record": b'{"release": "not hex"}'}, 2, f"release record {RECORD}: HTTP 200, no release id in it"),
        ({"record": b'{"release": "' + b"a" * 64 + b'"}'}, 0, "a" * 64),
    ],
)
def test_current_reads_the_record_once(tmp_path, vm, gcs, objects, status, answer):
    if "record" in objects:
        gcs.put(BUCKET, startup.record_object("dev"), objects["record"])
    watch = tmp_path / "release-watch.sh"
    watch.write_text(startup.template(startup.RELEASE_WATCH_RESOURCE))
    result = subprocess.run(
        ["bash", str(watch), "current", RECORD], env=vm.env(), capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stdout.strip()) == (status, answer), result.stderr

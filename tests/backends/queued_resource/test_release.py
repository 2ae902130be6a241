"""The queued resource and the release its VMs run, against the loopback TPU
fake with real rendered startup scripts:

* no-op means no-op on any operator machine: a script rendered with another compressor (the
  xz tool, another level) is the same release, so diff, refresh and update see no change;
* a node that Cloud TPU recreates from the QR's creation-time spec still boots the release
  that the last ``pulumi up`` recorded in the bucket (infra/components/release.py), fetched and verified;
* so an auto-repair is not a change: refresh finds the recreated node in sync, diff shows
  nothing, and an update brings a stale node's metadata up to date with ``UpdateNode`` on that
  node alone, never ``ResetQueuedResource`` (which would restart every slice); a new release
  still updates every node and resets.
"""

from __future__ import annotations

import base64
import lzma
import subprocess

import pytest

from infra import startup
from infra.__main__ import component_args
from infra.backends.queued_resource.provider.nodes import node_in_sync
from infra.components import release
from infra.config import load_stack
from infra.vm_contract import RUN_DIR_KEY, STARTUP_SCRIPT_KEY
from tests.fakes.queued_resource import dev, fake, no_ambient_credentials, props_for, provider_for, qr_name  # noqa: F401 (fixtures)
from tests.fakes.startup_vm import TPU_ENV, Vm, gcs, prefixed  # noqa: F401 (fixtures)


def node_path(props, node_id: str) -> str:
    return f"projects/{props['project']}/locations/{props['zone']}/nodes/{node_id}"


def xz_tool(data: bytes) -> bytes:
    """Another implementation: the xz command-line tool at level 3 (not the library's 9e)."""
    return subprocess.run(["xz", "-3", "-c"], input=data, capture_output=True, check=True).stdout


def lzma_fast(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, preset=0)


@pytest.fixture(scope="module")
def dev_with_run_dir():
    """The dev stack (its run directory is in its checkpoint bucket, gs://...)."""
    return load_stack("dev")


@pytest.fixture(scope="module")
def rendered(dev_with_run_dir):
    return startup.render(dev_with_run_dir)


@pytest.mark.parametrize("other_compressor", [xz_tool, lzma_fast])
def test_another_compressor_is_no_change(fake, dev_with_run_dir, rendered, other_compressor):
    other = startup.render(dev_with_run_dir, compress=other_compressor)
    assert other.text != rendered.text and other.sha256 != rendered.sha256  # really other bytes
    assert other.release_id == rendered.release_id
    mine, theirs = props_for(dev_with_run_dir, rendered), props_for(dev_with_run_dir, other)
    provider = provider_for(fake)
    created = provider.create(mine)
    fake.calls.clear()

    # The other operator's preview: no diff.
    assert provider.diff(created.id, created.outs, theirs).changes is False
    # Their refresh finds the nodes in sync with their script (same release).
    refreshed = provider.read(created.id, {**created.outs, **theirs}).outs
    assert refreshed["nodesInSync"] is True
    assert provider.diff(created.id, refreshed, theirs).changes is False
    # An update for another reason (a label) touches no node's metadata and resets no VM.
    relabelled = {**theirs, "labels": {**theirs["labels"], "team": "ml"}}
    updated = provider.update(created.id, refreshed, relabelled).outs
    assert fake.resets(qr_name(mine)) == 0
    patches = [c for c in fake.calls if c.rpc == "UpdateNode"]
    assert patches and all("metadata" not in c.query.get("updateMask", [""])[0] for c in patches)
    assert updated["nodesInSync"] is True
    for name in updated["nodeNames"]:
        assert fake.node(node_path(mine, name)).metadata[STARTUP_SCRIPT_KEY] == rendered.text  # left as it was


def test_a_changed_release_is_a_change(fake, dev_with_run_dir, rendered):
    training = dev_with_run_dir.training.model_copy(update={"steps": dev_with_run_dir.training.steps + 1})
    changed = startup.render(dev_with_run_dir.model_copy(update={"training": training}))
    assert changed.release_id != rendered.release_id
    provider = provider_for(fake)
    created = provider.create(props_for(dev_with_run_dir, rendered))
    diff = provider.diff(created.id, created.outs, props_for(dev_with_run_dir, changed))
    assert diff.changes is True and diff.replaces == []
    node = fake.node(node_path(created.outs, created.outs["nodeNames"][0]))
    assert node_in_sync(node, props_for(dev_with_run_dir, rendered))
    assert not node_in_sync(node, props_for(dev_with_run_dir, changed))


def test_a_recreated_node_runs_the_current_release(tmp_path, fake, gcs, dev_with_run_dir, rendered):
    # pulumi up #1 created the QR with release 1; pulumi up #2 updated every node in place to
    # release 2 and wrote release 2's record and payload to the bucket (infra/components/release.py).
    training = dev_with_run_dir.training.model_copy(update={"steps": dev_with_run_dir.training.steps + 7})
    config2 = dev_with_run_dir.model_copy(update={"training": training})
    second = startup.render(config2)
    provider = provider_for(fake)
    created = provider.create(props_for(dev_with_run_dir, rendered))
    updated = provider.update(created.id, created.outs, props_for(config2, second)).outs
    assert updated["nodesInSync"] is True and fake.resets(qr_name(created.outs)) == 1
    bucket = config2.bucket_name
    gcs.create_bucket(bucket)
    recorded = component_args(config2, second).release_record  # what the program's ReleaseRecord writes
    gcs.put(bucket, startup.release_object(config2.stack, second.release_id), release.payload_text(recorded).encode())
    gcs.put(bucket, startup.record_object(config2.stack), release.record_json(recorded).encode(), "application/json")

    # Cloud TPU recreates slice 1 from the QR's spec: it carries release 1's script again.
    name = node_path(updated, updated["nodeNames"][1])
    node = fake.recreate_node(name)
    assert node.metadata[STARTUP_SCRIPT_KEY] == rendered.text
    assert not node_in_sync(node, props_for(config2, second))

    # It boots (the real script, under the emulated VM's systemd) and runs release 2.
    attributes = {**dict(node.metadata), "agent-worker-number": "2", "tpu-env": TPU_ENV}
    assert attributes[RUN_DIR_KEY] == config2.run_dir
    vm = Vm(tmp_path, node.metadata[STARTUP_SCRIPT_KEY], attributes, gcs)
    with vm.metadata:
        result = vm.run()
    assert result.returncode == 0, result.stdout
    lines = prefixed(result.stdout)
    current = second.release_id
    assert (
        f"release: running release {current[:12]} (verified) instead of the embedded {rendered.release_id[:12]}"
        in lines
    )
    assert vm.attempts == 1
    argv = vm.argv(1)
    config_path = vm.home / "releases" / current / "config.json"
    assert argv[argv.index("--config") + 1] == str(config_path)
    assert config_path.read_text() == training.model_dump_json() + "\n"
    assert (vm.fake_dir / "cwd.1").read_text().strip() == str(vm.home / "releases" / current)
    # The release came over the GCS JSON API with the metadata server's token.
    assert any(path.endswith("service-accounts/default/token") for path in vm.metadata.requests)
    payload = gcs.get(bucket, startup.release_object(config2.stack, current))
    assert base64.b64decode(payload) == second.release


def test_a_recompressed_script_leaves_no_node_sync_pending_while_queued(fake, dev_with_run_dir, rendered):
    fake.progression = ["CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES"]
    other = startup.render(dev_with_run_dir, compress=lzma_fast)
    mine = {**props_for(dev_with_run_dir, rendered), "createTimeoutSeconds": 0.15}
    theirs = {**props_for(dev_with_run_dir, other), "createTimeoutSeconds": 0.15}
    provider = provider_for(fake)
    created = provider.create(mine)
    assert created.outs["ready"] is False
    waiting = provider.update(created.id, created.outs, theirs).outs
    assert waiting["state"] == "WAITING_FOR_RESOURCES" and not waiting.get("pendingNodeSync")
    changed = {**theirs, "labels": {**theirs["labels"], "team": "ml"}}
    assert provider.update(created.id, created.outs, changed).outs["pendingNodeSync"] is True


def released_twice(fake, config, first):
    """pulumi up #1 created the QR with release ``first``; pulumi up #2 updated every node to
    release 2 (and reset once). Returns (provider, id, outputs of #2, props of release 2)."""
    training = config.training.model_copy(update={"steps": config.training.steps + 7})
    second = startup.render(config.model_copy(update={"training": training}))
    news = props_for(config.model_copy(update={"training": training}), second)
    provider = provider_for(fake)
    created = provider.create(props_for(config, first))
    updated = provider.update(created.id, created.outs, news).outs
    assert updated["nodesInSync"] is True and fake.resets(qr_name(news)) == 1
    fake.calls.clear()
    return provider, created.id, updated, news


@pytest.mark.parametrize("expand", [True, False], ids=["one-entry-per-node", "as-sent"])
def test_an_auto_repaired_slice_is_no_change(fake, dev_with_run_dir, rendered, expand):
    fake.expand_node_specs = expand
    provider, id_, recorded, news = released_twice(fake, dev_with_run_dir, rendered)
    # Cloud TPU recreates slice 1 from the QR's spec: release 1's script and run directory.
    name = node_path(news, recorded["nodeNames"][1])
    node = fake.recreate_node(name)
    assert node.metadata[STARTUP_SCRIPT_KEY] == rendered.text and not node_in_sync(node, news)

    # `pulumi up` with nothing changed: its refresh finds every node in sync, so no diff.
    refreshed = provider.read(id_, {**recorded, **news}).outs
    assert refreshed["nodesInSync"] is True and all(view["inSync"] for view in refreshed["nodes"])
    diff = provider.diff(id_, refreshed, news)
    assert diff.changes is False and diff.replaces == []
    # An update anyway (another reason, or an older provider's pending state) resets nothing:
    # the recreated node's metadata is brought up to date on that node alone.
    updated = provider.update(id_, refreshed, news).outs
    assert fake.rpcs(include_reads=False) == ["UpdateNode"]
    patch = next(c for c in fake.calls if c.rpc == "UpdateNode")
    assert patch.path.endswith(recorded["nodeNames"][1]) and patch.query["updateMask"] == ["metadata"]
    assert fake.resets(qr_name(news)) == 1  # only pulumi up #2's
    assert fake.node(name).metadata[STARTUP_SCRIPT_KEY] == news["metadata"][STARTUP_SCRIPT_KEY]
    assert updated["nodesInSync"] is True and updated["ready"] is True


def test_a_stale_node_is_updated_alone_without_a_reset(fake, dev_with_run_dir, rendered):
    provider = provider_for(fake)
    props = props_for(dev_with_run_dir, rendered)
    created = provider.create(props)
    fake.calls.clear()
    # Someone edited slice 0's run directory by hand (not the creation-time value either).
    name = node_path(props, created.outs["nodeNames"][0])
    fake.node(name).metadata[RUN_DIR_KEY] = "gs://elsewhere/run"
    refreshed = provider.read(created.id, created.outs).outs
    assert refreshed["nodesInSync"] is False and [v["inSync"] for v in refreshed["nodes"]] == [False, True]
    diff = provider.diff(created.id, refreshed, props)
    assert diff.changes is True and diff.replaces == []
    updated = provider.update(created.id, refreshed, props).outs
    assert fake.rpcs(include_reads=False) == ["UpdateNode"]
    patch = next(c for c in fake.calls if c.rpc == "UpdateNode")
    assert patch.path == "/v2/" + name and patch.query["updateMask"] == ["metadata"]
    assert fake.resets(qr_name(props)) == 0
    assert fake.node(name).metadata[RUN_DIR_KEY] == props["metadata"][RUN_DIR_KEY]
    assert updated["nodesInSync"] is True and "every VM reset" not in updated["statusMessage"]


def test_a_new_release_after_a_repair_updates_every_node_and_resets(fake, dev_with_run_dir, rendered):
    provider, id_, recorded, _news = released_twice(fake, dev_with_run_dir, rendered)
    fake.recreate_node(node_path(recorded, recorded["nodeNames"][0]))
    refreshed = provider.read(id_, recorded).outs
    assert refreshed["nodesInSync"] is True
    fake.calls.clear()
    training = dev_with_run_dir.training.model_copy(update={"steps": dev_with_run_dir.training.steps + 11})
    config3 = dev_with_run_dir.model_copy(update={"training": training})
    third = props_for(config3, startup.render(config3))
    diff = provider.diff(id_, refreshed, third)
    assert diff.changes is True and diff.replaces == []
    updated = provider.update(id_, refreshed, third).outs
    assert fake.rpcs(include_reads=False) == ["UpdateNode", "UpdateNode", "ResetQueuedResource"]
    assert fake.resets(qr_name(third)) == 2
    assert "every VM reset" in updated["statusMessage"] and updated["nodesInSync"] is True

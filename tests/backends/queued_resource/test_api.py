"""The TPU API helpers the provider's lifecycle shares (infra/backends/queued_resource/provider/api.py) that are
pure functions of messages; the reads and waits run against the fake in
tests/backends/queued_resource/test_provider.py."""

from __future__ import annotations

import pytest
from google.cloud import tpu_v2

from infra.backends.queued_resource.provider.api import TpuApi, is_ours
from infra.backends.queued_resource.provider.errors import QueuedResourceError
from infra.backends.queued_resource.provider.inputs import build_queued_resource, node_ids
from infra.backends.queued_resource.provider.nodes import live_node_ids, node_in_sync, node_patch
from tests.fakes.queued_resource import dev, no_ambient_credentials, props  # noqa: F401 (fixtures)


def test_a_plain_http_endpoint_must_be_loopback():
    with pytest.raises(QueuedResourceError, match="'http://10.0.0.7:8080' must be a loopback address"):
        TpuApi.client_for("http://10.0.0.7:8080")
    assert isinstance(TpuApi.client_for("http://127.0.0.1:8080"), tpu_v2.TpuClient)


def test_the_node_patch_merges_metadata_and_labels_and_replaces_tags():
    live = tpu_v2.Node(
        name="projects/p/locations/z/nodes/n-0",
        metadata={"startup-script": "v1", "dropped": "x", "ssh-keys": "alice:ssh-ed25519 AAAA"},
        labels={"managed-by": "pulumi", "set-by-hand": "yes"},
        tags=["old-tag"],
    )
    olds = {
        "metadata": {"startup-script": "v1", "dropped": "x"},
        "labels": {"managed-by": "pulumi"},
        "tags": ["old-tag"],
    }
    news = {
        "metadata": {"startup-script": "v2"},
        "labels": {"managed-by": "pulumi", "team": "research"},
        "tags": ["new-tag"],
    }
    patch, mask = node_patch(live, olds, news)
    assert mask == ["metadata", "labels", "tags"] and patch.name == live.name
    # Keys others set survive; a key the old program set and the new one dropped goes.
    assert dict(patch.metadata) == {"startup-script": "v2", "ssh-keys": "alice:ssh-ed25519 AAAA"}
    assert dict(patch.labels) == {"managed-by": "pulumi", "set-by-hand": "yes", "team": "research"}
    assert list(patch.tags) == ["new-tag"]
    assert not node_in_sync(live, news)

    synced = tpu_v2.Node(name=live.name, metadata={**patch.metadata}, labels={**patch.labels}, tags=list(patch.tags))
    assert node_patch(synced, news, news) == (tpu_v2.Node(name=live.name), [])
    assert node_in_sync(synced, news)


def test_only_a_qr_with_this_stacks_labels_and_shape_is_ours(props):
    ours = build_queued_resource(props)
    assert is_ours(ours, props)
    assert not is_ours(ours, {**props, "slices": 4})
    assert not is_ours(ours, {**props, "acceleratorType": "v4-16"})
    assert not is_ours(ours, {**props, "labels": {**props["labels"], "multislice-stack": "staging"}})
    unmanaged = build_queued_resource({**props, "labels": {"multislice-stack": "dev"}})
    assert not is_ours(unmanaged, {**props, "labels": {"multislice-stack": "dev"}})


def per_node_entries(qr: tpu_v2.QueuedResource, prefix: str) -> tpu_v2.QueuedResource:
    """``qr`` as the service reads it back: one ``nodeSpec`` entry per node, each with its
    ``nodeId`` and no ``multisliceParams`` (docs/cloud-tpu.md)."""
    spec = qr.tpu.node_spec[0]
    count = spec.multislice_params.node_count
    entries = [
        tpu_v2.QueuedResource.Tpu.NodeSpec(parent=spec.parent, node_id=f"{prefix}-{i}", node=spec.node)
        for i in range(count)
    ]
    return tpu_v2.QueuedResource(name=qr.name, tpu=tpu_v2.QueuedResource.Tpu(node_spec=entries))


def test_a_qr_read_back_with_one_node_spec_per_node_is_ours(props):
    sent = build_queued_resource(props)
    sent.name = "projects/p/locations/z/queuedResources/" + props["queuedResourceId"]
    read = per_node_entries(sent, props["nodeIdPrefix"])
    assert len(read.tpu.node_spec) == int(props["slices"]) == 2
    assert live_node_ids(read) == live_node_ids(sent) == node_ids(props)
    assert is_ours(read, props)
    assert not is_ours(read, {**props, "slices": 3})
    assert not is_ours(read, {**props, "acceleratorType": "v4-16"})
    assert not is_ours(read, {**props, "labels": {**props["labels"], "multislice-stack": "staging"}})
    # Other node ids: another QR's nodes, not the ones this stack reads and updates.
    assert not is_ours(per_node_entries(sent, "someone-else"), props)
    # One entry of another stack is enough to make it not ours.
    mixed = per_node_entries(sent, props["nodeIdPrefix"])
    mixed.tpu.node_spec[1].node.labels["multislice-stack"] = "staging"
    assert not is_ours(mixed, props)
    assert not is_ours(tpu_v2.QueuedResource(name=sent.name), props)  # no nodeSpec at all


def test_a_single_slice_qr_is_ours_by_its_node_id(props):
    single = {**props, "slices": 1, "nodeIdPrefix": None, "nodeId": "multislice-dev"}
    qr = build_queued_resource(single)
    assert live_node_ids(qr) == ["multislice-dev"] and is_ours(qr, single)
    assert not is_ours(qr, {**single, "nodeId": "another"})

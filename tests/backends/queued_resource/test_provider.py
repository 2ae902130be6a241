"""The queued-resource dynamic provider against the loopback TPU v2 REST fake.

Every case drives the real ``google.cloud.tpu_v2.TpuClient`` (REST transport) at
``tests/fakes/tpu_api.py`` on 127.0.0.1, with millisecond poll intervals and retry delays.
"""

from __future__ import annotations

import base64
import pickle

import dill
import pytest
from google.cloud import tpu_v2

from infra.backends.queued_resource.provider.api import TpuApi
from infra.backends.queued_resource.provider.inputs import CLOUD_PLATFORM_SCOPE, parent_of
from infra.queued_resource import (
    QueuedResourceError,
    QueuedResourceFailed,
    QueuedResourceProvider,
)
from tests.fakes.queued_resource import (  # noqa: F401 (access_token, active, dev, fake, no_ambient_credentials, props: fixtures)
    NETWORK,
    SERVICE_ACCOUNT,
    SUBNETWORK,
    TAG,
    access_token,
    active,
    create_body,
    dev,
    fake,
    no_ambient_credentials,
    props,
    props_for,
    provider_for,
    qr_name,
    script,
)
from tests.fakes.tpu_api import FakeTpuApi

# create ---------------------------------------------------------------------------------------


def test_create_reaches_active_with_the_whole_node_spec(fake, props):
    lines: list[str] = []
    result = provider_for(fake, lines).create(props)

    assert result.id == qr_name(props)
    outs = result.outs
    assert outs["state"] == "ACTIVE" and outs["ready"] is True
    assert outs["nodeNames"] == ["multislice-dev-0", "multislice-dev-1"]
    assert [n["state"] for n in outs["nodes"]] == ["READY", "READY"]
    assert [n["health"] for n in outs["nodes"]] == ["HEALTHY", "HEALTHY"]
    assert outs["nodesInSync"] is True
    # Progress was reported per state change.
    assert any("WAITING_FOR_RESOURCES" in line for line in lines) and any("ACTIVE" in line for line in lines)

    call = next(c for c in fake.calls if c.rpc == "CreateQueuedResource")
    assert call.query["queuedResourceId"] == ["multislice-dev"]
    assert call.query["requestId"][0]
    body = create_body(fake)
    spec = body.tpu.node_spec[0]
    assert spec.parent == "projects/acme-ml-dev/locations/us-central2-b"
    assert spec.multislice_params.node_count == 2
    assert spec.multislice_params.node_id_prefix == "multislice-dev"
    assert "node_id" not in spec
    node = spec.node
    assert node.accelerator_type == "v4-8"
    assert node.runtime_version == "tpu-ubuntu2204-base"
    assert node.network_config.network == NETWORK and node.network_config.subnetwork == SUBNETWORK
    assert node.network_config.enable_external_ips is False
    assert list(node.tags) == [TAG]
    assert node.service_account.email == SERVICE_ACCOUNT
    assert list(node.service_account.scope) == [CLOUD_PLATFORM_SCOPE]
    assert node.metadata["startup-script"] == props["metadata"]["startup-script"]
    assert node.metadata["multislice-run-dir"] == "gs://acme-ml-dev-dev-ckpt/runs/dev"
    assert node.labels["managed-by"] == "pulumi" and node.labels["multislice-stack"] == "dev"
    assert "spot" in body and "guaranteed" not in body and not body.reservation_name
    assert fake.rpcs(include_reads=False) == ["CreateQueuedResource"]


def test_single_slice_uses_node_id_and_reserved_capacity_a_reservation_path(fake, props):
    single = {
        **props,
        "slices": 1,
        "nodeId": "multislice-dev",
        "capacity": "reserved",
        "reservationName": "projects/acme-ml-dev/locations/us-central2-b/reservations/acme-v4",
    }
    del single["nodeIdPrefix"]
    result = provider_for(fake).create(single)
    body = create_body(fake)
    spec = body.tpu.node_spec[0]
    assert spec.node_id == "multislice-dev" and "multislice_params" not in spec
    assert body.reservation_name.endswith("/reservations/acme-v4") and "spot" not in body
    assert result.outs["nodeNames"] == ["multislice-dev"]


def test_valid_until_becomes_the_queueing_policy(fake, props):
    provider_for(fake).create({**props, "validUntilSeconds": 7200})
    assert create_body(fake).queueing_policy.valid_until_duration.total_seconds() == 7200


def test_wait_past_timeout_keeps_the_qr_recorded_and_resumes_on_next_up(fake, props):
    fake.progression = ["CREATING", "ACCEPTED", "WAITING_FOR_RESOURCES"]
    lines: list[str] = []
    provider = provider_for(fake, lines)
    short = {**props, "createTimeoutSeconds": 0.15}
    result = provider.create(short)  # no exception: the QR must be recorded, not orphaned

    outs = result.outs
    assert result.id == qr_name(props)
    assert outs["ready"] is False and outs["state"] == "WAITING_FOR_RESOURCES"
    assert "recorded in the stack" in outs["statusMessage"] and "pulumi up" in outs["statusMessage"]
    assert qr_name(props) in fake.queued_resources
    assert "DeleteQueuedResource" not in fake.rpcs()
    assert any("still WAITING_FOR_RESOURCES" in line for line in lines)

    # The next `pulumi up` (nothing changed) still has work to do: keep waiting, in place.
    diff = provider.diff(result.id, outs, short)
    assert diff.changes is True and diff.replaces == []
    fake.continue_with(qr_name(props), "PROVISIONING", "ACTIVE")
    updated = provider.update(result.id, outs, short).outs
    assert updated["ready"] is True and updated["state"] == "ACTIVE" and updated["nodesInSync"] is True
    # Nodes were created from the spec with the current metadata: no UpdateNode, no reset.
    assert fake.rpcs(include_reads=False) == ["CreateQueuedResource"]
    assert provider.diff(result.id, updated, short).changes is False


def test_failed_with_some_slices_active_is_deleted_and_explained(fake, props):
    fake.fail_after(
        ["CREATING", "WAITING_FOR_RESOURCES", "PROVISIONING"],
        active_slices=1,
        message="Insufficient capacity for slice 1 in us-central2-b",
    )
    with pytest.raises(QueuedResourceFailed) as err:
        provider_for(fake).create(props)
    text = str(err.value)
    assert "is FAILED" in text
    assert "Insufficient capacity for slice 1" in text
    assert "node multislice-dev-0: READY, health HEALTHY" in text
    assert "node multislice-dev-1: NOT_CREATED" in text
    assert "was deleted" in text
    delete = next(c for c in fake.calls if c.rpc == "DeleteQueuedResource")
    assert delete.query["force"] == ["true"]
    assert qr_name(props) not in fake.queued_resources and not fake.nodes


def test_a_qr_with_this_id_from_elsewhere_is_not_adopted(fake, props):
    provider = provider_for(fake)
    provider.create({**props, "labels": {**props["labels"], "multislice-stack": "someone-else"}})
    fake.calls.clear()
    with pytest.raises(QueuedResourceError, match="already exists in us-central2-b but not in this stack"):
        provider.create(props)
    assert fake.rpcs(include_reads=False) == ["CreateQueuedResource"]


def test_a_multislice_qr_reads_back_with_one_node_spec_per_node(fake, props):
    provider = provider_for(fake)
    created = provider.create(props)
    client = TpuApi.client_for(fake.endpoint)
    read = client.get_queued_resource(name=created.id)
    assert len(read.tpu.node_spec) == 2
    for index, spec in enumerate(read.tpu.node_spec):
        assert spec.node_id == f"multislice-dev-{index}" and "multislice_params" not in spec
        assert spec.parent == "projects/acme-ml-dev/locations/us-central2-b"
        assert spec.node.accelerator_type == props["acceleratorType"]
        assert dict(spec.node.labels) == props["labels"]
    assert [qr.name for qr in client.list_queued_resources(parent=parent_of(props))] == [created.id]
    # The request itself was the single entry with multisliceParams.
    sent = create_body(fake).tpu.node_spec
    assert len(sent) == 1 and sent[0].multislice_params.node_count == 2


@pytest.mark.parametrize("expand", [True, False], ids=["one-entry-per-node", "as-sent"])
def test_our_qr_left_by_an_interrupted_run_is_adopted_and_converged(fake, dev, props, expand):
    fake.expand_node_specs = expand
    provider = provider_for(fake)
    provider.create(props)  # ... and then `pulumi up` was killed before recording it
    fake.calls.clear()
    newer = props_for(dev, script("#!/bin/bash\necho v2\n"))
    result = provider.create(newer)
    assert result.id == qr_name(props) and result.outs["ready"] is True and result.outs["nodesInSync"] is True
    assert fake.rpcs(include_reads=False) == ["CreateQueuedResource", "UpdateNode", "UpdateNode", "ResetQueuedResource"]


# diff / update ------------------------------------------------------------------------------------


def test_unchanged_program_means_no_diff(active, props):
    provider, id_, outs = active
    diff = provider.diff(id_, outs, dict(props))
    assert diff.changes is False and diff.replaces == []


def test_metadata_only_change_updates_every_node_then_resets_and_never_deletes(fake, dev, active, props):
    provider, id_, outs = active
    # Someone ran `gcloud ... tpu-vm ssh`: it added ssh-keys to a node's metadata.
    first = "projects/acme-ml-dev/locations/us-central2-b/nodes/multislice-dev-0"
    fake.node(first).metadata["ssh-keys"] = "alice:ssh-ed25519 AAAA"

    new = props_for(dev, script("#!/bin/bash\necho v2\n"))
    diff = provider.diff(id_, outs, new)
    assert diff.changes is True and diff.replaces == []

    updated = provider.update(id_, outs, new).outs
    assert fake.rpcs(include_reads=False) == ["UpdateNode", "UpdateNode", "ResetQueuedResource"]
    masks = [c.query["updateMask"] for c in fake.calls if c.rpc == "UpdateNode"]
    assert masks == [["metadata"], ["metadata"]]
    assert fake.resets(qr_name(props)) == 1
    for index in (0, 1):
        node = fake.node(f"projects/acme-ml-dev/locations/us-central2-b/nodes/multislice-dev-{index}")
        assert node.metadata["startup-script"] == "#!/bin/bash\necho v2\n"
    assert fake.node(first).metadata["ssh-keys"] == "alice:ssh-ed25519 AAAA"  # merged, not clobbered
    assert updated["ready"] is True and updated["nodesInSync"] is True
    assert updated["startupScriptSha256"] == new["startupScriptSha256"]
    assert "every VM reset" in updated["statusMessage"]


def test_labels_only_change_updates_nodes_without_reset(fake, active, props):
    provider, id_, outs = active
    new = {**props, "labels": {**props["labels"], "team": "research"}}
    provider.update(id_, outs, new)
    assert fake.rpcs(include_reads=False) == ["UpdateNode", "UpdateNode"]
    assert [c.query["updateMask"] for c in fake.calls if c.rpc == "UpdateNode"] == [["labels"], ["labels"]]


@pytest.mark.parametrize(
    "key, value",
    [
        ("slices", 4),
        ("acceleratorType", "v4-16"),
        ("runtimeVersion", "v2-alpha-tpuv5"),
        ("capacity", "on-demand"),
        ("network", "projects/acme-ml-dev/global/networks/other"),
        ("serviceAccount", "other@x.iam.gserviceaccount.com"),
    ],
)
def test_shape_or_capacity_change_means_replace_delete_first(active, props, key, value):
    provider, id_, outs = active
    diff = provider.diff(id_, outs, {**props, key: value})
    assert diff.changes is True and key in diff.replaces and diff.delete_before_replace is True


def test_replace_deletes_then_creates_the_new_shape(fake, active, props):
    provider, id_, outs = active
    new = {**props, "slices": 4}
    provider.delete(id_, outs)
    result = provider.create(new)
    assert fake.rpcs(include_reads=False) == ["DeleteQueuedResource", "CreateQueuedResource"]
    assert result.outs["nodeNames"] == [f"multislice-dev-{i}" for i in range(4)]
    assert create_body(fake).tpu.node_spec[0].multislice_params.node_count == 4


def test_provider_only_keys_update_without_api_writes(fake, active, props):
    provider, id_, outs = active
    # The queueing deadline only matters in the queue: never a reason to give up capacity.
    new = {**props, "createTimeoutSeconds": 60, "version": "2", "validUntilSeconds": 3600}
    assert provider.diff(id_, outs, new).replaces == []
    provider.update(id_, outs, new)
    assert fake.rpcs(include_reads=False) == []


def test_update_while_still_queued_defers_node_sync(fake, props):
    fake.progression = ["CREATING", "WAITING_FOR_RESOURCES"]
    provider = provider_for(fake)
    queued = {**props, "waitFor": "WAITING_FOR_RESOURCES"}
    outs = provider.create(queued).outs
    assert outs["ready"] is True and outs["state"] == "WAITING_FOR_RESOURCES"
    new = {**queued, "labels": {**queued["labels"], "team": "x"}}
    assert outs["nodesInSync"] is None  # no nodes yet: nothing to converge
    assert provider.diff(qr_name(props), outs, dict(queued)).changes is False  # queued and unchanged: a no-op
    outs2 = provider.update(qr_name(props), outs, new).outs
    assert outs2["pendingNodeSync"] is True and "UpdateNode" not in fake.rpcs()
    assert provider.diff(qr_name(props), outs2, new).changes is True  # the next up applies it
    fake.continue_with(qr_name(props), "PROVISIONING", "ACTIVE")
    outs3 = provider.update(qr_name(props), outs2, new).outs
    assert outs3["nodesInSync"] is True and outs3["pendingNodeSync"] is False
    assert fake.rpcs(include_reads=False)[-2:] == ["UpdateNode", "UpdateNode"]


def test_update_of_a_qr_deleted_outside_pulumi_says_refresh(fake, active, props):
    provider, id_, outs = active
    provider_for(fake).delete(id_, outs)
    with pytest.raises(QueuedResourceError, match="pulumi refresh"):
        provider.update(id_, outs, {**props, "labels": {"a": "b"}})


# read / delete --------------------------------------------------------------------------------------


def test_read_reports_live_state_and_nodes(fake, active, props):
    provider, id_, outs = active
    result = provider.read(id_, outs)
    assert result.id == id_
    assert result.outs["state"] == "ACTIVE"
    assert [(n["name"], n["state"], n["health"]) for n in result.outs["nodes"]] == [
        ("multislice-dev-0", "READY", "HEALTHY"),
        ("multislice-dev-1", "READY", "HEALTHY"),
    ]


def test_refresh_after_failure_leads_to_replacement(fake, active, props):
    provider, id_, outs = active
    fake.set_state(qr_name(props), "FAILED", active_slices=1, message="preempted")
    refreshed = provider.read(id_, outs).outs
    assert refreshed["state"] == "FAILED" and refreshed["ready"] is False
    diff = provider.diff(id_, refreshed, dict(props))
    assert diff.replaces == ["state"] and diff.delete_before_replace is True


def test_read_of_a_deleted_qr_reports_it_gone(fake, active, props):
    provider, id_, outs = active
    provider.delete(id_, outs)
    assert provider.read(id_, outs).id == ""


def test_delete_forces_and_waits_until_gone(props):
    with FakeTpuApi(delete_polls=3) as fake:
        provider = provider_for(fake)
        outs = provider.create(props).outs
        provider.delete(qr_name(props), outs)
        deletes = [c for c in fake.calls if c.rpc == "DeleteQueuedResource"]
        assert len(deletes) == 1 and deletes[0].query["force"] == ["true"]
        assert qr_name(props) not in fake.queued_resources
        assert [c.status for c in fake.calls if c.rpc == "GetQueuedResource"][-1] == 404
        provider.delete(qr_name(props), outs)  # already gone: fine


def test_delete_that_does_not_finish_in_time_fails_loudly(props):
    with FakeTpuApi(delete_polls=10_000) as fake:
        provider = provider_for(fake)
        outs = provider.create(props).outs
        with pytest.raises(QueuedResourceError, match="still being deleted"):
            provider.delete(qr_name(props), {**outs, "deleteTimeoutSeconds": 0.05})


# check / pickling --------------------------------------------------------------------------------------


def test_check_rejects_what_the_api_cannot_take(props, access_token):
    provider = QueuedResourceProvider()
    bad = {**props, "capacity": "best-effort", "slices": 300, "waitFor": "READY"}
    failures = {f.property: f.reason for f in provider.check({}, bad).failures}
    assert set(failures) == {"capacity", "slices", "waitFor"}
    reserved = {**props, "capacity": "reserved"}
    assert [f.property for f in provider.check({}, reserved).failures] == ["reservationName"]
    assert provider.check({}, props).failures == []


def test_provider_pickles_by_module_reference():
    from pulumi.dynamic.dynamic import serialize_provider

    data = base64.b64decode(serialize_provider(QueuedResourceProvider()))
    assert b"infra.queued_resource" in data and b"QueuedResourceProvider" in data
    assert b"def create" not in data and b"TpuClient" not in data  # no code or clients inside
    restored = dill.loads(data)
    assert type(restored) is QueuedResourceProvider
    assert serialize_provider(QueuedResourceProvider()) == serialize_provider(QueuedResourceProvider())
    pickle.dumps(restored)


def test_check_leaves_values_unknown_during_preview_to_the_next_check(props, access_token):
    from pulumi.runtime.rpc import UNKNOWN

    unknown = {**props, "slices": UNKNOWN, "capacity": UNKNOWN, "waitFor": UNKNOWN, "metadata": UNKNOWN}
    assert QueuedResourceProvider().check({}, unknown).failures == []


def test_the_provider_class_keeps_the_name_existing_stacks_pickled():
    import infra.queued_resource

    assert infra.backends.queued_resource.provider.QueuedResourceProvider is QueuedResourceProvider
    assert (QueuedResourceProvider.__module__, QueuedResourceProvider.__qualname__) == (
        "infra.queued_resource",
        "QueuedResourceProvider",
    )
    assert infra.queued_resource.QueuedResource.__module__ == "infra.queued_resource"


def test_dill_pickles_the_provider_by_reference_as_pulumi_does():
    import pickletools

    provider = QueuedResourceProvider(api_endpoint="http://127.0.0.1:1", poll_seconds=0.5)
    # The call of pulumi.dynamic.dynamic.serialize_provider.
    data = dill.dumps(provider, protocol=pickle.DEFAULT_PROTOCOL, recurse=True)
    strings = [arg for _op, arg, _pos in pickletools.genops(data) if isinstance(arg, str)]
    # STACK_GLOBAL of the module and class name, nothing of the class body.
    assert strings[:2] == ["infra.queued_resource", "QueuedResourceProvider"]
    assert not any("infra.backends.queued_resource.provider." in s for s in strings)  # no submodule referenced
    restored = dill.loads(data)
    assert type(restored) is QueuedResourceProvider and restored == provider


#: ``serialize_provider(QueuedResourceProvider())`` as written into stacks by the provider before
#: it became a package (infra/queued_resource.py at commit 7675861): existing stacks hold this.
PICKLED_BEFORE_THE_PACKAGE = (
    "gASVrwAAAAAAAACMFWluZnJhLnF1ZXVlZF9yZXNvdXJjZZSMFlF1ZXVlZFJlc291cmNlUHJvdmlkZXKUk5QpgZR9lCiMDGFwaV9lbmRwb2ludJRO"
    "jBBtYXhfcG9sbF9zZWNvbmRzlE6MDHBvbGxfc2Vjb25kc5ROjAhwcm9ncmVzc5ROjBZyZXRyeV9kZWFkbGluZV9zZWNvbmRzlE6MFXJldHJ5X2lu"
    "aXRpYWxfc2Vjb25kc5ROdWIu"
)


def test_a_provider_pickled_by_an_existing_stack_still_updates_and_deletes(fake, props, monkeypatch):
    from pulumi.dynamic.dynamic import serialize_provider

    assert serialize_provider(QueuedResourceProvider()) == PICKLED_BEFORE_THE_PACKAGE  # same bytes as before
    restored = dill.loads(base64.b64decode(PICKLED_BEFORE_THE_PACKAGE))
    assert type(restored) is QueuedResourceProvider
    # The stack's provider reads its settings from the environment (all fields are None).
    for name, value in [
        ("MULTISLICE_TPU_API_ENDPOINT", fake.endpoint),
        ("MULTISLICE_TPU_POLL_SECONDS", "0.005"),
        ("MULTISLICE_TPU_MAX_POLL_SECONDS", "0.01"),
        ("MULTISLICE_TPU_RETRY_INITIAL_SECONDS", "0.005"),
        ("MULTISLICE_TPU_RETRY_DEADLINE_SECONDS", "1"),
    ]:
        monkeypatch.setenv(name, value)
    restored.progress = lambda _line: None
    outs = provider_for(fake).create(props).outs
    new = {**props, "labels": {**props["labels"], "team": "research"}}
    assert restored.diff(qr_name(props), outs, new).replaces == []
    updated = restored.update(qr_name(props), outs, new).outs
    assert updated["nodesInSync"] is True
    restored.delete(qr_name(props), updated)
    assert qr_name(props) not in fake.queued_resources
    assert fake.rpcs(include_reads=False) == [
        "CreateQueuedResource",
        "UpdateNode",
        "UpdateNode",
        "DeleteQueuedResource",
    ]


@pytest.mark.parametrize("raw", ["soon", "0", "-1", "nan", "inf"])
def test_a_setting_from_the_environment_that_is_no_positive_number_is_refused_naming_it(monkeypatch, raw):
    """MULTISLICE_TPU_POLL_SECONDS and the others are never ignored: one error naming the variable."""
    monkeypatch.setenv("MULTISLICE_TPU_POLL_SECONDS", raw)
    with pytest.raises(ValueError, match=rf"MULTISLICE_TPU_POLL_SECONDS='{raw}' is not a positive number"):
        QueuedResourceProvider()._setting(None, "MULTISLICE_TPU_POLL_SECONDS", 10.0)


# the fake itself -------------------------------------------------------------------------------------


@pytest.mark.schema_refusals  # a misspelt field, on purpose
def test_fake_rejects_fields_the_api_does_not_have_and_lists_with_the_real_client(fake, props):
    import requests
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    url = f"{fake.endpoint}/v2/projects/p/locations/z/queuedResources?queuedResourceId=q"
    response = requests.post(
        url,
        json={
            "tpu": {
                "nodeSpec": [{"parent": "projects/p/locations/z", "nodeId": "n", "node": {"acceleratorTyp": "v4-8"}}]
            }
        },
        timeout=5,
    )
    assert response.status_code == 400 and "acceleratorTyp" in response.json()["error"]["message"]

    provider_for(fake).create(props)
    client = tpu_v2.TpuClient(
        transport="rest", credentials=AnonymousCredentials(), client_options=ClientOptions(api_endpoint=fake.endpoint)
    )
    listed = list(client.list_queued_resources(parent="projects/acme-ml-dev/locations/us-central2-b"))
    assert [q.name for q in listed] == [qr_name(props)]

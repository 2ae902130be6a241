"""The queued-resource dynamic provider against the loopback TPU v2 REST fake.

Every case drives the real ``google.cloud.tpu_v2.TpuClient`` (REST transport) at
``tests/fakes/tpu_api.py`` on 127.0.0.1, with millisecond poll intervals and retry delays.
"""

from __future__ import annotations

import base64
import hashlib
import pickle
from dataclasses import dataclass

import dill
import pytest
from google.cloud import tpu_v2

from infra import queued_resource as qrmod
from infra.config import load_stack
from infra.queued_resource import (
    QueuedResourceError,
    QueuedResourceFailed,
    QueuedResourceProvider,
    QuotaOrPermissionError,
    queued_resource_props,
)
from tests.fakes.tpu_api import FakeTpuApi, quota_failure, rate_limited

NETWORK = "projects/acme-ml-dev/global/networks/multislice-dev-net"
SUBNETWORK = "projects/acme-ml-dev/regions/us-central2/subnetworks/multislice-dev-subnet"
SERVICE_ACCOUNT = "multislice-dev-tpu@acme-ml-dev.iam.gserviceaccount.com"
TAG = "multislice-dev-tpu"


@dataclass(frozen=True)
class Script:
    """Stands in for infra.startup.RenderedScript (the provider only reads these fields)."""

    text: str
    sha256: str
    bundle_sha256: str = "b" * 64
    requirements_sha256: str = "r" * 64

    @property
    def size_bytes(self) -> int:
        return len(self.text.encode())


def script(text: str = "#!/bin/bash\necho v1\n") -> Script:
    return Script(text=text, sha256=hashlib.sha256(text.encode()).hexdigest())


@pytest.fixture(scope="module")
def dev():
    return load_stack("dev")


@pytest.fixture
def props(dev):
    return queued_resource_props(
        dev, script(), network=NETWORK, subnetwork=SUBNETWORK, service_account=SERVICE_ACCOUNT, tags=[TAG]
    )


@pytest.fixture
def fake():
    with FakeTpuApi() as server:
        yield server


def provider_for(fake: FakeTpuApi, lines: list[str] | None = None, **overrides) -> QueuedResourceProvider:
    settings = dict(
        api_endpoint=fake.endpoint,
        poll_seconds=0.005,
        max_poll_seconds=0.01,
        retry_initial_seconds=0.005,
        retry_deadline_seconds=1.0,
        progress=(lines.append if lines is not None else (lambda _line: None)),
    )
    settings.update(overrides)
    return QueuedResourceProvider(**settings)


def qr_name(props) -> str:
    return f"projects/{props['project']}/locations/{props['zone']}/queuedResources/{props['queuedResourceId']}"


def create_body(fake: FakeTpuApi) -> tpu_v2.QueuedResource:
    call = next(c for c in fake.calls if c.rpc == "CreateQueuedResource" and c.status == 200)
    import json

    return tpu_v2.QueuedResource.from_json(json.dumps(call.body))


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
    assert list(node.service_account.scope) == [qrmod.CLOUD_PLATFORM_SCOPE]
    assert node.metadata["startup-script"] == props["metadata"]["startup-script"]
    assert node.metadata["multislice-run-dir"] == "gs://acme-ml-dev-dev-ckpt/runs/dev"
    assert node.labels["managed-by"] == "pulumi" and node.labels["multislice-stack"] == "dev"
    assert "spot" in body and "guaranteed" not in body and not body.reservation_name
    assert fake.rpcs(include_reads=False) == ["CreateQueuedResource"]


def test_single_slice_uses_node_id_and_reserved_capacity_a_reservation_path(fake, props):
    single = {**props, "slices": 1, "nodeId": "multislice-dev", "capacity": "reserved",
              "reservationName": "projects/acme-ml-dev/locations/us-central2-b/reservations/acme-v4"}
    del single["nodeIdPrefix"]
    result = provider_for(fake).create(single)
    body = create_body(fake)
    spec = body.tpu.node_spec[0]
    assert spec.node_id == "multislice-dev" and "multislice_params" not in spec
    assert body.reservation_name.endswith("/reservations/acme-v4") and "spot" not in body
    assert result.outs["nodeNames"] == ["multislice-dev"]


def test_reservation_path_and_best_effort_rejected_before_any_api_call(dev):
    from infra.config import StackConfigError

    prod = load_stack("prod")
    assert qrmod.reservation_path(prod) == "projects/acme-ml-prod/locations/us-east5-a/reservations/acme-v5p-training"
    assert qrmod.reservation_path(dev) is None
    with pytest.raises(StackConfigError, match=r"multislice:capacity: 'best-effort'.*allowed: spot, on-demand, reserved"):
        qrmod.check_provisionable(dev.model_copy(update={"capacity": "best-effort"}))


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
    fake.fail_after(["CREATING", "WAITING_FOR_RESOURCES", "PROVISIONING"], active_slices=1,
                    message="Insufficient capacity for slice 1 in us-central2-b")
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


def test_quota_error_is_one_clear_message_and_not_retried(fake, props):
    fake.fault("CreateQueuedResource", "RESOURCE_EXHAUSTED",
               "Quota limit 'TPUV4sPodPerProjectPerZoneForTPUAPI' has been exceeded.", details=quota_failure())
    with pytest.raises(QuotaOrPermissionError) as err:
        provider_for(fake).create(props)
    text = str(err.value)
    assert "TPU quota exhausted in us-central2-b of project acme-ml-dev" in text
    assert "TPUV4sPodPerProjectPerZoneForTPUAPI" in text
    assert "iam-admin/quotas?project=acme-ml-dev" in text and "multislice:slices" in text
    assert fake.rpcs() == ["CreateQueuedResource"]


def test_permission_error_says_which_roles_are_missing(fake, props):
    fake.fault("CreateQueuedResource", "PERMISSION_DENIED", "Permission 'tpu.queuedResources.create' denied")
    with pytest.raises(QuotaOrPermissionError) as err:
        provider_for(fake).create(props)
    text = str(err.value)
    assert "permission denied" in text and "roles/tpu.admin" in text
    assert f"roles/iam.serviceAccountUser on {SERVICE_ACCOUNT}" in text
    assert fake.rpcs() == ["CreateQueuedResource"]


def test_rate_limit_429_then_success_is_retried_with_one_request_id(fake, props):
    fake.fault("CreateQueuedResource", "RESOURCE_EXHAUSTED", "Quota exceeded for quota metric 'Requests'",
               details=rate_limited(), times=2)
    lines: list[str] = []
    result = provider_for(fake, lines).create(props)
    assert result.outs["ready"] is True
    creates = [c for c in fake.calls if c.rpc == "CreateQueuedResource"]
    assert [c.status for c in creates] == [429, 429, 200]
    assert len({c.query["requestId"][0] for c in creates}) == 1  # idempotent retries
    assert sum("retrying with backoff" in line for line in lines) == 2


def test_503_and_500_on_reads_are_retried(fake, props):
    fake.fault("GetQueuedResource", "UNAVAILABLE", times=2)
    fake.fault("GetNode", "INTERNAL", times=1)
    result = provider_for(fake).create(props)
    assert result.outs["ready"] is True
    statuses = [c.status for c in fake.calls if c.rpc == "GetQueuedResource"]
    assert statuses[:3] == [503, 503, 200]


def test_just_enabled_api_403_service_disabled_is_retried(fake, props):
    from google.rpc import error_details_pb2

    info = error_details_pb2.ErrorInfo(reason="SERVICE_DISABLED", domain="googleapis.com")
    fake.fault("CreateQueuedResource", "PERMISSION_DENIED", "Cloud TPU API has not been used", details=(info,))
    assert provider_for(fake).create(props).outs["ready"] is True


def test_a_just_created_service_account_not_yet_visible_is_retried(fake, props):
    fake.fault("CreateQueuedResource", "INVALID_ARGUMENT", f"Service account {SERVICE_ACCOUNT} does not exist.")
    assert provider_for(fake).create(props).outs["ready"] is True
    assert [c.status for c in fake.calls if c.rpc == "CreateQueuedResource"] == [400, 200]


def test_other_invalid_arguments_are_not_retried(fake, props):
    fake.fault("CreateQueuedResource", "INVALID_ARGUMENT", "runtime version 'nope' is not supported")
    with pytest.raises(QueuedResourceError, match="runtime version 'nope' is not supported"):
        provider_for(fake).create(props)
    assert fake.rpcs() == ["CreateQueuedResource"]


def test_persistent_5xx_while_waiting_keeps_the_qr_recorded(fake, props):
    fake.progression = ["CREATING", "WAITING_FOR_RESOURCES"]
    fake.fault("GetQueuedResource", "UNAVAILABLE", times=10_000)
    result = provider_for(fake, retry_deadline_seconds=0.2).create(props)
    assert result.outs["ready"] is False
    assert "ServiceUnavailable" in result.outs["statusMessage"] or "UNAVAILABLE" in result.outs["statusMessage"].upper()
    assert qr_name(props) in fake.queued_resources


def test_a_qr_with_this_id_from_elsewhere_is_not_adopted(fake, props):
    provider = provider_for(fake)
    provider.create({**props, "labels": {**props["labels"], "multislice-stack": "someone-else"}})
    fake.calls.clear()
    with pytest.raises(QueuedResourceError, match="already exists in us-central2-b but not in this stack"):
        provider.create(props)
    assert fake.rpcs(include_reads=False) == ["CreateQueuedResource"]


def test_our_qr_left_by_an_interrupted_run_is_adopted_and_converged(fake, dev, props):
    provider = provider_for(fake)
    provider.create(props)  # ... and then `pulumi up` was killed before recording it
    fake.calls.clear()
    newer = queued_resource_props(
        dev, script("#!/bin/bash\necho v2\n"), network=NETWORK, subnetwork=SUBNETWORK,
        service_account=SERVICE_ACCOUNT, tags=[TAG],
    )
    result = provider.create(newer)
    assert result.id == qr_name(props) and result.outs["ready"] is True and result.outs["nodesInSync"] is True
    assert fake.rpcs(include_reads=False) == ["CreateQueuedResource", "UpdateNode", "UpdateNode", "ResetQueuedResource"]


# diff / update ------------------------------------------------------------------------------------


@pytest.fixture
def active(fake, props):
    provider = provider_for(fake)
    result = provider.create(props)
    fake.calls.clear()
    return provider, result.id, result.outs


def test_unchanged_program_means_no_diff(active, props):
    provider, id_, outs = active
    diff = provider.diff(id_, outs, dict(props))
    assert diff.changes is False and diff.replaces == []


def test_metadata_only_change_updates_every_node_then_resets_and_never_deletes(fake, dev, active, props):
    provider, id_, outs = active
    # Someone ran `gcloud ... tpu-vm ssh`: it added ssh-keys to a node's metadata.
    first = "projects/acme-ml-dev/locations/us-central2-b/nodes/multislice-dev-0"
    fake.node(first).metadata["ssh-keys"] = "alice:ssh-ed25519 AAAA"

    new = queued_resource_props(
        dev, script("#!/bin/bash\necho v2\n"), network=NETWORK, subnetwork=SUBNETWORK,
        service_account=SERVICE_ACCOUNT, tags=[TAG],
    )
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
    [("slices", 4), ("acceleratorType", "v4-16"), ("runtimeVersion", "v2-alpha-tpuv5"), ("capacity", "on-demand"),
     ("network", "projects/acme-ml-dev/global/networks/other"), ("serviceAccount", "other@x.iam.gserviceaccount.com")],
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
        ("multislice-dev-0", "READY", "HEALTHY"), ("multislice-dev-1", "READY", "HEALTHY")]


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


def test_check_rejects_what_the_api_cannot_take(props):
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


# the fake itself -------------------------------------------------------------------------------------


def test_fake_rejects_fields_the_api_does_not_have_and_lists_with_the_real_client(fake, props):
    import requests
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials

    url = f"{fake.endpoint}/v2/projects/p/locations/z/queuedResources?queuedResourceId=q"
    response = requests.post(url, json={"tpu": {"nodeSpec": [{"parent": "projects/p/locations/z", "nodeId": "n",
                                                               "node": {"acceleratorTyp": "v4-8"}}]}}, timeout=5)
    assert response.status_code == 400 and "acceleratorTyp" in response.json()["error"]["message"]

    provider_for(fake).create(props)
    client = tpu_v2.TpuClient(transport="rest", credentials=AnonymousCredentials(),
                              client_options=ClientOptions(api_endpoint=fake.endpoint))
    listed = list(client.list_queued_resources(parent="projects/acme-ml-dev/locations/us-central2-b"))
    assert [q.name for q in listed] == [qr_name(props)]

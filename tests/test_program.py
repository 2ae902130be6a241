"""The Pulumi program (infra/__main__.py) under pulumi mocks, for every stack in stacks/.

The harness (tests/fakes/pulumi_program.py) hands the program the stack's config the way the
engine does and records every registration with its options.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import lzma
import re
import tarfile

import pytest

from infra import startup
from infra.bundle import build_archive
from infra.config import StackConfigError, available_stacks, load_stack
from infra.network import IAP_SSH_RANGE
from infra.queued_resource import RUN_DIR_KEY, STARTUP_SCRIPT_KEY
from tests.fakes.pulumi_program import FIREWALL, LOOKED_UP_CIDR, QR_TYPE, World, evaluate, stack_map

STACKS = available_stacks()


@pytest.fixture(scope="module")
def worlds() -> dict[str, World]:
    return {stack: evaluate(stack) for stack in STACKS}


@pytest.fixture(scope="module")
def renders() -> dict[str, startup.RenderedScript]:
    return {stack: startup.render(load_stack(stack)) for stack in STACKS}


def test_every_shipped_stack_is_covered():
    assert {"dev", "staging", "prod"} <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_resource_set(worlds, stack):
    world = worlds[stack]
    config = load_stack(stack)
    types = [r.typ for r in world.registrations]
    assert types.count("gcp:projects/service:Service") == 7
    services = {r.inputs["service"] for r in world.of("gcp:projects/service:Service")}
    assert {"tpu.googleapis.com", "compute.googleapis.com", "storage.googleapis.com", "iam.googleapis.com"} <= services
    assert all(r.inputs["disableOnDestroy"] is False for r in world.of("gcp:projects/service:Service"))
    for typ in ("gcp:compute/network:Network", "gcp:compute/subnetwork:Subnetwork", "gcp:compute/router:Router",
                "gcp:compute/routerNat:RouterNat", "gcp:storage/bucket:Bucket", "gcp:serviceaccount/account:Account", QR_TYPE):
        assert types.count(typ) == 1, typ
    assert types.count(FIREWALL) == 2
    for component in ("multislice:gcp:ProjectServices", "multislice:gcp:Network", "multislice:gcp:CheckpointBucket",
                      "multislice:gcp:ServiceAccount"):
        assert types.count(component) == 1, component
    # Every cloud resource hangs under a component (the QR sits at the top).
    components = {r.urn for r in world.registrations if r.typ.startswith("multislice:gcp:")}
    for reg in world.registrations:
        if reg.typ.startswith("gcp:"):
            assert reg.parent in components, reg.name
    vpc = world.one("gcp:compute/network:Network").inputs
    assert vpc["autoCreateSubnetworks"] is False and vpc["mtu"] == 8896
    subnet = world.one("gcp:compute/subnetwork:Subnetwork").inputs
    assert subnet["region"] == config.region and subnet["privateIpGoogleAccess"] is True
    nat = world.one("gcp:compute/routerNat:RouterNat").inputs
    assert nat["sourceSubnetworkIpRangesToNat"] == "LIST_OF_SUBNETWORKS"
    assert nat["subnetworks"][0]["name"].endswith(f"/subnetworks/{subnet['name']}")


@pytest.mark.parametrize("stack", STACKS)
def test_firewall_targets_the_qr_tags_and_nothing_is_open_to_the_internet(worlds, stack):
    world = worlds[stack]
    qr = world.one(QR_TYPE).inputs
    tags = qr["tags"]
    assert tags == [load_stack(stack).network_tag]
    rules = [r.inputs for r in world.of(FIREWALL)]
    assert len(rules) == 2
    for rule in rules:
        assert rule["targetTags"] == tags
        assert rule["direction"] == "INGRESS"
        assert "0.0.0.0/0" not in rule.get("sourceRanges", [])
        assert rule.get("sourceRanges") or rule.get("sourceTags")  # never "from anywhere" by omission
        assert rule["network"] == qr["network"]
    internal = next(r for r in rules if r["name"].endswith("-internal"))
    assert internal["sourceTags"] == tags
    assert internal["sourceRanges"] == [world.one("gcp:compute/subnetwork:Subnetwork").inputs["ipCidrRange"]]
    assert sorted(a["protocol"] for a in internal["allows"]) == ["icmp", "tcp", "udp"]
    assert all("ports" not in a for a in internal["allows"])  # all ports: DCN and the coordinator (8482)
    ssh = next(r for r in rules if r["name"].endswith("-iap-ssh"))
    assert ssh["sourceRanges"] == [IAP_SSH_RANGE] and "sourceTags" not in ssh
    assert ssh["allows"] == [{"protocol": "tcp", "ports": ["22"]}]


@pytest.mark.parametrize("stack", STACKS)
def test_bucket_is_private_regional_and_protected_in_prod(worlds, stack):
    world = worlds[stack]
    config = load_stack(stack)
    bucket = world.one("gcp:storage/bucket:Bucket")
    inputs = bucket.inputs
    assert inputs["name"] == config.bucket_name
    assert inputs["publicAccessPrevention"] == "enforced"
    assert inputs["uniformBucketLevelAccess"] is True
    assert inputs["location"] == config.region.upper()
    assert inputs["forceDestroy"] is False
    assert inputs["labels"]["multislice-stack"] == stack and inputs["labels"]["managed-by"] == "pulumi"
    actions = [rule["action"]["type"] for rule in inputs["lifecycleRules"]]
    assert actions == ["AbortIncompleteMultipartUpload", "SetStorageClass"]
    assert inputs["lifecycleRules"][1]["condition"]["matchesPrefixes"] == ["runs/"]
    assert bucket.protect is (stack == "prod")


@pytest.mark.parametrize("stack", STACKS)
def test_nodes_run_as_our_service_account_with_least_privilege(worlds, stack):
    world = worlds[stack]
    config = load_stack(stack)
    account = world.one("gcp:serviceaccount/account:Account").inputs
    email = f"{account['accountId']}@{config.project}.iam.gserviceaccount.com"
    qr = world.one(QR_TYPE).inputs
    assert qr["serviceAccount"] == email
    assert world.exports["serviceAccountEmail"] == email
    bucket_grants = world.of("gcp:storage/bucketIAMMember:BucketIAMMember")
    ours = [g.inputs for g in bucket_grants if g.inputs["bucket"] == config.bucket_name]
    assert [(g["role"], g["member"]) for g in ours] == [("roles/storage.objectUser", f"serviceAccount:{email}")]
    project_roles = sorted(g.inputs["role"] for g in world.of("gcp:projects/iAMMember:IAMMember"))
    assert project_roles == ["roles/logging.logWriter", "roles/monitoring.metricWriter"]
    others = [g.inputs for g in bucket_grants if g.inputs["bucket"] != config.bucket_name]
    if config.training.data.source.startswith("gs://"):
        data_bucket = config.training.data.source[5:].split("/")[0]
        assert [(g["bucket"], g["role"]) for g in others] == [(data_bucket, "roles/storage.objectViewer")]
    else:
        assert others == []


@pytest.mark.parametrize("stack", STACKS)
def test_node_count_prefix_and_shape_come_from_the_config(worlds, stack):
    world = worlds[stack]
    config = load_stack(stack)
    qr = world.one(QR_TYPE).inputs
    assert qr["slices"] == config.slices
    assert qr["acceleratorType"] == config.accelerator_type
    assert qr["runtimeVersion"] == config.effective_runtime_version
    assert qr["capacity"] == config.capacity
    assert qr["nodeIdPrefix"] == config.queued_resource_id and "nodeId" not in qr
    assert world.exports["nodeNames"] == config.node_ids
    assert qr["network"].endswith(f"/networks/{world.exports['networkName']}")
    assert qr["subnetwork"].endswith(f"/subnetworks/{world.exports['subnetworkName']}")
    if config.capacity == "reserved":
        assert qr["reservationName"] == f"projects/{config.project}/locations/{config.zone}/reservations/{config.reservation_name}"
    # The engine stores numbers as doubles and drops nulls.
    assert qr["trainer"] == json.loads(config.training.model_dump_json(exclude_none=True), parse_int=float)


def _bundle_from_script(text: str) -> bytes:
    """The trainer bundle (``training/*`` of the embedded release, as infra.bundle archives it)."""
    match = re.search(r"<<'MULTISLICE_RELEASE'[^\n]*\n(.*?)^MULTISLICE_RELEASE$", text, re.S | re.M)
    assert match, "no MULTISLICE_RELEASE heredoc in the startup script"
    release = lzma.decompress(base64.b64decode(match.group(1)))
    with tarfile.open(fileobj=io.BytesIO(release), mode="r:") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.startswith("training/")}
    return build_archive(files)


@pytest.mark.parametrize("stack", STACKS)
def test_startup_script_in_metadata_is_the_local_render(worlds, renders, stack):
    world = worlds[stack]
    config = load_stack(stack)
    local = renders[stack]
    qr = world.one(QR_TYPE).inputs
    text = qr["metadata"][STARTUP_SCRIPT_KEY]
    assert hashlib.sha256(text.encode()).hexdigest() == local.sha256 == qr["startupScriptSha256"]
    assert hashlib.sha256(_bundle_from_script(text)).hexdigest() == local.bundle_sha256 == qr["bundleSha256"]
    assert qr["requirementsSha256"] == local.requirements_sha256
    assert qr["startupScriptBytes"] == local.size_bytes == len(text.encode())
    assert qr["metadata"][RUN_DIR_KEY] == config.run_dir == world.exports["runDir"]
    assert world.exports["checkpointPath"] == f"{config.run_dir}/checkpoints"
    assert world.exports["bucketUrl"] == f"gs://{config.bucket_name}"


@pytest.mark.parametrize("stack", STACKS)
def test_the_script_diff_is_hidden_and_the_qr_waits_for_its_dependencies(worlds, stack):
    world = worlds[stack]
    qr = world.one(QR_TYPE)
    assert qr.hide_diffs == [f'metadata["{STARTUP_SCRIPT_KEY}"]']
    # depends_on a component means depends on every resource inside it: the NAT, the firewall
    # rules, the bucket grants and the APIs all exist before any VM boots into the script.
    components = {r.urn for r in world.registrations if r.typ.startswith("multislice:gcp:")}
    inside = {r.urn for r in world.registrations if r.parent in components}
    assert inside and inside <= set(qr.dependencies)


@pytest.mark.parametrize("stack", STACKS)
def test_exports(worlds, stack):
    world = worlds[stack]
    config = load_stack(stack)
    assert set(world.exports) == {
        "bucketUrl", "runDir", "checkpointPath", "queuedResourceName", "queuedResourceState", "nodeNames",
        "serviceAccountEmail", "networkName", "subnetworkName", "networkTag", "loggingFilter", "sshHint",
        "startupScriptBytes", "startupScriptSha256", "bundleSha256",
    }
    assert world.exports["queuedResourceName"] == (
        f"projects/{config.project}/locations/{config.zone}/queuedResources/{config.queued_resource_id}")
    log_filter = world.exports["loggingFilter"]
    assert 'resource.type="tpu_worker"' in log_filter and f'resource.labels.zone="{config.zone}"' in log_filter
    nodes = re.search(r"resource\.labels\.node_id=\((.*)\)$", log_filter).group(1)
    assert nodes.split(" OR ") == [f'"{node}"' for node in world.exports["nodeNames"]]
    assert "--tunnel-through-iap" in world.exports["sshHint"] and config.node_ids[0] in world.exports["sshHint"]


def test_evaluating_twice_gives_identical_inputs():
    first, second = evaluate("dev"), evaluate("dev")
    # Registration order is asynchronous; identity is by (type, name).
    a = {(r.typ, r.name): r.inputs for r in first.registrations}
    b = {(r.typ, r.name): r.inputs for r in second.registrations}
    assert a.keys() == b.keys() and len(a) == len(first.registrations)
    for key in a:
        assert a[key] == b[key], key  # includes the QR's pickled provider
    assert first.exports == second.exports


def test_the_program_runs_as_the_language_host_runs_it(worlds):
    world = evaluate("dev", as_main=True)
    assert sorted((r.typ, r.name) for r in world.registrations) == sorted(
        (r.typ, r.name) for r in worlds["dev"].registrations)


def test_a_still_queued_qr_fails_the_update_but_is_recorded():
    with pytest.raises(Exception, match="still WAITING_FOR_RESOURCES; recorded in the stack"):
        evaluate("dev", qr_ready=False)
    evaluate("dev", qr_ready=False, preview=True)  # a preview just shows the plan


def test_reused_network_creates_only_firewall_rules_in_it():
    config = stack_map("dev")
    config["multislice:network"] = {"existingNetwork": "shared-vpc", "existingSubnetwork": "tpu-subnet"}
    world = evaluate("dev", config)
    types = [r.typ for r in world.registrations]
    for typ in ("gcp:compute/network:Network", "gcp:compute/subnetwork:Subnetwork", "gcp:compute/routerNat:RouterNat"):
        assert typ not in types
    qr = world.one(QR_TYPE).inputs
    assert qr["network"] == "projects/acme-ml-dev/global/networks/shared-vpc"
    assert qr["subnetwork"] == "projects/acme-ml-dev/regions/us-central2/subnetworks/tpu-subnet"
    internal = next(r.inputs for r in world.of(FIREWALL) if r.inputs["name"].endswith("-internal"))
    assert internal["network"] == qr["network"] and internal["sourceRanges"] == [LOOKED_UP_CIDR]
    assert "gcp:compute/getSubnetwork:getSubnetwork" in world.calls


@pytest.mark.parametrize(
    "change, key",
    [
        ({"multislice:capacity": "best-effort"}, "multislice:capacity"),
        ({"gcp:zone": "uscentral2b"}, "gcp:zone"),
        ({"multislice:capacity": "spot", "multislice:reservationName": "acme"}, "multislice:reservationName"),
        ({"multislice:slices": 300}, "multislice:slices"),
        ({"multislice:network": {"subnetCidr": "0.0.0.0/0"}}, "multislice:network.subnetCidr"),
    ],
)
def test_unprovisionable_stacks_fail_before_any_resource_naming_the_key(change, key):
    config = {**stack_map("dev"), **change}
    with pytest.raises(StackConfigError) as err:
        evaluate("dev", config)
    assert any(line.startswith(f"{key}:") for line in err.value.lines), err.value


def test_one_evaluation_renders_the_startup_script_once(monkeypatch):
    # The render (bundle, lockfile, script) is the costly part of an evaluation; the program
    # shares one render between the QR inputs and the exports. (No wall-clock assertion.)
    calls = []
    real = startup.render

    def counting(config, *args, **kwargs):
        calls.append(config.stack)
        return real(config, *args, **kwargs)

    monkeypatch.setattr(startup, "render", counting)
    world = evaluate("prod")
    assert calls == ["prod"]
    assert world.exports["startupScriptSha256"] == world.one(QR_TYPE).inputs["startupScriptSha256"]


def test_the_service_account_keeps_the_urns_it_had_as_identity(worlds):
    # Renamed from Identity: the old type token is an alias and the logical names are the
    # ones existing stacks recorded, so `pulumi up` migrates instead of replacing the account.
    world = worlds["dev"]
    (component,) = world.of("multislice:gcp:ServiceAccount")
    assert component.name == "identity"
    assert component.aliases == [{"type": "multislice:gcp:Identity"}]
    children = sorted(r.name for r in world.registrations if r.parent == component.urn)
    assert children == ["identity-checkpoints", "identity-logging-logwriter", "identity-monitoring-metricwriter",
                        "identity-tpu-vms"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_release_record_names_the_release_the_script_carries(worlds, renders, stack):
    world, config, script = worlds[stack], load_stack(stack), renders[stack]
    assert world.one("multislice:gcp:ReleaseRecord")
    objects = {r.inputs["name"]: r for r in world.of("gcp:storage/bucketObject:BucketObject")}
    record_name, payload_name = startup.record_object(stack), startup.release_object(stack, script.release_id)
    assert set(objects) == {record_name, payload_name}
    assert all(o.inputs["bucket"] == config.bucket_name for o in objects.values())
    def content(obj) -> str:  # pulumi-gcp marks BucketObject.content secret: the engine sees it wrapped
        value = obj.inputs["content"]
        return value["value"] if isinstance(value, dict) else value

    record = json.loads(content(objects[record_name]))
    assert record == {"format": 1, "payload": payload_name, "release": script.release_id, "runDir": config.run_dir, "stack": stack}
    payload = base64.b64decode(content(objects[payload_name]))
    assert hashlib.sha256(payload).hexdigest() == script.release_id  # what the VMs verify
    assert objects[payload_name].urn in objects[record_name].dependencies  # the payload exists first
    qr_script = world.one(QR_TYPE).inputs["metadata"][STARTUP_SCRIPT_KEY]
    assert startup.release_id_of(qr_script) == script.release_id

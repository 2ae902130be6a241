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
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from infra import startup
from infra.components.network import IAP_SSH_RANGE
from infra.components.service_account import delete_role_id
from infra.config import StackConfigError, available_stacks, load_stack
from infra.startup.bundle import build_archive
from infra.vm_contract import (
    COMPILATION_CACHE_FOLDER,
    DELETE_QUEUED_RESOURCE_KEY,
    RUN_DIR_KEY,
    STARTUP_SCRIPT_KEY,
    workload_source_object,
)
from tests.fakes.pulumi_program import (
    FIREWALL,
    QR_TYPE,
    World,
    engine_config,
    evaluate,
    program_directory,
    stack_map,
    unique_id,
)
from tests.helpers.datasets import VOCAB, prepared

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
    for typ in (
        "gcp:compute/network:Network",
        "gcp:compute/subnetwork:Subnetwork",
        "gcp:compute/router:Router",
        "gcp:compute/routerNat:RouterNat",
        "gcp:storage/bucket:Bucket",
        "gcp:serviceaccount/account:Account",
        QR_TYPE,
    ):
        assert types.count(typ) == 1, typ
    assert types.count(FIREWALL) == (2 if config.network.iap_ssh else 1)
    for component in (
        "multislice:gcp:ProjectServices",
        "multislice:gcp:Network",
        "multislice:gcp:CheckpointBucket",
        "multislice:gcp:ServiceAccount",
    ):
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
    iap_ssh = load_stack(stack).network.iap_ssh
    assert len(rules) == (2 if iap_ssh else 1)
    for rule in rules:
        assert rule["targetTags"] == tags
        assert rule["direction"] == "INGRESS"
        assert "0.0.0.0/0" not in rule.get("sourceRanges", [])
        assert rule.get("sourceRanges") or rule.get("sourceTags")  # never "from anywhere" by omission
        assert rule["network"] == qr["network"]
    internal = next(r for r in rules if r["name"].endswith("-internal"))
    # By tag alone: GCP ORs sourceRanges with sourceTags, so a range would admit the whole subnet.
    assert internal["sourceTags"] == tags and "sourceRanges" not in internal
    assert sorted(a["protocol"] for a in internal["allows"]) == ["icmp", "tcp", "udp"]
    assert all("ports" not in a for a in internal["allows"])  # all ports: DCN and the coordinator (8482)
    ssh = [r for r in rules if r["name"].endswith("-iap-ssh")]
    if not iap_ssh:  # multislice:network.iapSsh off (the default): no SSH ingress at all
        assert ssh == []
        return
    assert ssh[0]["sourceRanges"] == [IAP_SSH_RANGE] and "sourceTags" not in ssh[0]
    assert ssh[0]["allows"] == [{"protocol": "tcp", "ports": ["22"]}]


def test_some_stack_enables_iap_ssh_and_another_keeps_it_off():
    # Both branches of the firewall test above run: dev opens SSH through IAP, prod does not.
    assert load_stack("dev").network.iap_ssh and not load_stack("prod").network.iap_ssh


@pytest.mark.parametrize("stack", STACKS)
def test_bucket_is_private_regional_and_protected_in_prod(worlds, stack):
    world = worlds[stack]
    config = load_stack(stack)
    bucket = world.one("gcp:storage/bucket:Bucket")
    inputs = bucket.inputs
    assert inputs["name"] == config.bucket_name
    assert inputs["publicAccessPrevention"] == "enforced"
    assert inputs["uniformBucketLevelAccess"] is True
    # us-central2 (the v4 region of dev and staging) is not a Cloud Storage location.
    assert inputs["location"] == {"us-central2": "US-CENTRAL1", "us-east5": "US-EAST5"}[config.region]
    # Soft delete: 7 days on prod (documented cost), off elsewhere (Orbax deletes old checkpoints).
    assert inputs["softDeletePolicy"]["retentionDurationSeconds"] == (7 * 86400 if stack == "prod" else 0)
    assert inputs["forceDestroy"] is False
    assert inputs["labels"]["multislice-stack"] == stack and inputs["labels"]["managed-by"] == "pulumi"
    actions = [rule["action"]["type"] for rule in inputs["lifecycleRules"]]
    assert actions == ["AbortIncompleteMultipartUpload", "SetStorageClass"]
    assert inputs["lifecycleRules"][1]["condition"]["matchesPrefixes"] == ["runs/"]
    assert bucket.protect is (stack == "prod")
    # Without forceDestroy, `pulumi destroy` keeps the bucket and its checkpoints; created, not imported.
    assert bucket.retain_on_delete is True and bucket.import_id == ""
    kept = world.exports["bucketOnDestroy"]
    if stack == "prod":
        assert kept.startswith(f"protected: pulumi destroy fails at gs://{config.bucket_name}")
    else:
        assert kept == (
            f"kept: pulumi destroy removes gs://{config.bucket_name} from the stack and leaves it and its checkpoints "
            f"in project {config.project}; delete it with: gcloud storage rm -r gs://{config.bucket_name}; or "
            "deploy this stack again with multislice:bucket.adopt: true to resume from them"
        )


def test_force_destroy_deletes_the_bucket_on_destroy():
    world = evaluate("dev", {**stack_map("dev"), "multislice:bucket": {"forceDestroy": True}})
    bucket = world.one("gcp:storage/bucket:Bucket")
    assert bucket.inputs["forceDestroy"] is True and bucket.retain_on_delete is False
    assert world.exports["bucketOnDestroy"] == (
        "deleted: pulumi destroy deletes gs://acme-ml-dev-dev-ckpt and every checkpoint in it "
        "(multislice:bucket.forceDestroy)"
    )


def test_a_kept_bucket_is_adopted_by_the_next_deployment():
    # After a destroy kept gs://<bucket>, `pulumi up` with adopt imports it (id = its name)
    # instead of creating one of the same name (which GCS would refuse).
    world = evaluate("dev", {**stack_map("dev"), "multislice:bucket": {"adopt": True}})
    bucket = world.one("gcp:storage/bucket:Bucket")
    assert bucket.import_id == "acme-ml-dev-dev-ckpt" == bucket.inputs["name"]
    assert bucket.retain_on_delete is True
    # Nothing else is imported: every other resource is created as before.
    assert [r.name for r in world.registrations if r.import_id] == ["checkpoints"]


def test_the_delete_role_id_is_new_for_every_deployment_of_a_stack():
    # A deleted custom role's id stays taken for up to 37 days: the id carries the service
    # account's unique id, which IAM assigns anew to every account it creates.
    first = delete_role_id("prod-eu", "104250395734566118352")
    again = delete_role_id("prod-eu", "117923465028135791024")
    assert first == "multisliceDeleteOnComplete_prod_eu_4566118352"
    assert again == "multisliceDeleteOnComplete_prod_eu_8135791024" and again != first
    longest = delete_role_id("a" * 15, "9" * 21)
    assert len(longest) == 53 and re.fullmatch(r"[A-Za-z0-9_.]{3,64}", longest)
    with pytest.raises(ValueError, match="a service account's unique id is a number; got 'x'"):
        delete_role_id("dev", "x")


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
    # Read and list the whole bucket; write only where the VMs write (test_the_vms_cannot_write_what_they_boot).
    # (in either order: the mocks register resources as their inputs resolve)
    assert sorted((g["role"], g["member"], "condition" in g) for g in ours) == [
        ("roles/storage.objectUser", f"serviceAccount:{email}", True),
        ("roles/storage.objectViewer", f"serviceAccount:{email}", False),
    ]
    project_roles = sorted(g.inputs["role"] for g in world.of("gcp:projects/iAMMember:IAMMember"))
    # The custom role's id ends in the last 10 digits of the account's unique id (new on every deployment).
    role_id = f"multisliceDeleteOnComplete_{stack}_{unique_id(email)[-10:]}"
    delete_role = [f"projects/{config.project}/roles/{role_id}"] if config.delete_on_complete else []
    assert project_roles == delete_role + ["roles/logging.logWriter", "roles/monitoring.metricWriter"]
    assert config.delete_on_complete is (config.capacity != "reserved")  # the shipped stacks keep the default
    custom = world.of("gcp:projects/iAMCustomRole:IAMCustomRole")
    assert [(r.inputs["roleId"], r.inputs["permissions"]) for r in custom] == (
        [(role_id, ["tpu.nodes.delete"])] if config.delete_on_complete else []
    )
    others = [g.inputs for g in bucket_grants if g.inputs["bucket"] != config.bucket_name]
    if config.training.data.source.startswith("gs://"):
        data_bucket = config.training.data.source[5:].split("/")[0]
        assert [(g["bucket"], g["role"]) for g in others] == [(data_bucket, "roles/storage.objectViewer")]
    else:
        assert others == []


def _granted(expression: str, resource_name: str) -> bool:
    """Evaluate a condition of the form the program writes: ``resource.name.startsWith("…")``
    terms joined by ``||`` (anything else fails the test)."""
    terms = expression.split(" || ")
    literals = [re.fullmatch(r'resource\.name\.startsWith\("([^"]+)"\)', term) for term in terms]
    assert all(literals), expression
    return any(resource_name.startswith(match.group(1)) for match in literals if match)


@pytest.mark.parametrize("preview", [False, True])
@pytest.mark.parametrize("stack", STACKS)
def test_the_vms_cannot_write_what_they_boot(worlds, stack, preview):
    """The VMs write checkpoints, metrics and the compilation cache; the release record and its
    payloads under multislice/<stack>/, which every boot runs as root, and datasets/ only read.
    ``pulumi preview`` shows the same grants with their condition."""
    world = evaluate(stack, preview=True) if preview else worlds[stack]
    config = load_stack(stack)
    bucket = config.bucket_name
    grants = {
        g.inputs["role"]: g.inputs
        for g in world.of("gcp:storage/bucketIAMMember:BucketIAMMember")
        if g.inputs["bucket"] == bucket
    }
    assert set(grants) == {"roles/storage.objectViewer", "roles/storage.objectUser"}
    assert "condition" not in grants["roles/storage.objectViewer"]  # listing is checked on the bucket
    condition = grants["roles/storage.objectUser"]["condition"]
    assert condition["title"] == "multislice-vm-writes" and "multislice/" in condition["description"]
    assert condition["expression"] == (
        f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/runs/") || '
        f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/compilation-cache/")'
    )

    def writable(object_name: str) -> bool:
        return _granted(condition["expression"], f"projects/_/buckets/{bucket}/objects/{object_name}")

    run_dir = config.run_dir.removeprefix(f"gs://{bucket}/")
    for written in (f"{run_dir}/checkpoints/12/_METADATA", f"{run_dir}/COMPLETE", f"{run_dir}/metrics/0.jsonl"):
        assert writable(written), written
    assert writable(f"{COMPILATION_CACHE_FOLDER}/jit_step-abc")
    released = [o.inputs["name"] for o in world.of("gcp:storage/bucketObject:BucketObject")]
    assert released and all(name.startswith(f"multislice/{stack}/") for name in released)
    for read_only in [*released, workload_source_object(stack, "0" * 64), "datasets/web/manifest.json"]:
        assert not writable(read_only), read_only
    assert not _granted(condition["expression"], f"projects/_/buckets/{bucket}")  # the bucket: no listing


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
        assert (
            qr["reservationName"]
            == f"projects/{config.project}/locations/{config.zone}/reservations/{config.reservation_name}"
        )
    # The engine stores numbers as doubles and drops nulls.
    assert qr["trainer"] == json.loads(config.training.model_dump_json(exclude_none=True), parse_int=float)


def _bundle_from_script(text: str) -> bytes:
    """The trainer bundle (``training/*`` of the embedded release, as infra.startup.bundle archives it)."""
    match = re.search(r"<<'MULTISLICE_RELEASE'[^\n]*\n(.*?)^MULTISLICE_RELEASE$", text, re.S | re.M)
    assert match, "no MULTISLICE_RELEASE heredoc in the startup script"
    release = lzma.decompress(base64.b85decode(match.group(1).strip()))
    with tarfile.open(fileobj=io.BytesIO(release), mode="r:") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.startswith("training/")}
    return build_archive(files)


@pytest.mark.parametrize("stack", STACKS)
def test_delete_on_complete_names_the_queued_resource_to_the_vms(worlds, stack):
    """With deleteOnComplete the nodes' metadata names the QR that worker 0 deletes; without
    it the key is absent (the VM then keeps the capacity)."""
    config = load_stack(stack)
    metadata = worlds[stack].one(QR_TYPE).inputs["metadata"]
    if config.delete_on_complete:
        assert metadata[DELETE_QUEUED_RESOURCE_KEY] == worlds[stack].exports["queuedResourceName"]
    else:
        assert DELETE_QUEUED_RESOURCE_KEY not in metadata


def test_delete_on_complete_off_grants_nothing_and_names_nothing():
    world = evaluate("dev", {**stack_map("dev"), "multislice:queuedResource": {"deleteOnComplete": False}})
    assert world.of("gcp:projects/iAMCustomRole:IAMCustomRole") == []
    assert sorted(g.inputs["role"] for g in world.of("gcp:projects/iAMMember:IAMMember")) == [
        "roles/logging.logWriter",
        "roles/monitoring.metricWriter",
    ]
    assert DELETE_QUEUED_RESOURCE_KEY not in world.one(QR_TYPE).inputs["metadata"]


def test_delete_on_complete_grant_is_bound_to_the_vms_account_only():
    world = evaluate("staging")
    email = world.exports["serviceAccountEmail"]
    role = world.one("gcp:projects/iAMCustomRole:IAMCustomRole")
    grant = [
        g.inputs
        for g in world.of("gcp:projects/iAMMember:IAMMember")
        if g.inputs["role"].endswith(role.inputs["roleId"])
    ]
    assert grant == [
        {
            "project": "acme-ml-staging",
            "role": f"projects/acme-ml-staging/roles/{role.inputs['roleId']}",
            "member": f"serviceAccount:{email}",
        }
    ]


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
        "backend",
        "bucketUrl",
        "bucketOnDestroy",
        "runDir",
        "checkpointPath",
        "queuedResourceName",
        "queuedResourceState",
        "nodeNames",
        "serviceAccountEmail",
        "networkName",
        "subnetworkName",
        "networkTag",
        "loggingFilter",
        "sshHint",
        "startupScriptBytes",
        "startupScriptSha256",
        "bundleSha256",
    }
    assert world.exports["backend"] == "queued-resource"  # what the next update's backend check reads
    assert world.exports["queuedResourceName"] == (
        f"projects/{config.project}/locations/{config.zone}/queuedResources/{config.queued_resource_id}"
    )
    log_filter = world.exports["loggingFilter"]
    assert 'resource.type="tpu_worker"' in log_filter and f'resource.labels.zone="{config.zone}"' in log_filter
    nodes = re.search(r"resource\.labels\.node_id=\((.*)\)$", log_filter).group(1)
    assert nodes.split(" OR ") == [f'"{node}"' for node in world.exports["nodeNames"]]
    assert "--tunnel-through-iap" in world.exports["sshHint"] and config.node_ids[0] in world.exports["sshHint"]
    assert world.exports["sshHint"].startswith("gcloud alpha ") is config.network.iap_ssh
    assert ("multislice:network.iapSsh: true" in world.exports["sshHint"]) is not config.network.iap_ssh


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
        (r.typ, r.name) for r in worlds["dev"].registrations
    )


def test_a_still_queued_qr_fails_the_update_but_is_recorded():
    with pytest.raises(Exception, match="still WAITING_FOR_RESOURCES; recorded in the stack"):
        evaluate("dev", qr_ready=False)
    evaluate("dev", qr_ready=False, preview=True)  # a preview just shows the plan


COMPUTE = "https://www.googleapis.com/compute/v1/"


def test_reused_network_with_its_own_egress_creates_only_firewall_rules_in_it():
    config = stack_map("dev")
    config["multislice:network"] = {"existingNetwork": "shared-vpc", "existingSubnetwork": "tpu-subnet", "nat": False}
    world = evaluate("dev", config, subnet_network=COMPUTE + "projects/acme-ml-dev/global/networks/shared-vpc")
    types = [r.typ for r in world.registrations]
    for typ in (
        "gcp:compute/network:Network",
        "gcp:compute/subnetwork:Subnetwork",
        "gcp:compute/router:Router",
        "gcp:compute/routerNat:RouterNat",
    ):
        assert typ not in types
    qr = world.one(QR_TYPE).inputs
    assert qr["network"] == "projects/acme-ml-dev/global/networks/shared-vpc"
    assert qr["subnetwork"] == "projects/acme-ml-dev/regions/us-central2/subnetworks/tpu-subnet"
    for rule in world.of(FIREWALL):
        assert rule.inputs["network"] == qr["network"] and rule.inputs["project"] == "acme-ml-dev"
    internal = next(r.inputs for r in world.of(FIREWALL) if r.inputs["name"].endswith("-internal"))
    assert internal["sourceTags"] == qr["tags"] and "sourceRanges" not in internal  # not the shared subnet
    assert "gcp:compute/getSubnetwork:getSubnetwork" in world.calls


def test_a_reused_network_must_say_how_its_vms_reach_the_internet():
    # The VMs have no external IPs and the startup script downloads Python and wheels.
    config = {**stack_map("dev"), "multislice:network": {"existingNetwork": "vpc", "existingSubnetwork": "tpus"}}
    with pytest.raises(StackConfigError) as err:
        evaluate("dev", config)
    (line,) = err.value.lines
    assert line.startswith("multislice:network.nat: required when reusing existingNetwork")
    assert "true creates a Cloud Router and Cloud NAT" in line and "false states" in line


def test_shared_vpc_firewall_router_and_nat_live_in_the_host_project():
    host = "acme-net-host"
    config = {
        **stack_map("dev"),
        "multislice:network": {
            "existingNetwork": f"projects/{host}/global/networks/shared",
            "existingSubnetwork": "tpus",
            "nat": True,
            "iapSsh": True,
        },
    }
    world = evaluate("dev", config, subnet_network=f"{COMPUTE}projects/{host}/global/networks/shared")
    qr = world.one(QR_TYPE).inputs
    # A subnetwork given by name is the host network's, in the zone's region.
    assert qr["subnetwork"] == f"projects/{host}/regions/us-central2/subnetworks/tpus"
    assert qr["network"] == f"projects/{host}/global/networks/shared"
    rules = world.of(FIREWALL)
    assert len(rules) == 2 and {r.inputs["project"] for r in rules} == {host}
    assert world.one("gcp:compute/router:Router").inputs["project"] == host
    assert world.one("gcp:compute/routerNat:RouterNat").inputs["project"] == host
    # The stack's own resources stay in the stack's project.
    assert world.one("gcp:storage/bucket:Bucket").inputs["project"] == "acme-ml-dev"
    assert world.one("gcp:serviceaccount/account:Account").inputs["project"] == "acme-ml-dev"
    assert world.one(QR_TYPE).inputs["project"] == "acme-ml-dev"


def test_a_shared_vpc_stack_warns_once_at_preview_about_the_tpu_service_agent(monkeypatch):
    """docs/deploying.md "Shared VPC": the program grants nothing in the host project and refuses
    nothing; the preview names the grant to make if the queued resource fails for want of it."""
    import pulumi

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warned.append(message))
    host = "acme-net-host"
    config = {
        **stack_map("dev"),
        "multislice:network": {
            "existingNetwork": f"projects/{host}/global/networks/shared",
            "existingSubnetwork": "tpus",
            "nat": False,
        },
    }
    evaluate("dev", config, subnet_network=f"{COMPUTE}projects/{host}/global/networks/shared", preview=True)
    shared = [w for w in warned if w.startswith("Shared VPC:")]
    assert len(shared) == 1 and "roles/compute.networkUser" in shared[0] and host in shared[0]
    assert "; action needed if the queued resource fails with a permission error on that subnetwork: " in shared[0]
    warned.clear()
    evaluate("dev", preview=True)  # a network of the stack's own project: no such warning
    assert not [w for w in warned if w.startswith("Shared VPC:")]


def test_a_subnetwork_of_another_network_fails_the_preview_naming_the_key():
    config = {
        **stack_map("dev"),
        "multislice:network": {"existingNetwork": "vpc-a", "existingSubnetwork": "tpus", "nat": False},
    }
    with pytest.raises(
        Exception,
        match=r"multislice:network.existingSubnetwork: projects/acme-ml-dev/regions/"
        r"us-central2/subnetworks/tpus belongs to network projects/acme-ml-dev/"
        r"global/networks/vpc-b, not to existingNetwork",
    ):
        evaluate("dev", config, preview=True, subnet_network=COMPUTE + "projects/acme-ml-dev/global/networks/vpc-b")


@pytest.mark.parametrize(
    "change, key",
    [
        ({"multislice:capacity": "best-effort"}, "multislice:capacity"),
        ({"gcp:zone": "uscentral2b"}, "gcp:zone"),
        ({"multislice:capacity": "spot", "multislice:reservationName": "acme"}, "multislice:reservationName"),
        ({"multislice:slices": 300}, "multislice:slices"),
        ({"multislice:network": {"subnetCidr": "0.0.0.0/0"}}, "multislice:network.subnetCidr"),
        # What the TPU API would refuse only after the network, bucket and service account exist:
        ({"gcp:zone": "us-east5-a"}, "gcp:zone"),  # no v4 there
        ({"multislice:runtimeVersion": "tpu-ubuntu2204-base; rm -rf /"}, "multislice:runtimeVersion"),
        ({"multislice:runtimeVersion": "v2-alpha-tpuv5"}, "multislice:runtimeVersion"),  # v5p's, not v4's
        (
            {
                "multislice:network": {
                    "existingNetwork": "vpc",
                    "existingSubnetwork": "projects/acme-ml-dev/regions/us-east5/subnetworks/s",
                    "nat": True,
                }
            },
            "multislice:network.existingSubnetwork",
        ),
        (
            {
                "multislice:network": {
                    "existingNetwork": "projects/acme-net-host/global/networks/shared",
                    "existingSubnetwork": "projects/acme-ml-dev/regions/us-central2/subnetworks/s",
                    "nat": True,
                }
            },
            "multislice:network.existingSubnetwork",
        ),
        ({"gcp:zone": "us-central9-a", "multislice:allowUnlisted": ["zone"]}, "multislice:bucket.location"),
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
    # dev (spot) deletes its queued resource on complete: its custom role and grant are new children.
    assert children == [
        "identity-checkpoints",
        "identity-checkpoints-read",
        "identity-delete-on-complete",
        "identity-delete-role",
        "identity-logging-logwriter",
        "identity-monitoring-metricwriter",
        "identity-tpu-vms",
    ]


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
    assert record == {
        "format": 1,
        "payload": payload_name,
        "release": script.release_id,
        "runDir": config.run_dir,
        "stack": stack,
    }
    payload = base64.b64decode(content(objects[payload_name]))
    assert hashlib.sha256(payload).hexdigest() == script.release_id  # what the VMs verify
    assert objects[payload_name].urn in objects[record_name].dependencies  # the payload exists first
    qr_script = world.one(QR_TYPE).inputs["metadata"][STARTUP_SCRIPT_KEY]
    assert startup.release_id_of(qr_script) == script.release_id


# As the language host runs the program (tests/fakes/language_host.py) ------------------------

ROOT = Path(__file__).resolve().parents[2]
#: The directory the CLI runs as the program (Pulumi.yaml's ``main``, else the project's).
PROGRAM = program_directory()


def run_as_the_language_host(program: Path, config: dict, *, preview: bool = True) -> subprocess.CompletedProcess:
    """``pulumi preview`` (or ``up``) of stack dev: the program run by the language host's
    steps against mocks; the config arrives in PULUMI_CONFIG as the engine sends it."""
    env = {**os.environ, "PULUMI_CONFIG": json.dumps(engine_config(config))}
    command = [
        sys.executable,
        "-m",
        "tests.fakes.language_host",
        "--stack",
        "dev",
        "--dry_run",
        "true" if preview else "false",
        str(program),
    ]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_a_config_error_under_pulumi_preview_is_one_message_naming_the_key():
    result = run_as_the_language_host(PROGRAM, {**stack_map("dev"), "multislice:slices": 300})
    assert result.returncode == 1  # the host's status after a pulumi.RunError
    lines = result.stderr.splitlines()
    assert lines == [
        "error: stack 'dev' (pulumi config) is invalid:",
        "  multislice:slices: Input should be less than or equal to 256",
    ], result.stderr
    assert "Traceback" not in result.stdout


def test_without_run_error_the_language_host_would_print_a_traceback(tmp_path):
    # The same config error raised as it is (not as pulumi.RunError): what users would see.
    (tmp_path / "__main__.py").write_text("from infra.__main__ import define, load_config\n\ndefine(load_config())\n")
    result = run_as_the_language_host(tmp_path, {**stack_map("dev"), "multislice:slices": 300})
    assert result.returncode == 32
    assert "error: Program failed with an unhandled exception:" in result.stderr
    assert "Traceback (most recent call last)" in result.stderr and "StackConfigError" in result.stderr


def test_allow_unlisted_turns_the_catalog_checks_into_warnings():
    config = {
        **stack_map("dev"),
        "gcp:zone": "us-central2-a",
        "multislice:runtimeVersion": "tpu-ubuntu2404-base",
        "multislice:allowUnlisted": ["zone", "runtimeVersion"],
    }
    result = run_as_the_language_host(PROGRAM, config)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert any(
        w.startswith("warning: gcp:zone us-central2-a is not in the catalog's zones for TPU v4") for w in warnings
    )
    assert any(
        w.startswith("warning: multislice:runtimeVersion 'tpu-ubuntu2404-base' is not in the catalog") for w in warnings
    )
    assert not [line for line in result.stderr.splitlines() if line.startswith("error")]


def test_release_on_complete_warns_once_at_preview_naming_delete_on_complete():
    config = {**stack_map("dev"), "multislice:queuedResource": {"releaseOnComplete": False}}
    result = run_as_the_language_host(PROGRAM, config)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "releaseOnComplete" in line]
    assert warnings == [
        "warning: multislice:queuedResource.releaseOnComplete is deprecated (multislice:queuedResource."
        "deleteOnComplete has the same meaning); action needed: rename it to multislice:queuedResource.deleteOnComplete"
    ]


def test_a_queued_resource_deleted_on_complete_warns_why_nothing_is_created(monkeypatch):
    """A QR the provider reads as deleted on complete (its run completed): `pulumi preview`/`up` print its
    status line as a warning, and neither fails for the QR not being ready."""
    import infra.backends.queued_resource.program as program

    warned: list[str] = []
    monkeypatch.setattr(program.pulumi.log, "warn", lambda message, *args, **kwargs: warned.append(message))
    monkeypatch.setattr(program.pulumi.runtime, "is_dry_run", lambda: False)
    status = "deleted on complete: the run gs://b/runs/dev completed at step 120, so ... set a new multislice:runName"
    program._require_ready([True, status, True])
    assert warned == [f"queued resource {status}; no action needed: its run is complete"]
    program._require_ready([True, "ACTIVE after 3m", False])
    assert len(warned) == 1
    with pytest.raises(program.pulumi.RunError, match="still queued"):
        program._require_ready([False, "still queued", None])


def test_a_command_stack_describes_its_command_and_ships_it():
    # multislice:workload instead of multislice:training: the queued resource's trainer input is
    # the command's description (the provider reads its steps; policies see a command), and the
    # release it boots holds the command, not the trainer's config.
    source = Path(__file__).parents[1] / "fakes" / "workload"
    config = {k: v for k, v in stack_map("dev").items() if k != "multislice:training"}
    config["multislice:workload"] = {"command": ["python3", "workload_program.py"], "steps": 30, "source": str(source)}
    world = evaluate("dev", config)
    qr = world.one(QR_TYPE)
    assert qr.inputs["trainer"] == {"command": ["python3", "workload_program.py"], "env": {}, "steps": 30}
    assert {"workload.json", "workload/workload_program.py"} <= set(qr.inputs["releaseFiles"])
    assert "config.json" not in qr.inputs["releaseFiles"]


# A prepared dataset's vocabulary against the model (infra.config.dataset) -----------------------


def on_dataset(source: str, **model) -> dict:
    config = stack_map("dev")
    training = config["multislice:training"]
    return {
        **config,
        "multislice:training": {**training, "data": {"source": source}, "model": training["model"] | model},
    }


def test_a_vocabulary_smaller_than_the_datasets_fails_the_preview_before_any_resource(tmp_path, monkeypatch):
    from tests.fakes import pulumi_program

    source = prepared(str(tmp_path / "bpe"), tmp_path / "text")
    created: list[str] = []
    real = pulumi_program.Mocks.new_resource
    monkeypatch.setattr(
        pulumi_program.Mocks, "new_resource", lambda self, args: created.append(args.typ) or real(self, args)
    )
    with pytest.raises(StackConfigError) as err:
        evaluate("dev", on_dataset(source, vocab_size=256), preview=True)
    assert len(err.value.lines) == 1, err.value
    assert err.value.lines[0].startswith("multislice:training.model.vocab_size: 256 is smaller than")
    assert f"({VOCAB} ids in its manifest.json)" in err.value.lines[0]
    assert created == []
    evaluate("dev", on_dataset(source), preview=True)  # unset: the model takes the manifest's
    assert created  # (the same harness registers resources when the stack fits its data)


def test_an_unreadable_dataset_manifest_warns_once_at_preview(tmp_path, monkeypatch):
    import pulumi

    warned: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warned.append(message))
    source = str(tmp_path / "prepared-later")
    world = evaluate("dev", on_dataset(source), preview=True)
    about = [w for w in warned if "manifest" in w]
    assert len(about) == 1 and about[0].startswith(f"multislice:training.data.source {source}: "), warned
    assert about[0].endswith("; no action needed: the trainer checks it on the TPU VMs before its first step")
    assert world.one(QR_TYPE).inputs["trainer"]["data"]["source"] == source


def test_a_vocabulary_error_under_pulumi_preview_is_one_message_naming_the_key(tmp_path):
    source = prepared(str(tmp_path / "bpe"), tmp_path / "text")
    result = run_as_the_language_host(PROGRAM, on_dataset(source, vocab_size=256))
    assert result.returncode == 1  # the host's status after a pulumi.RunError
    lines = result.stderr.splitlines()
    assert lines[0] == "error: stack 'dev' does not fit its training data:", result.stderr
    assert len(lines) == 2 and lines[1].startswith("  multislice:training.model.vocab_size: 256 is smaller than")
    assert "Traceback" not in result.stdout + result.stderr

"""Each CrossGuard policy (infra/policy/policies.py) on a resource that passes and one that fails.

The policies run through pulumi_policy's own ``validate`` with ``ResourceValidationArgs`` /
``StackValidationArgs`` built as the package's tests and its analyzer build them. The passing
queued resource is the one the program declares for the dev stack (evaluated under mocks);
each failing one changes exactly the property the policy is about.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
from pulumi_policy import (
    EnforcementLevel,
)

from infra.policy import policies
from infra.policy.policies import POLICIES
from infra.startup import METADATA_VALUE_LIMIT_BYTES
from tests.fakes.pulumi_program import QR_TYPE, evaluate
from tests.fakes.queued_resource import clear_ambient_credentials, refuse_connections
from tests.helpers.policies import changed, stack_violations, violations

FIREWALL = "gcp:compute/firewall:Firewall"
BUCKET = "gcp:storage/bucket:Bucket"


@pytest.fixture(scope="module")
def dev_qr() -> dict[str, Any]:
    world = evaluate("dev")
    props = dict(world.one(QR_TYPE).inputs)
    props.pop("__provider", None)
    return props


def test_policy_levels_and_names():
    mandatory = {p.name for p in POLICIES if p.enforcement_level is EnforcementLevel.MANDATORY}
    advisory = {p.name for p in POLICIES if p.enforcement_level is EnforcementLevel.ADVISORY}
    assert mandatory == {
        "firewall-no-public-ingress",
        "firewall-ssh-iap-only",
        "tpu-no-external-ips",
        "bucket-private-uniform",
        "tpu-dedicated-service-account",
        "dcn-tensor-parallelism-one",
        "multislice-v4-or-later",
        "startup-script-safe",
        "values-carry-no-credentials",
        "training-fits-hbm",
        "data-source-exists",
        "vm-cannot-write-release",
        "multislice-program",
        "gke-private-nodes",
        "gke-workload-identity",
        "gke-node-service-account",
        "gke-pod-service-account",
    }
    assert advisory == {"required-labels", "prod-capacity", "backend-change", "gke-deletion-protection"}


@pytest.mark.parametrize("ranges", [["0.0.0.0/0"], ["10.0.0.0/8", "::/0"]])
def test_firewall_public_ingress_fails(ranges):
    props = {"direction": "INGRESS", "sourceRanges": ranges, "allows": [{"protocol": "tcp", "ports": ["22"]}]}
    assert violations("firewall-no-public-ingress", FIREWALL, props)
    # direction defaults to INGRESS in the Compute API
    assert violations("firewall-no-public-ingress", FIREWALL, {k: v for k, v in props.items() if k != "direction"})


def test_firewall_private_or_egress_passes():
    assert (
        violations(
            "firewall-no-public-ingress", FIREWALL, {"direction": "INGRESS", "sourceRanges": ["35.235.240.0/20"]}
        )
        == []
    )
    assert (
        violations("firewall-no-public-ingress", FIREWALL, {"direction": "EGRESS", "destinationRanges": ["0.0.0.0/0"]})
        == []
    )


def test_the_stacks_iap_ssh_rule_passes_the_ssh_policy():
    from infra.components.network import IAP_SSH_RANGE

    rule = {"direction": "INGRESS", "sourceRanges": [IAP_SSH_RANGE], "allows": [{"protocol": "tcp", "ports": ["22"]}]}
    assert violations("firewall-ssh-iap-only", FIREWALL, rule) == []
    # the internal rule: every TCP port, by tag only
    internal = {"direction": "INGRESS", "sourceTags": ["t"], "allows": [{"protocol": "tcp"}, {"protocol": "udp"}]}
    assert violations("firewall-ssh-iap-only", FIREWALL, internal) == []
    # another port from a private range is not SSH
    web = {"direction": "INGRESS", "sourceRanges": ["10.0.0.0/8"], "allows": [{"protocol": "tcp", "ports": ["443"]}]}
    assert violations("firewall-ssh-iap-only", FIREWALL, web) == []


@pytest.mark.parametrize(
    "allows",
    [
        [{"protocol": "tcp", "ports": ["22"]}],
        [{"protocol": "tcp"}],  # every TCP port
        [{"protocol": "tcp", "ports": ["20-25"]}],
        [{"protocol": "all"}],
    ],
)
def test_ssh_from_another_range_fails(allows):
    props = {"direction": "INGRESS", "sourceRanges": ["10.0.0.0/8"], "allows": allows}
    (message,) = violations("firewall-ssh-iap-only", FIREWALL, props)
    assert "10.0.0.0/8" in message and "35.235.240.0/20" in message
    # with IAP's range beside it the other range still fails
    assert violations("firewall-ssh-iap-only", FIREWALL, {**props, "sourceRanges": ["35.235.240.0/20", "10.0.0.0/8"]})


@pytest.mark.parametrize(
    "allows",
    [
        [{"protocol": "tcp", "ports": ["22", "3389"]}],
        [{"protocol": "tcp"}],
        [{"protocol": "tcp", "ports": ["22"]}, {"protocol": "udp"}],
    ],
)
def test_iap_range_on_more_than_ssh_fails(allows):
    props = {"direction": "INGRESS", "sourceRanges": ["35.235.240.0/20"], "allows": allows}
    (message,) = violations("firewall-ssh-iap-only", FIREWALL, props)
    assert "more than TCP port 22" in message


def test_external_ips_fail_unless_the_stack_allows_them(dev_qr):
    assert violations("tpu-no-external-ips", QR_TYPE, dev_qr) == []
    exposed = changed(dev_qr, enableExternalIps=True)
    assert violations("tpu-no-external-ips", QR_TYPE, exposed)
    assert violations("tpu-no-external-ips", "gcp:tpu/v2Vm:V2Vm", {"networkConfig": {"enableExternalIps": True}})
    assert violations("tpu-no-external-ips", QR_TYPE, exposed, config={"allowExternalIps": True}) == []


def test_bucket_must_be_private_and_uniform():
    good = {"publicAccessPrevention": "enforced", "uniformBucketLevelAccess": True}
    assert violations("bucket-private-uniform", BUCKET, good) == []
    assert len(violations("bucket-private-uniform", BUCKET, {**good, "publicAccessPrevention": "inherited"})) == 1
    assert len(violations("bucket-private-uniform", BUCKET, {**good, "uniformBucketLevelAccess": False})) == 1
    assert len(violations("bucket-private-uniform", BUCKET, {})) == 2


def test_program_bucket_passes():
    bucket = evaluate("dev").one(BUCKET)
    assert violations("bucket-private-uniform", BUCKET, bucket.inputs) == []


def test_tpu_service_account_is_dedicated(dev_qr):
    assert dev_qr["serviceAccount"].endswith(".iam.gserviceaccount.com")
    assert violations("tpu-dedicated-service-account", QR_TYPE, dev_qr) == []
    default = changed(dev_qr, serviceAccount="123456789-compute@developer.gserviceaccount.com")
    assert "default service account" in violations("tpu-dedicated-service-account", QR_TYPE, default)[0]
    assert violations(
        "tpu-dedicated-service-account", QR_TYPE, {k: v for k, v in dev_qr.items() if k != "serviceAccount"}
    )


def test_dcn_tensor_parallelism_must_be_one(dev_qr):
    assert violations("dcn-tensor-parallelism-one", QR_TYPE, dev_qr) == []
    bad = copy.deepcopy(dev_qr)
    bad["trainer"]["parallelism"]["dcn"] = {"data": 1, "fsdp": 1, "tensor": 2.0}  # engine numbers are floats
    assert "dcn.tensor is 2" in violations("dcn-tensor-parallelism-one", QR_TYPE, bad)[0]


@pytest.mark.parametrize(
    "accelerator, slices, ok",
    [("v4-8", 2, True), ("v5p-128", 256, True), ("v4-8", 257, False), ("v3-8", 2, False), ("v2-8", 1, True)],
)
def test_multislice_generation_and_size(dev_qr, accelerator, slices, ok):
    props = changed(dev_qr, acceleratorType=accelerator, slices=float(slices))
    assert (violations("multislice-v4-or-later", QR_TYPE, props) == []) is ok


def test_startup_script_limit_and_credentials(dev_qr):
    assert violations("startup-script-safe", QR_TYPE, dev_qr) == []
    script = dev_qr["metadata"]["startup-script"]
    big = changed(dev_qr, metadata={**dev_qr["metadata"], "startup-script": script + "#" * METADATA_VALUE_LIMIT_BYTES})
    assert "bytes" in violations("startup-script-safe", QR_TYPE, big)[0]
    leaked = script.replace("\n", '\nexport DB_PASSWORD="correct-horse-battery"\n', 1)
    found = violations(
        "startup-script-safe", QR_TYPE, changed(dev_qr, metadata={**dev_qr["metadata"], "startup-script": leaked})
    )
    assert len(found) == 1 and "line 2" in found[0] and "password" in found[0]


@pytest.mark.parametrize(
    "line, kind",
    [
        ("-----BEGIN RSA PRIVATE KEY-----", "PEM private key"),
        ('{"type": "service_account", "private_key": "x"}', "private_key"),
        ("curl -H 'Authorization: Bearer ya29.a0AfH6SMBx3kZQ7c9T1uVwE8r'", "OAuth access token"),
        ("KEY=AIzaSyA1234567890abcdefghijklmnopqrstuv", "API key"),
        ("AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE", "AWS access key"),
        ("git clone https://ghp_" + "a" * 36 + "@github.com/x/y", "GitHub token"),
        ("api_key: 'abcdefgh12345'", "password or token"),
        ('{"env": {"AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG"}}', "password or token"),  # as JSON writes env
        ('"HF_TOKEN": "hf_abcdefghijkl"', "password or token"),
        ("pkg @ https://ci:pa55word@pypi.example.com/pkg.tar.gz", "password in a URL"),
    ],
)
def test_secret_patterns(line, kind):
    from infra.policy.secret_patterns import find_secrets

    found = find_secrets("#!/bin/bash\n" + line + "\n")
    assert [m.line for m in found] == [2] and kind in found[0].kind


@pytest.mark.parametrize(
    "line",
    [
        'TOKEN="${VAULT_TOKEN_VALUE}"',
        'PASSWORD="$(cat /run/secrets/db)"',
        "password_file=/etc/pw",
        'secret="short"',
        'TOKENIZER_FILE = "tokenizer.json"',  # "token" is not a word of the name
        'num_tokens = "12345678"',
        "https://user@example.com/x.tar.gz",  # a user, no password
    ],
)
def test_secret_patterns_leave_non_literals_alone(line):
    from infra.policy.secret_patterns import find_secrets

    assert find_secrets(line) == []


def test_training_over_hbm_fails_unless_overridden(dev_qr):
    assert violations("training-fits-hbm", QR_TYPE, dev_qr) == []
    huge = copy.deepcopy(dev_qr)
    huge["trainer"]["model"]["d_model"] = 65536.0  # the example, on v4-8 (32 GiB per chip)
    found = violations("training-fits-hbm", QR_TYPE, huge)
    assert len(found) == 1 and "GiB per chip" in found[0] and "32 GiB" in found[0]
    assert violations("training-fits-hbm", QR_TYPE, huge, config={"allowOverHbm": True}) == []


def with_source(props: dict[str, Any], source: str) -> dict[str, Any]:
    out = copy.deepcopy(props)
    out["trainer"].setdefault("data", {})["source"] = source
    return out


def test_a_gs_data_source_must_match_a_non_empty_object(dev_qr, bucket):
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)
    fs.pipe({f"{bucket}/corpus/a.txt": b"some text", f"{bucket}/corpus/empty.txt": b"", f"{bucket}/other/b.md": b"x"})
    assert violations("data-source-exists", QR_TYPE, with_source(dev_qr, f"gs://{bucket}/corpus/*.txt")) == []
    for source, reason in [
        (f"gs://{bucket}/corpus/*.json", "matches no non-empty object (0 object(s) matched)"),
        (f"gs://{bucket}/corpus/empty.txt", "matches no non-empty object (1 object(s) matched)"),
        (f"gs://{bucket}-missing/corpus/*.txt", "does not exist"),
        (f"gs://{bucket}/datasets/none", "matches no non-empty object (0 object(s) matched)"),
    ]:
        found = violations("data-source-exists", QR_TYPE, with_source(dev_qr, source))
        assert (
            len(found) == 1
            and found[0].startswith(f"multislice:training.data.source {source!r}")
            and reason in found[0]
        ), found


def test_a_prepared_dataset_matches_through_its_manifest(dev_qr, bucket):
    import gcsfs

    fs = gcsfs.GCSFileSystem(token="anon", skip_instance_cache=True)
    fs.pipe({f"{bucket}/datasets/web/manifest.json": b"{}", f"{bucket}/datasets/web/train/00000.bin": b"ab"})
    assert violations("data-source-exists", QR_TYPE, with_source(dev_qr, f"gs://{bucket}/datasets/web")) == []


def test_a_gs_data_source_is_unchecked_without_credentials(dev_qr, monkeypatch, tmp_path):
    # No emulator, no credentials in the environment or gcloud's config: nothing is sent (an
    # attempt would fail the test: the socket guard below refuses any connection).
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    clear_ambient_credentials(monkeypatch, tmp_path)
    attempts = refuse_connections(monkeypatch)
    assert violations("data-source-exists", QR_TYPE, with_source(dev_qr, "gs://acme-ml-prod-corpora/bytes/*.txt")) == []
    assert violations("data-source-exists", QR_TYPE, with_source(dev_qr, "stdlib")) == []
    assert attempts == []


def test_the_socket_guard_leaves_the_sessions_storage_proxy_serving(bucket, monkeypatch):
    # The guard above refuses this test's connections, not those of the session's judged proxy
    # (tests/conftest.py) forwarding a request from a client connected before it (as a CI run
    # saw: a stray request meanwhile made the guard record the proxy's own forwarding).
    import http.client
    import urllib.parse

    proxy = urllib.parse.urlsplit(os.environ["STORAGE_EMULATOR_HOST"])
    client = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=30)
    client.connect()
    attempts = refuse_connections(monkeypatch)
    try:
        client.request("GET", f"/storage/v1/b/{bucket}")
        answer = client.getresponse()
        assert (answer.status, json.loads(answer.read())["name"]) == (200, bucket)
    finally:
        client.close()
    assert attempts == []


BUCKET_MEMBER = "gcp:storage/bucketIAMMember:BucketIAMMember"
BUCKET_BINDING = "gcp:storage/bucketIAMBinding:BucketIAMBinding"
BUCKET_POLICY = "gcp:storage/bucketIAMPolicy:BucketIAMPolicy"
FOLDER_MEMBER = "gcp:storage/managedFolderIamMember:ManagedFolderIamMember"
PROJECT_MEMBER = "gcp:projects/iAMMember:IAMMember"
PROJECT_BINDING = "gcp:projects/iAMBinding:IAMBinding"
VM = "serviceAccount:multislice-dev-tpu@acme-ml-dev.iam.gserviceaccount.com"
CKPT = "acme-ml-dev-dev-ckpt"


def objects(prefix: str, bucket: str = CKPT) -> str:
    return f'resource.name.startsWith("projects/_/buckets/{bucket}/objects/{prefix}")'


def write_grant(condition: str | None = None, *, role: str = "roles/storage.objectUser", member: str = VM) -> dict:
    grant = {"bucket": CKPT, "role": role, "member": member}
    if condition is not None:
        grant["condition"] = {"title": "t", "expression": condition}
    return grant


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_the_programs_own_grants_keep_the_vms_out_of_their_release(stack):
    world = evaluate(stack)
    grants = [r for r in world.registrations if r.typ in (BUCKET_MEMBER, PROJECT_MEMBER)]
    assert len(grants) >= 4  # read and write on the bucket, logs and metrics on the project
    for grant in grants:
        assert violations("vm-cannot-write-release", grant.typ, grant.inputs) == [], grant.name


def test_a_vm_write_grant_without_a_condition_is_refused():
    # The grant the program made before: objectUser on the whole checkpoint bucket.
    (message,) = violations("vm-cannot-write-release", BUCKET_MEMBER, write_grant())
    assert message.startswith(
        f"IAM grant 'r' gives {VM} roles/storage.objectUser on bucket {CKPT} without a condition: the TPU VMs "
        "could write the release record under multislice/"
    )
    assert "runs/, compilation-cache/" in message


@pytest.mark.parametrize(
    "condition",
    [
        objects(""),  # every object
        objects("multislice/"),
        objects("multislice/dev/releases/"),
        objects("multi"),  # a prefix of multislice/
        f'resource.name.startsWith("projects/_/buckets/{CKPT}")',  # the bucket and every object in it
        f'resource.name.startsWith("projects/_/buckets/{CKPT[:5]}")',  # a prefix of its name
        f"{objects('runs/')} || {objects('multislice/')}",  # one alternative reaches the release
        f"!{objects('runs/')}",  # not read: taken as not confining
        "true",
        'request.time < timestamp("2030-01-01T00:00:00Z")',
    ],
)
def test_a_condition_that_does_not_keep_the_vms_out_of_multislice_is_refused(condition):
    (message,) = violations("vm-cannot-write-release", BUCKET_MEMBER, write_grant(condition))
    assert f"under a condition that does not keep it out of multislice/ ({condition!r})" in message


@pytest.mark.parametrize(
    "condition",
    [
        objects("runs/"),
        f"{objects('runs/')} || {objects('compilation-cache/')}",
        f"({objects('runs/')}) || ({objects('compilation-cache/')})",
        f'resource.type == "storage.googleapis.com/Object" && {objects("runs/")}',
        objects("", bucket="another-bucket"),  # no object of this bucket
        objects("runs/||multislice/"),  # one literal: an operator inside the quotes is text
        objects("runs/").replace('"', "'"),
    ],
)
def test_a_condition_that_keeps_the_vms_out_of_multislice_passes(condition):
    assert violations("vm-cannot-write-release", BUCKET_MEMBER, write_grant(condition)) == []


@pytest.mark.parametrize(
    "role, member",
    [
        ("roles/storage.objectViewer", VM),  # reading the release is what the VMs do
        ("roles/storage.objectUser", "user:ops@acme.example"),  # not the VMs
        ("roles/storage.objectUser", "serviceAccount:deployer@acme-ml-dev.iam.gserviceaccount.com"),
        ("projects/acme-ml-dev/roles/custom", VM),  # a custom role's permissions are not in the grant
    ],
)
def test_other_roles_and_members_are_not_this_policys_concern(role, member):
    assert violations("vm-cannot-write-release", BUCKET_MEMBER, write_grant(role=role, member=member)) == []


@pytest.mark.parametrize(
    "role",
    [
        "roles/storage.objectCreator",
        "roles/storage.objectAdmin",
        "roles/storage.admin",
        "roles/storage.legacyBucketWriter",
        "roles/storage.legacyBucketOwner",
    ],
)
def test_every_role_that_writes_objects_is_held_to_it(role):
    assert violations("vm-cannot-write-release", BUCKET_MEMBER, write_grant(role=role))
    assert violations("vm-cannot-write-release", BUCKET_MEMBER, write_grant(objects("runs/"), role=role)) == []


def test_bindings_policies_folders_and_project_grants_are_held_to_it():
    binding = {"bucket": CKPT, "role": "roles/storage.objectAdmin", "members": ["user:ops@acme.example", VM]}
    (message,) = violations("vm-cannot-write-release", BUCKET_BINDING, binding)
    assert f"gives {VM} roles/storage.objectAdmin on bucket {CKPT} without a condition" in message
    policy_data = json.dumps({"bindings": [{"role": "roles/storage.objectUser", "members": [VM]}]})
    assert violations("vm-cannot-write-release", BUCKET_POLICY, {"bucket": CKPT, "policyData": policy_data})
    folder = {"bucket": CKPT, "managedFolder": "multislice/", "role": "roles/storage.objectUser", "member": VM}
    (message,) = violations("vm-cannot-write-release", FOLDER_MEMBER, folder)
    assert f"on bucket {CKPT} (managed folder multislice/)" in message
    assert violations("vm-cannot-write-release", FOLDER_MEMBER, {**folder, "managedFolder": "runs/"}) == []
    # A project-level grant reaches every bucket: a condition must name the bucket's objects.
    project = {"project": "acme-ml-dev", "role": "roles/storage.admin", "member": VM}
    (message,) = violations("vm-cannot-write-release", PROJECT_MEMBER, project)
    assert "on the project (every bucket) without a condition" in message
    editor = {"project": "acme-ml-dev", "role": "roles/editor", "members": [VM]}
    assert violations("vm-cannot-write-release", PROJECT_BINDING, editor)
    confined = {**project, "condition": {"title": "t", "expression": objects("runs/")}}
    assert violations("vm-cannot-write-release", PROJECT_MEMBER, confined) == []
    any_bucket = {
        **project,
        "condition": {"title": "t", "expression": 'resource.name.startsWith("projects/_/buckets/")'},
    }
    assert violations("vm-cannot-write-release", PROJECT_MEMBER, any_bucket)


def test_multislice_check_refuses_the_program_with_its_write_grant_unconditioned():
    from infra.policy.evaluate import check_world

    world = evaluate("dev")
    assert not [v for v in check_world(world) if v.policy == "vm-cannot-write-release"]
    (grant,) = [r for r in world.of(BUCKET_MEMBER) if r.inputs["role"] == "roles/storage.objectUser"]
    del grant.inputs["condition"]  # the grant as it was before the condition
    (found,) = [v for v in check_world(world) if v.policy == "vm-cannot-write-release"]
    assert found.mandatory and found.resource == grant.urn
    assert found.message.startswith("IAM grant 'identity-checkpoints' gives serviceAccount:multislice-dev-tpu@")


def test_a_program_that_is_not_ours_is_named(dev_qr):
    assert stack_violations([(FIREWALL, {}), (QR_TYPE, dev_qr)]) == []
    found = stack_violations([(BUCKET, {"name": "b"})])
    assert len(found) == 1 and policies.QUEUED_RESOURCE_TYPE in found[0]


def test_required_labels_advisory(dev_qr):
    labelled = changed(dev_qr, labels={**dev_qr["labels"], "env": "dev", "owner": "ml-infra", "cost-center": "cc-42"})
    assert violations("required-labels", QR_TYPE, labelled) == []
    found = violations("required-labels", QR_TYPE, changed(labelled, labels={"env": "dev"}))
    assert len(found) == 1 and "owner, cost-center" in found[0]


def test_prod_queued_resource_on_spot_needs_protection(dev_qr):
    prod_labels = {**dev_qr["labels"], "multislice-stack": "prod"}
    spot = changed(dev_qr, labels=prod_labels, capacity="spot")
    assert violations("prod-capacity", QR_TYPE, spot)
    assert violations("prod-capacity", QR_TYPE, spot, protect=True) == []
    assert violations("prod-capacity", QR_TYPE, changed(spot, capacity="reserved")) == []
    assert violations("prod-capacity", QR_TYPE, dev_qr) == []  # dev on spot: not prod


def test_a_command_workload_is_not_held_to_the_trainers_policies(dev_qr):
    # multislice:workload: the trainer input describes the command (infra/__main__.py), and the
    # memory estimate and data-source check of the bundled trainer do not apply to it.
    command = changed(dev_qr, trainer={"command": ["python3", "train.py"], "env": {}, "steps": 100.0})
    for policy in ("training-fits-hbm", "data-source-exists", "dcn-tensor-parallelism-one"):
        assert violations(policy, QR_TYPE, command) == [], policy


def test_a_policy_config_file_past_its_bounds_is_one_line(tmp_path):
    import os

    from infra.policy.evaluate import MAX_POLICY_CONFIG_BYTES, PolicyConfigError, load_policy_config

    fifo, big, deep = tmp_path / "fifo.json", tmp_path / "big.json", tmp_path / "deep.json"
    os.mkfifo(fifo)  # read_text would wait for a writer
    big.write_bytes(b" " * (MAX_POLICY_CONFIG_BYTES + 1) + b"{}")
    deep.write_text("[" * 100_000)  # a RecursionError escapes `except ValueError`, were it raised
    expected = {
        fifo: "a FIFO, not a regular file",
        big: "1,048,579 bytes, over the 1,048,576 read",
        deep: "not JSON (JSON nested deeper than this reader takes)",
    }
    for path, why in expected.items():
        with pytest.raises(PolicyConfigError) as raised:
            load_policy_config(path)
        assert str(raised.value) == f"policy config {path}: {why}"
    good = tmp_path / "good.json"
    good.write_text('{"training-fits-hbm": "advisory"}')
    assert load_policy_config(good) == {"training-fits-hbm": "advisory"}

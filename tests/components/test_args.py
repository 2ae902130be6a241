"""The environment keys of a stack (multislice:network/bucket/queuedResource/labels), the names
derived from them, and what the components declare for them (under pulumi mocks)."""

from __future__ import annotations

import json
import re

import pytest

from infra import naming
from infra.__main__ import component_args
from infra.components.network import Network, NetworkArgs
from infra.components.release import ReleaseRecord, ReleaseRecordArgs
from infra.components.service_account import ServiceAccount, ServiceAccountArgs, data_bucket
from infra.components.services import ProjectServices, ServicesArgs
from infra.components.storage import BucketArgs, CheckpointBucket, bucket_options, on_destroy
from infra.config import (
    BucketSettings,
    NetworkSettings,
    StackConfigError,
    from_pulumi_config,
    load_stack_file,
    parse_duration,
    validate_stack,
)
from infra.queued_resource import QueuedResource, QueuedResourceInputs
from infra.startup import RenderedScript
from infra.vm_contract import RUN_DIR_KEY, STARTUP_SCRIPT_KEY
from tests.fakes.pulumi_program import FIREWALL, QR_TYPE, declare, engine_config, evaluate, stack_map, unique_id

ENVIRONMENT = {
    "multislice:network": {"mtu": 1460, "subnetCidr": "10.64.0.0/16"},
    "multislice:bucket": {
        "name": "acme-ckpt-dev",
        "forceDestroy": True,
        "protect": True,
        "nearlineAfterDays": 60,
        "deleteAfterDays": 365,
        "softDeleteDays": 7,
    },
    "multislice:queuedResource": {
        "waitFor": "PROVISIONING",
        "createTimeout": "2h",
        "validUntil": "1d",
        "deleteTimeout": "15m",
    },
    "multislice:labels": {"team": "research", "cost-center": "ml-42"},
}


#: A rendered script stand-in for the args that only some tests read (no rendering needed).
SCRIPT = RenderedScript(
    text="#!/bin/bash\n",
    sha256="s" * 64,
    release_id="0" * 64,
    release=b"tar",
    bundle_sha256="b" * 64,
    requirements_sha256="r" * 64,
    size_bytes=12,
)


def dev_with(**changes) -> dict:
    return {**stack_map("dev"), **changes}


def errors(config: dict) -> list[str]:
    with pytest.raises(StackConfigError) as err:
        validate_stack("dev", config, "test")
    return err.value.lines


# config ---------------------------------------------------------------------------------


def test_environment_keys_read_the_same_from_yaml_and_from_the_engine(tmp_path):
    import yaml

    config = dev_with(**ENVIRONMENT)
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    from_file = load_stack_file(path)
    from_engine = from_pulumi_config("dev", engine_config(config))
    assert from_file == from_engine
    assert from_file.network.mtu == 1460 and from_file.network.subnet_cidr == "10.64.0.0/16"
    assert from_file.bucket_name == "acme-ckpt-dev" and from_file.bucket_protected is True
    assert from_file.queued_resource.create_timeout == 7200 and from_file.queued_resource.valid_until == 86400
    assert from_file.queued_resource.wait_for == "PROVISIONING"
    assert from_file.resource_labels == {
        "team": "research",
        "cost-center": "ml-42",
        "managed-by": "pulumi",
        "multislice-stack": "dev",
        "multislice-run": "dev",
    }


def test_defaults_give_a_complete_environment():
    config = validate_stack("dev", stack_map("dev"), "test")
    assert config.network.mtu == 8896 and config.network.creates_nat and not config.network.reuses_network
    assert config.bucket.force_destroy is False and config.bucket_protected is False
    assert config.bucket_soft_delete_days == 0  # Orbax deletes superseded checkpoints all the time
    assert config.queued_resource.wait_for == "ACTIVE" and config.queued_resource.create_timeout == 1800
    prod = validate_stack("prod", stack_map("prod"), "test")
    assert prod.bucket_protected is True
    assert prod.bucket_soft_delete_days == 7  # a deleted checkpoint of prod stays restorable for a week
    assert validate_stack("prod-eu", stack_map("prod"), "test").bucket_soft_delete_days == 7
    unprotected = validate_stack(
        "prod", {**stack_map("prod"), "multislice:bucket": {"protect": False, "softDeleteDays": 0}}, "t"
    )
    assert unprotected.bucket_protected is False and unprotected.bucket_soft_delete_days == 0
    assert (
        validate_stack("dev", dev_with(**{"multislice:bucket": {"softDeleteDays": 30}}), "t").bucket_soft_delete_days
        == 30
    )


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"multislice:network": {"mtu": 9000}}, "multislice:network.mtu: Input should be less than or equal to 8896"),
        (
            {"multislice:network": {"existingNetwork": "vpc"}},
            "multislice:network.existingSubnetwork: existingNetwork and",
        ),
        (
            {"multislice:network": {"existingNetwork": "vpc", "existingSubnetwork": "s", "subnetCidr": "10.0.0.0/20"}},
            "multislice:network.subnetCidr: only applies to a network created here",
        ),
        (
            {"multislice:network": {"existingNetwork": "Bad_Name", "existingSubnetwork": "s"}},
            "multislice:network.existingNetwork: 'Bad_Name' is not a network name",
        ),
        (
            {"multislice:network": {"subnetCidr": "10.0.0.1/20"}},
            "multislice:network.subnetCidr: '10.0.0.1/20' is not an IPv4 CIDR",
        ),
        (
            {"multislice:network": {"subnetCidr": "8.8.0.0/16"}},
            "multislice:network.subnetCidr: '8.8.0.0/16' is a public range: use a private one",
        ),
        ({"multislice:network": {"nat": "maybe"}}, "multislice:network.nat:"),
        (
            {"multislice:network": {"existingNetwork": "vpc", "existingSubnetwork": "s"}},
            "multislice:network.nat: required when reusing existingNetwork",
        ),
        (
            {
                "multislice:network": {
                    "existingNetwork": "vpc",
                    "existingSubnetwork": "projects/acme-ml-dev/regions/europe-west4/subnetworks/s",
                    "nat": True,
                }
            },
            "multislice:network.existingSubnetwork: is in region 'europe-west4' but gcp:zone us-central2-b is in",
        ),
        (
            {
                "multislice:network": {
                    "existingNetwork": "projects/host-proj/global/networks/v",
                    "existingSubnetwork": "projects/other-proj/regions/us-central2/subnetworks/s",
                    "nat": False,
                }
            },
            "multislice:network.existingSubnetwork: is in project 'other-proj' but existingNetwork is in 'host-proj'",
        ),
        ({"multislice:bucket": {"location": "us central"}}, "multislice:bucket.location: 'us central' is not a Cloud"),
        ({"multislice:network": {"vpc": "x"}}, "multislice:network.vpc: unknown key"),
        ({"multislice:bucket": {"name": "Has.Dots"}}, "multislice:bucket.name: 'Has.Dots' is not a bucket name"),
        ({"multislice:bucket": {"name": "google-ckpt"}}, "multislice:bucket.name:"),
        (
            {"multislice:bucket": {"softDeleteDays": 3}},
            "multislice:bucket.softDeleteDays: must be 0 (off) or 7–90 days",
        ),
        (
            {"multislice:bucket": {"deleteAfterDays": 10}},
            "multislice:bucket.deleteAfterDays: 10 must be greater than nearlineAfterDays",
        ),
        (
            {"multislice:queuedResource": {"waitFor": "READY"}},
            "multislice:queuedResource.waitFor: got 'READY'; allowed: 'ACCEPTED'",
        ),
        (
            {"multislice:queuedResource": {"createTimeout": "30 minutes"}},
            "multislice:queuedResource.createTimeout: '30 minutes' is not a duration",
        ),
        (
            {"multislice:queuedResource": {"validUntil": "5m"}},
            "multislice:queuedResource.validUntil: 300s is shorter than 10 minutes",
        ),
        (
            {"multislice:queuedResource": {"deleteOnComplete": "sometimes"}},
            "multislice:queuedResource.deleteOnComplete:",
        ),
        ({"multislice:labels": {"Team": "x"}}, "multislice:labels: key 'Team' must be"),
        ({"multislice:labels": {"managed-by": "me"}}, "multislice:labels: key 'managed-by' is set by this program"),
        ({"multislice:labels": "{not json"}, "multislice:labels: not a JSON object"),
        (
            {"multislice:reservationName": "My Reservation", "multislice:capacity": "reserved"},
            "multislice:reservationName: 'My Reservation' is not a reservation name",
        ),
    ],
)
def test_bad_environment_keys_name_the_key_path(change, expected):
    lines = errors(dev_with(**change))
    assert any(line.startswith(expected) for line in lines), lines


@pytest.mark.parametrize(
    ("stack", "changes", "expected"),
    [
        ("dev", {}, True),  # spot
        ("dev", {"multislice:capacity": "on-demand"}, True),
        ("prod", {}, False),  # reserved: the reservation is paid for anyway
        ("dev", {"multislice:queuedResource": {"deleteOnComplete": False}}, False),
        ("prod", {"multislice:queuedResource": {"deleteOnComplete": True}}, True),
    ],
)
def test_delete_on_complete_defaults_by_capacity(stack, changes, expected):
    config = validate_stack(stack, {**stack_map(stack), **changes}, "t")
    assert config.delete_on_complete is expected
    engine = from_pulumi_config(stack, engine_config({**stack_map(stack), **changes}))
    assert engine.delete_on_complete is expected


def test_reservation_may_be_a_full_path():
    path = "projects/acme-ml-prod/locations/us-east5-a/reservations/acme-v5p"
    config = validate_stack("prod", {**stack_map("prod"), "multislice:reservationName": path}, "t")
    assert config.reservation_name == path


@pytest.mark.parametrize(
    "text, seconds",
    [(90, 90), ("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1h30m", 5400)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "-5", "1.5h", "2 hours", True, None])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


# names ---------------------------------------------------------------------------------------


RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@pytest.mark.parametrize("stack", ["dev", "prod-eu2", "9-lives", "a" * naming.STACK_NAME_LIMIT])
def test_declared_names_follow_gcp_naming_rules(stack):
    # What the program registers, not what a helper computes: every GCE resource name, the
    # service account id, the bucket name, the QR and node ids, the network tag and labels.
    config = validate_stack(stack, stack_map("dev"), "t")
    world = evaluate(stack, stack_map("dev"))
    gce_types = (
        "gcp:compute/network:Network",
        "gcp:compute/subnetwork:Subnetwork",
        "gcp:compute/router:Router",
        "gcp:compute/routerNat:RouterNat",
        "gcp:compute/firewall:Firewall",
    )
    names = [r.inputs["name"] for r in world.registrations if r.typ in gce_types]
    assert len(names) == 6 and len(set(names)) == 6
    qr = world.one(QR_TYPE).inputs
    for name in [*names, qr["queuedResourceId"], *world.exports["nodeNames"], world.exports["networkTag"], *qr["tags"]]:
        assert RFC1035.match(name) and len(name) <= 63, name
    account_id = world.one("gcp:serviceaccount/account:Account").inputs["accountId"]
    assert 6 <= len(account_id) <= 30 and RFC1035.match(account_id), account_id
    bucket = world.one("gcp:storage/bucket:Bucket").inputs
    assert re.match(r"^[a-z0-9][a-z0-9_-]{1,61}[a-z0-9]$", bucket["name"]) and "google" not in bucket["name"]
    for labels in (bucket["labels"], qr["labels"]):
        assert labels["multislice-stack"] == naming.label_value(stack)
        assert all(
            re.match(r"^[a-z][a-z0-9_-]{0,62}$", k) and re.match(r"^[a-z0-9_-]{0,63}$", v) for k, v in labels.items()
        )
    # StackConfig's names are the registered ones.
    assert (qr["queuedResourceId"], world.exports["nodeNames"], qr["tags"], bucket["name"]) == (
        config.queued_resource_id,
        config.node_ids,
        [config.network_tag],
        config.bucket_name,
    )


def test_single_slice_node_id_is_the_qr_id():
    config = validate_stack(
        "dev",
        dev_with(
            **{
                "multislice:slices": 1,
                "multislice:training": {
                    **stack_map("dev")["multislice:training"],
                    "parallelism": {
                        "ici": {"data": 1, "fsdp": 4, "tensor": 1},
                        "dcn": {"data": 1, "fsdp": 1, "tensor": 1},
                    },
                },
            }
        ),
        "t",
    )
    assert config.node_ids == [config.queued_resource_id]


def test_data_bucket_only_for_other_gs_buckets():
    prod = validate_stack("prod", stack_map("prod"), "t")
    assert prod.training.data.source.startswith("gs://acme-ml-prod-corpora/")
    assert component_args(prod, SCRIPT).service_account.data_bucket == "acme-ml-prod-corpora"
    own = prod.model_copy(
        update={
            "training": prod.training.model_copy(
                update={"data": prod.training.data.model_copy(update={"source": f"gs://{prod.bucket_name}/data/*.txt"})}
            )
        }
    )
    assert component_args(own, SCRIPT).service_account.data_bucket is None
    assert component_args(validate_stack("dev", stack_map("dev"), "t"), SCRIPT).service_account.data_bucket is None
    assert data_bucket("gs://corpora/x/*.txt", "ckpt") == "corpora"
    assert data_bucket("gs://ckpt/data/*.txt", "ckpt") is None
    assert data_bucket("/data/*.txt", "ckpt") is None


# components under mocks ---------------------------------------------------------------------------


def test_environment_keys_reach_the_resources():
    world = evaluate("dev", dev_with(**ENVIRONMENT))
    vpc = world.one("gcp:compute/network:Network").inputs
    assert vpc["mtu"] == 1460
    assert world.one("gcp:compute/subnetwork:Subnetwork").inputs["ipCidrRange"] == "10.64.0.0/16"
    bucket = world.one("gcp:storage/bucket:Bucket")
    assert bucket.inputs["name"] == "acme-ckpt-dev" and bucket.inputs["forceDestroy"] is True and bucket.protect is True
    rules = {(r["action"]["type"], r["condition"]["age"]) for r in bucket.inputs["lifecycleRules"]}
    assert rules == {("AbortIncompleteMultipartUpload", 1), ("SetStorageClass", 60), ("Delete", 365)}
    assert bucket.inputs["softDeletePolicy"]["retentionDurationSeconds"] == 7 * 86400
    assert bucket.inputs["labels"]["team"] == "research"
    qr = world.one(QR_TYPE).inputs
    assert qr["labels"]["cost-center"] == "ml-42" and qr["labels"]["managed-by"] == "pulumi"
    assert qr["waitFor"] == "PROVISIONING"
    assert qr["createTimeoutSeconds"] == 7200 and qr["deleteTimeoutSeconds"] == 900 and qr["validUntilSeconds"] == 86400
    assert qr["metadata"]["multislice-run-dir"] == "gs://acme-ckpt-dev/runs/dev"
    assert world.exports["bucketUrl"] == "gs://acme-ckpt-dev"


@pytest.mark.parametrize("stack", ["Prod_EU.2", "x" * 80, "Staging", "qa_1", "qa-1", "a--b"])
def test_stack_names_that_would_be_rewritten_are_refused_before_any_resource(stack):
    with pytest.raises(StackConfigError) as err:
        evaluate(stack, stack_map("dev"))
    (line,) = err.value.lines
    assert line.startswith(f"stack: {stack!r} must "), line


def test_bucket_location_key_overrides_the_catalog():
    world = evaluate("dev", dev_with(**{"multislice:bucket": {"location": "us"}}))
    assert world.one("gcp:storage/bucket:Bucket").inputs["location"] == "US"


def test_reused_network_with_nat_gets_a_router_and_nat_on_that_subnetwork():
    world = evaluate(
        "dev",
        dev_with(
            **{
                "multislice:network": {
                    "existingNetwork": "projects/acme-ml-dev/global/networks/shared",
                    "existingSubnetwork": "projects/acme-ml-dev/regions/us-central2/subnetworks/tpus",
                    "nat": True,
                }
            }
        ),
        subnet_network="https://www.googleapis.com/compute/v1/projects/acme-ml-dev/global/networks/shared",
    )
    nat = world.one("gcp:compute/routerNat:RouterNat").inputs
    assert nat["subnetworks"][0]["name"] == "projects/acme-ml-dev/regions/us-central2/subnetworks/tpus"
    assert world.one("gcp:compute/router:Router").inputs["network"] == "projects/acme-ml-dev/global/networks/shared"
    assert world.exports["networkName"] == "shared" and world.exports["subnetworkName"] == "tpus"


def test_trainer_config_is_a_structured_input_so_previews_name_the_changed_key():
    base = evaluate("dev").one(QR_TYPE).inputs
    training = json.loads(json.dumps(stack_map("dev")["multislice:training"]))
    training["optimizer"]["peak_learning_rate"] = 0.001
    changed = evaluate("dev", dev_with(**{"multislice:training": training})).one(QR_TYPE).inputs
    differing = {k for k in base if base[k] != changed.get(k)}
    assert differing - {"startupScriptBytes"} == {"trainer", "metadata", "startupScriptSha256", "releaseFiles"}
    # ... and of the release's files only its config changed.
    files_changed = {p for p in base["releaseFiles"] if base["releaseFiles"][p] != changed["releaseFiles"].get(p)}
    assert files_changed == {"config.json"}
    assert changed["trainer"]["optimizer"]["peak_learning_rate"] == 0.001
    assert base["bundleSha256"] == changed["bundleSha256"]  # the code did not change, only its config


def test_each_component_is_declared_from_its_own_args_alone():
    # No StackConfig anywhere: the args models carry everything the components read.
    def build():
        ProjectServices("apis", ServicesArgs(project="acme-ml-qa", apis=("tpu.googleapis.com",)))
        Network(
            "net",
            NetworkArgs(
                stack="qa", project="acme-ml-qa", region="europe-west4", settings=NetworkSettings(mtu=1500, iapSsh=True)
            ),
        )
        bucket = CheckpointBucket(
            "ckpt",
            BucketArgs(
                stack="qa",
                project="acme-ml-qa",
                location="europe-west4",
                run_name="r7",
                labels={"team": "x"},
                protect=True,
                soft_delete_days=7,
                settings=BucketSettings(nearlineAfterDays=None),
            ),
        )
        account = ServiceAccount(
            "sa", ServiceAccountArgs(stack="qa", project="acme-ml-qa", data_bucket="corpora"), bucket=bucket.name
        )
        ReleaseRecord(
            "release",
            ReleaseRecordArgs(
                stack="qa", run_dir="gs://acme-ml-qa-qa-ckpt/runs/r7", release_id="f" * 64, release=b"the release tar"
            ),
            bucket=bucket.name,
        )
        QueuedResource(
            "qr",
            QueuedResourceInputs(
                project="acme-ml-qa",
                zone="europe-west4-a",
                queued_resource_id="multislice-qa",
                node_id="multislice-qa",
                accelerator_type="v5p-8",
                runtime_version="v2-alpha-tpuv5",
                slices=1,
                capacity="spot",
                network="projects/acme-ml-qa/global/networks/n",
                subnetwork="projects/acme-ml-qa/regions/europe-west4/subnetworks/s",
                service_account=account.email,
                tags=["multislice-qa-tpu"],
                labels={"team": "x"},
                metadata={STARTUP_SCRIPT_KEY: "#!/bin/bash\n", RUN_DIR_KEY: "gs://acme-ml-qa-qa-ckpt/runs/r7"},
                trainer={"steps": 3},
                run_dir="gs://acme-ml-qa-qa-ckpt/runs/r7",
                bundle_sha256="b" * 64,
                startup_script_sha256="s" * 64,
                requirements_sha256="r" * 64,
                startup_script_bytes=12,
                wait_for="ACTIVE",
                create_timeout_seconds=60.0,
                delete_timeout_seconds=60.0,
            ),
        )

    world = declare(build)
    assert [r.inputs["service"] for r in world.of("gcp:projects/service:Service")] == ["tpu.googleapis.com"]
    assert sorted(r.inputs["name"] for r in world.registrations if r.typ.startswith("gcp:compute/")) == sorted(
        f"multislice-qa-{role}" for role in ("net", "subnet", "router", "nat", "internal", "iap-ssh")
    )
    assert world.one("gcp:compute/network:Network").inputs["mtu"] == 1500
    assert world.one("gcp:compute/subnetwork:Subnetwork").inputs["region"] == "europe-west4"
    assert {tuple(r.inputs["targetTags"]) for r in world.of(FIREWALL)} == {("multislice-qa-tpu",)}
    bucket = world.one("gcp:storage/bucket:Bucket")
    assert (bucket.inputs["name"], bucket.inputs["location"], bucket.inputs["labels"], bucket.protect) == (
        "acme-ml-qa-qa-ckpt",
        "EUROPE-WEST4",
        {"team": "x"},
        True,
    )
    assert [r["action"]["type"] for r in bucket.inputs["lifecycleRules"]] == ["AbortIncompleteMultipartUpload"]
    assert bucket.inputs["softDeletePolicy"]["retentionDurationSeconds"] == 7 * 86400
    assert world.one("gcp:serviceaccount/account:Account").inputs["accountId"] == "multislice-qa-tpu"
    grants = {(g.inputs["bucket"], g.inputs["role"]) for g in world.of("gcp:storage/bucketIAMMember:BucketIAMMember")}
    assert grants == {
        ("acme-ml-qa-qa-ckpt", "roles/storage.objectViewer"),
        ("acme-ml-qa-qa-ckpt", "roles/storage.objectUser"),
        ("corpora", "roles/storage.objectViewer"),
    }
    # pulumi-gcp marks BucketObject.content secret: the engine sees it wrapped.
    objects = {
        r.inputs["name"]: r.inputs["content"]["value"] for r in world.of("gcp:storage/bucketObject:BucketObject")
    }
    assert json.loads(objects["multislice/qa/release.json"]) == {
        "format": 1,
        "payload": f"multislice/qa/releases/{'f' * 64}.tar.b64",
        "release": "f" * 64,
        "runDir": "gs://acme-ml-qa-qa-ckpt/runs/r7",
        "stack": "qa",
    }
    assert objects[f"multislice/qa/releases/{'f' * 64}.tar.b64"] == "dGhlIHJlbGVhc2UgdGFy\n"  # base64 of the tar
    qr = world.one(QR_TYPE).inputs
    assert (qr["queuedResourceId"], qr["zone"], qr["acceleratorType"], qr["labels"]) == (
        "multislice-qa",
        "europe-west4-a",
        "v5p-8",
        {"team": "x"},
    )
    assert qr["metadata"][RUN_DIR_KEY] == "gs://acme-ml-qa-qa-ckpt/runs/r7" and qr["tags"] == ["multislice-qa-tpu"]


def test_components_and_the_provider_never_import_the_stack_config():
    # Their args (and the provider's inputs) are built by the program, infra/__main__.py.
    from tests.helpers.repo import ROOT, imported_modules

    for folder in ("components", "queued_resource"):
        for path in sorted((ROOT / "infra" / folder).glob("*.py")):
            imported = {m for m in imported_modules(path) if m == "infra.config" or m.startswith("infra.config.")}
            # A component's args may hold a settings model of its own key (NetworkSettings, BucketSettings).
            allowed = {"infra.config.environment"} if folder == "components" else set()
            assert imported <= allowed, (path, imported)
    for path in sorted((ROOT / "infra" / "queued_resource").glob("*.py")):
        assert "StackConfig" not in path.read_text(), path  # not even for type checking


def test_component_args_refuse_unknown_keys():
    with pytest.raises(ValueError, match="mtu"):
        NetworkArgs(stack="qa", project="acme-ml-qa", region="europe-west4", mtu=1500)


def test_importing_the_provider_imports_no_stack_config():
    # Also not through infra.startup: its package re-exports the renderer lazily (the contract is enough).
    import subprocess
    import sys

    from tests.helpers.repo import ROOT

    probe = (
        "import sys, infra.queued_resource; "
        "print(sorted(m for m in sys.modules if m.startswith(('infra.config', 'infra.startup.script'))))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def _bucket_args(**settings) -> BucketArgs:
    return BucketArgs(
        stack="qa", project="acme-ml-qa", location="EU", run_name="r", labels={}, settings=BucketSettings(**settings)
    )


def test_the_bucket_outlives_destroy_unless_force_destroy():
    kept = bucket_options(_bucket_args())
    assert (kept.retain_on_delete, kept.import_, kept.protect, kept.delete_before_replace) == (True, None, False, True)
    assert bucket_options(_bucket_args(forceDestroy=True)).retain_on_delete is False
    assert bucket_options(_bucket_args(adopt=True)).import_ == "acme-ml-qa-qa-ckpt"
    assert bucket_options(_bucket_args(name="kept-ckpt", adopt=True)).import_ == "kept-ckpt"
    assert on_destroy("b", _bucket_args()) == (
        "kept: pulumi destroy removes gs://b from the stack and leaves it and its checkpoints in project acme-ml-qa; "
        "delete it with: gcloud storage rm -r gs://b; or deploy this stack again with multislice:bucket.adopt: true "
        "to resume from them"
    )
    protected = _bucket_args().model_copy(update={"protect": True})
    assert on_destroy("b", protected) == (
        "protected: pulumi destroy fails at gs://b (multislice:bucket.protect); set multislice:bucket.protect: false "
        "and run pulumi up first, or run pulumi destroy --exclude-protected to keep it in the stack"
    )


def test_the_delete_role_is_declared_with_the_accounts_unique_id():
    world = declare(
        lambda: ServiceAccount(
            "sa", ServiceAccountArgs(stack="qa-2", project="acme-ml-qa", delete_on_complete=True), bucket="b"
        )
    )
    email = "multislice-qa-2-tpu@acme-ml-qa.iam.gserviceaccount.com"
    role = world.one("gcp:projects/iAMCustomRole:IAMCustomRole")
    assert role.inputs["roleId"] == f"multisliceDeleteOnComplete_qa_2_{unique_id(email)[-10:]}"
    assert role.inputs["permissions"] == ["tpu.nodes.delete"]
    (grant,) = [g for g in world.of("gcp:projects/iAMMember:IAMMember") if "roles/multislice" in g.inputs["role"]]
    assert grant.inputs["role"] == f"projects/acme-ml-qa/roles/{role.inputs['roleId']}"

"""The policy pack as the Pulumi CLI runs it: ``infra/policy/__main__.py`` started from
``infra/policy/`` serves pulumi_policy's Analyzer over gRPC (it prints its port); the CLI sends
each resource's inputs to ``Analyze`` and the stack to ``AnalyzeStack``. Here a test plays the
CLI's part with the same protobuf messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grpc
import pytest
import yaml
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from infra.policy.policies import POLICIES

PACK = Path(__file__).resolve().parents[2] / "infra" / "policy"


@pytest.fixture(scope="module")
def analyzer():
    process = subprocess.Popen(
        [sys.executable, "-u", "__main__.py"], cwd=PACK, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        port = process.stdout.readline().strip()  # the pack prints its port, then serves
        assert port.isdigit(), process.stderr.read() if process.poll() is not None else port
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=60)
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        process.kill()
        process.wait(timeout=30)
        process.stdout.close()
        process.stderr.close()


def struct(value: dict) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def test_the_pack_declares_every_policy(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
    assert info.name == "multislice"
    assert [p.name for p in info.policies] == [p.name for p in POLICIES]
    mandatory = {p.name for p in info.policies if p.enforcementLevel == analyzer_pb2.MANDATORY}
    assert "firewall-no-public-ingress" in mandatory and "required-labels" not in mandatory


def test_a_public_firewall_is_a_mandatory_violation(analyzer):
    request = analyzer_pb2.AnalyzeRequest(
        type="gcp:compute/firewall:Firewall",
        properties=struct({"direction": "INGRESS", "sourceRanges": ["0.0.0.0/0"], "allows": [{"protocol": "tcp"}]}),
        urn="urn:pulumi:dev::multislice::gcp:compute/firewall:Firewall::open",
        name="open",
    )
    diagnostics = analyzer.Analyze(request, timeout=30).diagnostics
    # Every TCP port from anywhere: public ingress, and SSH from outside IAP's range.
    assert [(d.policyName, d.enforcementLevel) for d in diagnostics] == [
        ("firewall-no-public-ingress", analyzer_pb2.MANDATORY),
        ("firewall-ssh-iap-only", analyzer_pb2.MANDATORY),
    ]
    assert all("0.0.0.0/0" in d.message for d in diagnostics)


def test_a_vm_write_grant_on_the_release_is_a_mandatory_violation(analyzer):
    grant = {
        "bucket": "acme-ml-dev-dev-ckpt",
        "role": "roles/storage.objectUser",
        "member": "serviceAccount:multislice-dev-tpu@acme-ml-dev.iam.gserviceaccount.com",
    }
    typ = "gcp:storage/bucketIAMMember:BucketIAMMember"

    def analyze(props: dict) -> list:
        urn = f"urn:pulumi:dev::multislice::{typ}::identity-checkpoints"
        request = analyzer_pb2.AnalyzeRequest(type=typ, properties=struct(props), urn=urn, name="identity-checkpoints")
        return list(analyzer.Analyze(request, timeout=30).diagnostics)

    (diagnostic,) = analyze(grant)
    assert (diagnostic.policyName, diagnostic.enforcementLevel) == ("vm-cannot-write-release", analyzer_pb2.MANDATORY)
    objects = "projects/_/buckets/acme-ml-dev-dev-ckpt/objects"
    expression = f'resource.name.startsWith("{objects}/runs/")'
    assert analyze({**grant, "condition": {"title": "t", "expression": expression}}) == []


def test_the_stack_policy_names_a_program_that_is_not_ours(analyzer):
    bucket = analyzer_pb2.AnalyzerResource(
        type="gcp:storage/bucket:Bucket",
        properties=struct({"publicAccessPrevention": "enforced", "uniformBucketLevelAccess": True}),
        urn="urn:pulumi:dev::other::gcp:storage/bucket:Bucket::b",
        name="b",
    )
    diagnostics = analyzer.AnalyzeStack(analyzer_pb2.AnalyzeStackRequest(resources=[bucket]), timeout=30).diagnostics
    assert [d.policyName for d in diagnostics] == ["multislice-program"]


def test_the_pack_file_runs_python_in_the_project_virtualenv():
    project = yaml.safe_load((PACK / "PulumiPolicy.yaml").read_text())
    assert project["runtime"]["name"] == "python"
    assert (PACK / project["runtime"]["options"]["virtualenv"]).resolve() == (PACK.parents[1] / ".venv").resolve()

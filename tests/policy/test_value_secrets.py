"""``values-carry-no-credentials`` (infra/policy/value_secrets.py) on resources built by the test:
a credential in a label, a Kubernetes annotation or a JobSet's container image is a violation
that names where it is, never the value; ordinary values pass. The credentials are made up in the
documented shapes (infra/policy/secret_patterns.py)."""

from __future__ import annotations

import pytest

from tests.helpers.policies import violations

POLICY = "values-carry-no-credentials"
JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
BUCKET = "gcp:storage/bucket:Bucket"
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


def jobset(image: str) -> dict:
    containers = [{"name": "worker", "image": image}]
    return {"spec": {"replicatedJobs": [{"template": {"spec": {"template": {"spec": {"containers": containers}}}}}]}}


def test_ordinary_labels_annotations_and_images_pass():
    assert violations(POLICY, BUCKET, {"labels": {"env": "dev", "owner": "ml-infra"}}) == []
    assert violations(POLICY, JOBSET, jobset("us-docker.pkg.dev/acme/ml/boot:2026-12")) == []
    assert violations(POLICY, CONFIG_MAP, {"metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}}}) == []


def test_a_credential_in_a_label_or_an_annotation_is_a_violation():
    found = violations(POLICY, CONFIG_MAP, {"metadata": {"annotations": {"note": f"token {GITHUB_TOKEN}"}}})
    assert found == [
        "resource 'r': its metadata.annotations 'note' holds a GitHub token; labels are readable by anyone who can "
        "list the resource"
    ]
    assert violations(POLICY, BUCKET, {"labels": {"k": GITHUB_TOKEN}}) != []
    assert not any(GITHUB_TOKEN in message for message in found)


def test_a_credential_in_a_container_image_is_a_violation():
    found = violations(POLICY, JOBSET, jobset("ci:hunter22@registry.example.com/ml/boot:1"))
    assert found == [
        "JobSet 'r': a container image holds a user:password in front of the registry; use an image pull secret"
    ]
    assert "hunter22" not in found[0]


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("hf_" + "Ab1" * 12, "a Hugging Face token"),
        ("xoxb-1234567890-0987654321-" + "a" * 24, "a Slack token"),
        ("https://hooks.slack.com/services/T0123ABCD/B0456EFGH/" + "x" * 24, "a Slack webhook URL"),
        ("github_pat_11ABCDEFG0" + "x" * 60, "a GitHub token"),
    ],
)
def test_the_common_token_shapes_are_found(value, kind):
    from infra.policy.secret_patterns import find_secrets

    assert [found.kind for found in find_secrets(f"NOTE={value}")] == [kind]
    # and the one redaction function hides each (training.redaction): a webhook's secret is its last segment
    from training.redaction import redacted

    assert value not in redacted(value) and value.rsplit("/", 1)[-1] not in redacted(value)

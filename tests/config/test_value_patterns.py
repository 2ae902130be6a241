"""Values the config refuses, each with one line naming its key, before any resource exists.

* Every regular expression the config uses to accept a value matches the whole value: a trailing
  newline (which ``re.match(r"^…$")`` lets through: ``$`` matches before a final newline) is
  refused on every name the config checks, and a static test finds no module-level anchored
  pattern of ``infra/`` or ``training/`` used with ``.match`` (only ``.fullmatch``).
* gke: image references by the distribution grammar, cluster locations, namespaces Kubernetes, GKE
  or JobSet own, a control plane overlapping the subnetwork, a new cluster's keys with an existing
  cluster and an existing cluster's key without one, an existing cluster in another region (from
  ``check`` and ``diff`` too), a run duration under 10 minutes.
* Durations past the largest protobuf Duration or with thousands of digits; reservation paths
  under ``organizations/`` or ``folders/``.

The expected words are written out from the rules' sources (the docstrings name them)."""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from infra import naming
from infra.cli import app
from infra.config import StackConfigError, validate_stack
from tests.fakes.pulumi_program import stack_map
from tests.helpers.gke import gke_map

ROOT = Path(__file__).parents[2]


def refusal(config: dict[str, Any], stack: str = "dev") -> str:
    with pytest.raises(StackConfigError) as err:
        validate_stack(stack, config, "test")
    lines = err.value.lines
    assert len(lines) == 1, lines
    return lines[0]


def with_value(config: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``config`` with ``multislice:gke.namespace``-style ``dotted`` set to ``value``."""
    out = copy.deepcopy(config)
    head, _, rest = dotted.partition(".")
    node = out
    parts = [head, *rest.split(".")] if rest else [head]
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


DEV = stack_map("dev")
GKE = gke_map(2, "spot")
RESERVED = DEV | {"multislice:capacity": "reserved"}

#: (stack file, key, a valid value): the value with a trailing newline must be refused, naming the key.
NAMED_VALUES = [
    (DEV, "gcp:project", DEV["gcp:project"]),
    (DEV, "gcp:zone", DEV["gcp:zone"]),
    (DEV, "multislice:acceleratorType", DEV["multislice:acceleratorType"]),
    (DEV, "multislice:runName", "dev-run"),
    (DEV, "multislice:runtimeVersion", "tpu-ubuntu2204-base"),
    (RESERVED, "multislice:reservationName", "acme-v4"),
    (RESERVED, "multislice:reservationName", "projects/acme-ml-dev/locations/us-central2-b/reservations/r"),
    (DEV, "multislice:bucket.name", "acme-ml-dev-bucket"),
    (DEV, "multislice:bucket.location", "US-CENTRAL1"),
    (DEV, "multislice:network.existingNetwork", "shared"),
    (GKE, "multislice:gke.namespace", "ml"),
    (GKE, "multislice:gke.cluster", "ml-cluster"),
    (GKE, "multislice:gke.image", "python:3.12-bookworm"),
    (GKE, "multislice:gke.jobSetVersion", "v0.10.1"),
    (GKE, "multislice:gke.systemPool.machineType", "e2-standard-4"),
]


@pytest.mark.parametrize(("config", "key", "value"), NAMED_VALUES, ids=[f"{k}={v}" for _, k, v in NAMED_VALUES])
def test_a_trailing_newline_is_refused_on_every_name_the_config_checks(config, key, value):
    if key == "multislice:network.existingNetwork":
        config = with_value(config, "multislice:network.existingSubnetwork", "shared-sub")
        config = with_value(config, "multislice:network.nat", True)
    if key == "multislice:gke.cluster":
        config = with_value(config, "multislice:gke.clusterLocation", "us-central2-b")
    validate_stack("dev", with_value(config, key, value), "test")  # the value itself is fine
    line = refusal(with_value(config, key, value + "\n"))
    short = key.split(".", 1)[-1] if "." in key else key
    assert short in line.split(":", 2)[0] + ":" + line.split(":", 2)[1] or key.rsplit(".", 1)[-1] in line, line


@pytest.mark.parametrize("where", ["label key", "label value"], ids=["label-key", "label-value"])
def test_a_trailing_newline_is_refused_in_labels(where):
    labels = {"team\n": "ml"} if where == "label key" else {"team": "ml\n"}
    assert "multislice:labels" in refusal(DEV | {"multislice:labels": labels})


def test_a_trailing_newline_in_a_stack_name_is_refused():
    naming.check_stack_name("dev")
    with pytest.raises(ValueError, match="must start with a letter or digit"):
        naming.check_stack_name("dev\n")


def _anchored_patterns(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            call = node.value
            if getattr(call.func, "attr", None) == "compile" and call.args and isinstance(call.args[0], ast.Constant):
                pattern = call.args[0].value
                if isinstance(pattern, str) and pattern.endswith("$") and not pattern.endswith("\\$"):
                    names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def test_no_anchored_pattern_is_used_with_match():
    """A module-level pattern ending in ``$`` (a whole-value check) is used with ``fullmatch``:
    ``Pattern.match`` lets a trailing newline through. Every such pattern of infra/ and training/,
    wherever it is used."""
    files = [p for p in sorted((ROOT / "infra").rglob("*.py")) + sorted((ROOT / "training").rglob("*.py"))]
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in files}
    anchored = set().union(*(_anchored_patterns(tree) for tree in trees.values()))
    assert {"GCE_NAME", "STACK_NAME", "_PROJECT", "DNS_LABEL"} <= anchored  # the enumeration sees them
    found = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "match":
                target = node.func.value
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
                if name in anchored:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}.match")
    assert found == []


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ("Python:3.12", "the repository path is lowercase"),
        ("python:3.12:extra", "is not an image reference"),
        ("python:", "is not an image reference"),
        ("python@sha256:abc", "is not an image reference"),
        ("python@sha256:" + "a" * 63, "a sha256 digest has 64 hex digits, not 63"),
        ("python:" + "t" * 129, "is not an image reference"),
        ("ci:hunter22@registry.example.com/ml:1", "credentials have no place in an image reference"),
        ("https://ci:hunter22@registry.example.com/ml:1", "credentials have no place in an image reference"),
        ("ghp_hunter22hunter22hunter22hunter@ghcr.io/org/ml:1", "credentials have no place in an image reference"),
        (" ghp_hunter22hunter22hunter22hunter ", "has spaces around it"),
    ],
)
def test_an_image_that_is_no_reference_is_refused(image, words):
    line = refusal(with_value(GKE, "multislice:gke.image", image))
    assert line.startswith("multislice:gke.image: ") and words in line, line
    assert "hunter22" not in line  # training.redaction: no password or token is echoed


@pytest.mark.parametrize("image", ["python:3.12-bookworm", "localhost:5000/a/b:c", "gcr.io/p/i@sha256:" + "0" * 64])
def test_references_by_the_grammar_are_accepted(image):
    assert validate_stack("dev", with_value(GKE, "multislice:gke.image", image), "test").gke.image == image


@pytest.mark.parametrize("location", ["us-central2-x-y", "central", "us-central2-b-", "US-CENTRAL2"])
def test_a_cluster_location_that_is_no_region_or_zone_is_refused(location):
    config = with_value(with_value(GKE, "multislice:gke.cluster", "ml"), "multislice:gke.clusterLocation", location)
    line = refusal(config)
    assert line.startswith("multislice:gke.clusterLocation: ") and "is not a GKE cluster location" in line, line


@pytest.mark.parametrize(
    ("namespace", "owner"),
    [
        ("kube-system", "Kubernetes"),
        ("kube-public", "Kubernetes"),
        ("jobset-system", "the JobSet controller"),
        ("gke-managed-system", "GKE"),
        ("gmp-system", "GKE"),
    ],
)
def test_a_namespace_kubernetes_gke_or_jobset_owns_is_refused(namespace, owner):
    line = refusal(with_value(GKE, "multislice:gke.namespace", namespace))
    assert line.startswith("multislice:gke.namespace: ") and f"is {owner}'s namespace" in line, line


def test_a_control_plane_overlapping_the_subnetwork_is_refused():
    config = with_value(GKE, "multislice:network.subnetCidr", "10.130.0.0/20")
    line = refusal(with_value(config, "multislice:gke.controlPlaneCidr", "10.130.4.0/28"))
    assert line.startswith("multislice:gke.controlPlaneCidr: ") and "overlaps the stack's subnetwork" in line, line
    validate_stack("dev", with_value(config, "multislice:gke.controlPlaneCidr", "172.16.0.0/28"), "test")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("controlPlaneCidr", "172.16.0.0/28"),
        ("version", "1.35"),
        ("deletionProtection", True),
        ("systemPool", {"minNodes": 2}),
        ("regional", True),
    ],
)
def test_a_new_clusters_key_with_an_existing_cluster_is_refused(key, value):
    config = with_value(with_value(GKE, "multislice:gke.cluster", "ml"), f"multislice:gke.{key}", value)
    line = refusal(config)
    assert line.startswith(f"multislice:gke.{key}: configures the cluster the stack makes"), line


def test_an_existing_clusters_location_without_one_is_refused():
    line = refusal(with_value(GKE, "multislice:gke.clusterLocation", "us-central2-b"))
    assert line.startswith("multislice:gke.clusterLocation: ") and "applies only with multislice:gke.cluster" in line


def test_an_existing_cluster_in_another_region_is_one_line_for_every_command(tmp_path):
    config = with_value(
        with_value(GKE, "multislice:gke.cluster", "ml"), "multislice:gke.clusterLocation", "europe-west4"
    )
    assert "the cluster is in region europe-west4" in refusal(config)
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    for command in (["check"], ["plan"], ["render"]):
        result = CliRunner().invoke(app, [*command, "--config-file", str(path)])
        assert result.exit_code == 2, (command, result.output)
        assert "Traceback" not in result.output and "the cluster is in region europe-west4" in result.output


@pytest.mark.parametrize("duration", ["5m", 599])
def test_a_gke_run_duration_under_ten_minutes_is_refused(duration):
    line = refusal(with_value(GKE, "multislice:gke.maxRunDuration", duration))
    assert line.startswith("multislice:gke.maxRunDuration: ") and "shorter than 10 minutes" in line, line


@pytest.mark.parametrize(
    "value", ["9" * 5000, "9" * 5000 + "s", 315_576_000_001, "3652501d"], ids=["digits", "digits-s", "int", "days"]
)
def test_a_duration_past_the_largest_protobuf_duration_is_refused(value):
    line = refusal(with_value(DEV, "multislice:queuedResource.validUntil", value))
    assert line.startswith("multislice:queuedResource.validUntil: ") and "longer than the longest duration" in line
    assert len(line) < 400


@pytest.mark.parametrize("kind", ["organizations", "folders"])
def test_a_reservation_path_under_an_organization_or_folder_is_refused(kind):
    path = f"{kind}/123/locations/us-central2-b/reservations/r"
    line = refusal(RESERVED | {"multislice:reservationName": path})
    assert line.startswith("multislice:reservationName: ") and "the TPU API's only form" in line, line


def test_trailing_newlines_are_not_accepted_by_any_anchored_pattern_directly():
    """The patterns themselves, with fullmatch: a value and the value plus a newline."""
    assert naming.GCE_NAME.fullmatch("abc") and not naming.GCE_NAME.fullmatch("abc\n")
    assert re.compile(r"^a$").match("a\n")  # what the static test above guards against

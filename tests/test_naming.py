"""infra/naming.py: the names of a stack's cloud resources and the label rules.

(What the program registers under those names, for every shipped stack and for awkward stack
names, is checked in tests/test_components.py and tests/test_program.py.)
"""

from __future__ import annotations

import pytest

from infra import naming
from infra.naming import gce_name


def test_names_of_two_long_stacks_with_one_prefix_differ():
    a, b = "x" * 80 + "a", "x" * 80 + "b"
    for name_of in (naming.queued_resource_id, naming.network_tag, naming.service_account_id,
                    lambda s: naming.network_resource_name(s, "iap-ssh"), lambda s: naming.bucket_name("acme-ml-dev", s)):
        assert name_of(a) != name_of(b)


def test_network_resource_names_are_prefix_and_role():
    assert [naming.network_resource_name("dev", role) for role in naming.NETWORK_ROLES] == [
        "multislice-dev-net", "multislice-dev-subnet", "multislice-dev-router", "multislice-dev-nat",
        "multislice-dev-internal", "multislice-dev-iap-ssh"]
    with pytest.raises(ValueError, match=r"unknown network resource role 'vpc'; known: net, subnet"):
        naming.network_resource_name("dev", "vpc")


def test_names_of_a_stack():
    assert naming.queued_resource_id("dev") == "multislice-dev"
    assert naming.node_ids("dev", 1) == ["multislice-dev"]
    assert naming.node_ids("dev", 3) == ["multislice-dev-0", "multislice-dev-1", "multislice-dev-2"]
    assert naming.network_tag("dev") == "multislice-dev-tpu"
    assert naming.service_account_id("dev") == "multislice-dev-tpu"
    assert naming.bucket_name("acme-ml-dev", "dev") == "acme-ml-dev-dev-ckpt"
    assert naming.bucket_name("acme-ml-dev", "dev", "mine") == "mine"
    assert naming.run_dir("b", "r1") == "gs://b/runs/r1"
    assert naming.resource_labels("Dev.1", "Run_2", {"team": "x"}) == {
        "team": "x", "managed-by": "pulumi", "multislice-stack": "dev-1", "multislice-run": "run_2"}


def test_long_names_stay_distinct():
    assert gce_name("a" * 70, limit=40) != gce_name("a" * 71, limit=40)


@pytest.mark.parametrize(
    "parts, limit, expected",
    [
        (("multislice", "Prod_EU.2"), 63, "multislice-prod-eu-2"),
        (("9lives",), 63, "m-9lives"),  # RFC 1035 names start with a letter
        (("a--b", "-c-"), 63, "a-b-c"),
    ],
)
def test_gce_name_spelling(parts, limit, expected):
    assert gce_name(*parts, limit=limit) == expected


def test_gce_name_cuts_long_names_to_the_limit_with_a_digest():
    name = gce_name("multislice", "x" * 80, limit=naming.PREFIX_LIMIT)
    assert len(name) == naming.PREFIX_LIMIT and name.startswith("multislice-xxx")
    assert naming.GCE_NAME.match(name) and name[-7] == "-"


def test_label_value_spelling():
    assert naming.label_value("Prod_EU.2") == "prod_eu-2"
    assert len(naming.label_value("r" * 100)) == 63


def test_user_labels_follow_the_label_rules():
    assert naming.check_labels({"team": "ml", "cost-center": ""}) == {"team": "ml", "cost-center": ""}
    with pytest.raises(ValueError, match=r"^must be a mapping"):
        naming.check_labels(["team"])
    too_many = {f"k{i}": "v" for i in range(naming.MAX_LABELS - len(naming.RESERVED_LABELS) + 1)}
    with pytest.raises(ValueError, match=r"at most 61 labels \(GCP allows 64 per resource\)"):
        naming.check_labels(too_many)
    with pytest.raises(ValueError, match=r"key 'multislice-run' is set by this program.*value 1 of 'a' must be a string"):
        naming.check_labels({"multislice-run": "x", "a": 1})

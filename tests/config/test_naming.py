"""infra/naming.py: the names of a stack's cloud resources and the label rules.

(What the program registers under those names, for every shipped stack and for awkward stack
names, is checked in tests/components/test_args.py and tests/program/test_program.py.)
"""

from __future__ import annotations

import random

import pytest

from infra import naming
from infra.naming import gce_name


def test_names_of_two_long_stacks_with_one_prefix_differ():
    a, b = "x" * 80 + "a", "x" * 80 + "b"
    for name_of in (
        naming.queued_resource_id,
        naming.network_tag,
        naming.service_account_id,
        lambda s: naming.network_resource_name(s, "iap-ssh"),
        lambda s: naming.bucket_name("acme-ml-dev", s),
    ):
        assert name_of(a) != name_of(b)


def test_network_resource_names_are_prefix_and_role():
    assert [naming.network_resource_name("dev", role) for role in naming.NETWORK_ROLES] == [
        "multislice-dev-net",
        "multislice-dev-subnet",
        "multislice-dev-router",
        "multislice-dev-nat",
        "multislice-dev-internal",
        "multislice-dev-iap-ssh",
    ]
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
        "team": "x",
        "managed-by": "pulumi",
        "multislice-stack": "dev-1",
        "multislice-run": "run_2",
    }


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
    with pytest.raises(
        ValueError, match=r"key 'multislice-run' is set by this program.*the value of 'a' must be a string"
    ):
        naming.check_labels({"multislice-run": "x", "a": 1})


# One stack, one set of names ------------------------------------------------------------


def derived_names(stack: str, project: str = "acme-ml-dev") -> set[tuple[str, str]]:
    """Every (collection, name) a stack's resources take in one project and zone, for 1–3 slices."""
    names = {
        ("queuedResources", naming.queued_resource_id(stack)),
        ("serviceAccounts", naming.service_account_id(stack)),
        ("buckets", naming.bucket_name(project, stack)),
        ("networkTags", naming.network_tag(stack)),
        ("labels", naming.label_value(stack)),
    }
    kinds = {
        "net": "networks",
        "subnet": "subnetworks",
        "router": "routers",
        "nat": "nats",
        "internal": "firewalls",
        "iap-ssh": "firewalls",
    }
    names |= {(kinds[role], naming.network_resource_name(stack, role)) for role in naming.NETWORK_ROLES}
    names |= {("nodes", node) for slices in (1, 2, 3) for node in naming.node_ids(stack, slices)}
    return names


def accepted(stack: str) -> bool:
    try:
        naming.check_stack_name(stack)
    except ValueError as err:
        assert str(err).startswith(f"{stack!r} must "), err
        return False
    return True


@pytest.mark.parametrize(
    "a, b", [("Staging", "staging"), ("qa_1", "qa-1"), ("prod.eu", "prod-eu"), ("a--b", "a-b"), ("x" * 16, "x" * 15)]
)
def test_names_that_would_collapse_into_one_are_refused(a, b):
    # Today's rewriting maps both spellings to the same GCE name; only one may be a stack.
    assert gce_name("multislice", a) == gce_name("multislice", b) or len(a) > naming.STACK_NAME_LIMIT
    assert not (accepted(a) and accepted(b))


def test_a_stack_name_ending_in_a_number_would_be_a_slice_of_another_stack():
    assert naming.node_ids("qa", 2)[1] == naming.node_ids("qa-1", 1)[0]  # why qa-1 is refused
    with pytest.raises(ValueError, match=r"'qa-1' must not end in '-<number>'.*slice 1 of stack 'qa'.*write 'qa1'"):
        naming.check_stack_name("qa-1")
    assert naming.check_stack_name("qa1") == "qa1" and naming.check_stack_name("v4-8x") == "v4-8x"


def test_distinct_accepted_stack_names_never_share_a_resource_name():
    # A property over many random names, biased toward the spellings that used to collide.
    rng = random.Random(20260115)
    stacks = {
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 17)))
        for alphabet in ("abAB01-_.", "ab01-")
        for _ in range(3000)
    }
    stacks |= {"dev", "staging", "prod", "Staging", "qa_1", "qa-1", "qa", "qa1", "a-b", "a-b-0", "a-0", "a-0-1"}
    owners: dict[tuple[str, str], str] = {}
    kept = [s for s in sorted(stacks) if accepted(s)]
    assert 1000 < len(kept) < len(stacks) - 1000  # both outcomes are exercised
    for stack in kept:
        for name in derived_names(stack):
            assert owners.setdefault(name, stack) == stack, (name, owners[name], stack)
        # Spelled in unchanged and uncut: nothing was rewritten or hashed.
        assert naming.resource_prefix(stack) == f"multislice-{stack}"
        assert naming.service_account_id(stack) == f"multislice-{stack}-tpu"

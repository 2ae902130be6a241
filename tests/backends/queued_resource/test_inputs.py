"""The queued resource's properties (infra/backends/queued_resource/provider/inputs.py): each key's kind, the
replace / update rules derived from it, and the props a stack gives.

A key's kind is checked against what its change does to the create request
(``build_queued_resource``): a key the API never sees cannot need a replacement, a key that
only changes node fields ``UpdateNode`` can patch (description, tags, labels, metadata:
https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/patch) is updated
in place, and anything else in the request of an immutable queued resource means replace.
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest
from google.cloud import tpu_v2
from pulumi.runtime.rpc import UNKNOWN

from infra.backends.queued_resource.provider.inputs import (
    FORMER_OUTPUT_KEYS,
    INPUT_KEYS,
    OUTPUT_KEYS,
    PROVIDER_VERSION,
    REPLACE_KEYS,
    UPDATE_IN_PLACE_KEYS,
    Kind,
    QueuedResourceInputs,
    build_queued_resource,
    differs,
    keys_of,
    node_ids,
    parent_of,
    with_current_keys,
)
from infra.config import load_stack
from infra.queued_resource import QueuedResourceProvider
from infra.vm_contract import RUN_DIR_KEY, STARTUP_SCRIPT_KEY
from tests.fakes.queued_resource import (  # noqa: F401 (dev, no_ambient_credentials, props: fixtures)
    dev,
    no_ambient_credentials,
    props,
    props_for,
    script,
)

#: Node fields UpdateNode's update_mask accepts, as paths of the create request below.
UPDATABLE = tuple(f"body.tpu.node_spec.0.node.{name}" for name in ("description", "tags", "labels", "metadata"))

#: A different value for every input key (any value the key could take).
CHANGED = {
    "project": "acme-ml-other",
    "zone": "us-central2-a",
    "queuedResourceId": "multislice-other",
    "nodeId": "multislice-other",
    "nodeIdPrefix": "multislice-other",
    "acceleratorType": "v4-16",
    "runtimeVersion": "v2-alpha-tpuv5",
    "slices": 4,
    "capacity": "on-demand",
    "reservationName": "projects/acme-ml-dev/locations/us-central2-b/reservations/other",
    "network": "projects/acme-ml-dev/global/networks/other",
    "subnetwork": "projects/acme-ml-dev/regions/us-central2/subnetworks/other",
    "serviceAccount": "other@acme-ml-dev.iam.gserviceaccount.com",
    "metadata": {STARTUP_SCRIPT_KEY: "#!/bin/bash\necho v2\n", RUN_DIR_KEY: "gs://b/runs/dev"},
    "labels": {"managed-by": "pulumi", "team": "research"},
    "tags": ["other-tag"],
    "trainer": {"steps": 7},
    "runDir": "gs://acme-ml-dev-dev-ckpt/runs/other",
    "bundleSha256": "c" * 64,
    "startupScriptSha256": "d" * 64,
    "requirementsSha256": "e" * 64,
    "startupScriptBytes": 12345,
    "releaseFiles": {"training/model/transformer.py": "0123456789abcdef"},
    "waitFor": "PROVISIONING",
    "createTimeoutSeconds": 60,
    "deleteTimeoutSeconds": 60,
    "validUntilSeconds": 7200,
    "version": PROVIDER_VERSION + "-next",
}


def base_props_for(key: str, props: dict) -> dict:
    """Props in which ``key`` is set: one slice for ``nodeId``, reserved capacity for
    ``reservationName``, a queueing deadline for ``validUntilSeconds``."""
    if key == "nodeId":
        single = {**props, "slices": 1, "nodeId": props["queuedResourceId"]}
        del single["nodeIdPrefix"]
        return single
    if key == "reservationName":
        return {
            **props,
            "capacity": "reserved",
            "reservationName": "projects/acme-ml-dev/locations/us-central2-b/reservations/a",
        }
    if key == "validUntilSeconds":
        return {**props, "validUntilSeconds": 3600}
    return props


def flatten(value, prefix: str = "") -> dict[str, object]:
    if isinstance(value, dict) and value:  # an empty message (``spot {}``) is a leaf
        return {
            k: v for key, item in value.items() for k, v in flatten(item, f"{prefix}.{key}" if prefix else key).items()
        }
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{prefix}.{i}").items()}
    return {prefix: value}


def request_of(props: dict) -> dict[str, object]:
    """Every field a create sends for ``props``, flattened: parent, id and the message."""
    body = tpu_v2.QueuedResource.to_dict(build_queued_resource(props))
    return flatten({"parent": parent_of(props), "queuedResourceId": props["queuedResourceId"], "body": body})


def changed_request_paths(old: dict, new: dict) -> set[str]:
    before, after = request_of(old), request_of(new)
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def kind_of(key: str) -> Kind:
    (kind,) = [f.metadata["kind"] for f in dataclasses.fields(QueuedResourceInputs) if f.metadata["key"] == key]
    return kind


def test_every_input_key_has_a_changed_value_above():
    assert set(CHANGED) == set(INPUT_KEYS)


@pytest.mark.parametrize("key", sorted(CHANGED))
def test_each_key_kind_follows_from_what_its_change_does_to_the_create_request(props, key):
    old = base_props_for(key, props)
    new = {**old, key: CHANGED[key]}
    paths = changed_request_paths(old, new)
    if not paths:
        expected = {Kind.DESCRIPTIVE, Kind.PROVIDER_ONLY}  # the API never sees it
    elif all(path.startswith(UPDATABLE) for path in paths):
        expected = {Kind.UPDATE_IN_PLACE}
    elif key == "validUntilSeconds":
        # The queueing policy matters only while queued: never a reason to give up capacity.
        expected = {Kind.PROVIDER_ONLY}
    else:
        expected = {Kind.REPLACE}
    assert kind_of(key) in expected, f"{key} changes {sorted(paths)}"

    # The provider's diff follows the kind: replace (delete first) only for REPLACE keys.
    diff = QueuedResourceProvider().diff("id", old, new)
    assert diff.changes is True
    assert (key in diff.replaces) is (expected == {Kind.REPLACE}) and diff.delete_before_replace is True


def changed_keys(old: dict, new: dict) -> set[str]:
    return {key for key in old.keys() | new.keys() if old.get(key) != new.get(key)}


def test_descriptive_keys_follow_the_script_and_provider_only_keys_the_queued_resource_settings(dev):
    base = props_for(dev)
    other_script = props_for(
        dev, script("#!/bin/bash\necho version 2\n", bundle_sha256="c" * 64, requirements_sha256="d" * 64)
    )
    other_training = props_for(dev.model_copy(update={"training": dev.training.model_copy(update={"seed": 7})}))
    other_run = props_for(dev.model_copy(update={"run_name": "second"}))
    describing = changed_keys(base, other_script) | changed_keys(base, other_training) | changed_keys(base, other_run)
    assert describing - set(UPDATE_IN_PLACE_KEYS) == set(keys_of(Kind.DESCRIPTIVE))

    settings = dev.queued_resource.model_copy(
        update={"wait_for": "PROVISIONING", "create_timeout": 60, "delete_timeout": 60, "valid_until": 7200}
    )
    steering = changed_keys(base, props_for(dev.model_copy(update={"queued_resource": settings})))
    assert steering | {"version"} == set(keys_of(Kind.PROVIDER_ONLY))


def test_the_key_tuples_partition_the_properties():
    engine_names = [f.metadata["key"] for f in dataclasses.fields(QueuedResourceInputs)]
    assert len(engine_names) == len(set(engine_names))
    groups = [keys_of(kind) for kind in Kind]
    assert sum(len(group) for group in groups) == len(engine_names)
    assert set().union(*groups) == set(engine_names)
    assert (REPLACE_KEYS, UPDATE_IN_PLACE_KEYS, OUTPUT_KEYS) == tuple(
        keys_of(k) for k in (Kind.REPLACE, Kind.UPDATE_IN_PLACE, Kind.OUTPUT)
    )
    assert INPUT_KEYS == keys_of(Kind.REPLACE, Kind.UPDATE_IN_PLACE, Kind.DESCRIPTIVE, Kind.PROVIDER_ONLY)
    # The outputs the resource class declares are the OUTPUT fields.
    from infra.queued_resource import QueuedResource

    declared = set(QueuedResource.__annotations__)
    assert declared <= set(OUTPUT_KEYS)


def test_props_of_a_stack_carry_every_input_it_sets_and_no_outputs(dev, props):
    assert list(props) == [key for key in INPUT_KEYS if key in props]
    # dev: 2 slices (nodeIdPrefix, no nodeId), spot (no reservation), no queueing deadline.
    assert set(INPUT_KEYS) - set(props) == {"nodeId", "reservationName", "validUntilSeconds"}
    assert props["nodeIdPrefix"] == "multislice-dev" and node_ids(props) == ["multislice-dev-0", "multislice-dev-1"]
    assert props["version"] == PROVIDER_VERSION
    text = props["metadata"][STARTUP_SCRIPT_KEY]
    assert props["startupScriptSha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert props["startupScriptBytes"] == len(text.encode())
    assert props["runDir"] == props["metadata"][RUN_DIR_KEY] == dev.run_dir

    single = props_for(dev.model_copy(update={"slices": 1}))
    assert single["nodeId"] == "multislice-dev" and "nodeIdPrefix" not in single
    assert node_ids(single) == ["multislice-dev"]
    queued = props_for(
        dev.model_copy(update={"queued_resource": dev.queued_resource.model_copy(update={"valid_until": 7200})})
    )
    assert queued["validUntilSeconds"] == 7200


def test_to_props_leaves_out_unset_optionals_and_outputs(props):
    inputs = QueuedResourceInputs(
        **{
            f.name: props[f.metadata["key"]]
            for f in dataclasses.fields(QueuedResourceInputs)
            if f.metadata["key"] in props
        },
        state="ACTIVE",
        ready=True,
    )
    assert inputs.to_props() == props


def test_an_unknown_value_during_preview_always_differs():
    assert differs(UNKNOWN, UNKNOWN) and differs("v4-8", UNKNOWN) and differs(UNKNOWN, "v4-8")
    assert not differs({"b": 1, "a": [1, 2]}, {"a": [1, 2], "b": 1})
    assert differs({"a": [1, 2]}, {"a": [2, 1]})


def test_reservation_path_names_the_reservation_or_any_in_the_zone(dev):
    from infra.backends.queued_resource.program import reservation_path  # the program computes it from the stack

    prod = load_stack("prod")
    assert reservation_path(prod) == "projects/acme-ml-prod/locations/us-east5-a/reservations/acme-v5p-training"
    assert reservation_path(dev) is None
    reserved = dev.model_copy(update={"capacity": "reserved", "reservation_name": None})
    assert reservation_path(reserved) == "projects/acme-ml-dev/locations/us-central2-b/reservations/-"
    full = dev.model_copy(
        update={"capacity": "reserved", "reservation_name": "folders/7/locations/us-central2-b/reservations/r"}
    )
    assert reservation_path(full) == "folders/7/locations/us-central2-b/reservations/r"


def test_the_provider_accepts_the_capacity_types_the_stack_config_offers():
    from infra.backends.queued_resource.provider.inputs import CAPACITY_TYPES as accepted
    from infra.backends.queued_resource.spec import SPEC
    from infra.config import CAPACITY_TYPES as offered

    # The provider does not import infra.config: the two are kept equal here, but for the capacity
    # only another backend offers (the config refuses it on a queued resource: the spec's list).
    assert accepted == SPEC.capacities and set(accepted) <= set(offered)


def test_outputs_recorded_under_a_former_name_read_under_the_current_one():
    # A stack whose state the provider wrote before "released" became "deletedOnComplete".
    assert FORMER_OUTPUT_KEYS == {"released": "deletedOnComplete"}
    assert set(FORMER_OUTPUT_KEYS.values()) <= set(OUTPUT_KEYS) and not set(FORMER_OUTPUT_KEYS) & set(OUTPUT_KEYS)
    old = {"queuedResourceId": "q", "released": True, "completedStep": 7}
    assert with_current_keys(old) == {"queuedResourceId": "q", "deletedOnComplete": True, "completedStep": 7}
    assert with_current_keys({"released": False}) == {"deletedOnComplete": False}
    assert with_current_keys({"released": True, "deletedOnComplete": False}) == {"deletedOnComplete": False}
    current = {"queuedResourceId": "q", "deletedOnComplete": True}
    assert with_current_keys(current) == current and with_current_keys({}) == {}

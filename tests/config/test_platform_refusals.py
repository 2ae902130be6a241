"""Stack-file values the real platform refuses (or that mean nothing), each refused while the stack
file is read, in one line naming its key path. Every test writes a stack file and reads it as
``multislice plan`` does (:func:`infra.config.load_stack_file`). The expected words come from the rules'
sources, which each rule's docstring cites:

* ``multislice:gke.version`` below 1.27.4-gke.900 ("Deploy TPU Multislices in GKE": "Standard supports
  Multislice in version 1.27.4-gke.900 and later"; infra/backends/gke/versions.py);
* ``multislice:gke.jobSetVersion`` below v0.10.1, the release the stack's JobSet is written for
  (infra/backends/gke/cluster.py);
* ``multislice:gke.systemPool.machineType``: a TPU machine type, or no Compute Engine machine type's shape
  (infra/backends/gke/machine_types.py);
* a port outside 1–65535 in an image reference or a requirement's URL (RFC 6335);
* a boolean key set to anything but true/false (what Pulumi's ``Config.get_bool`` reads; every boolean key
  of the stack, through :data:`training.validation.ConfigBool`);
* a non-ASCII image tag (the distribution reference grammar's ``\\w`` is RE2's, ASCII), shown without the
  token it carries;
* ``multislice:elastic`` waits and ``multislice:queuedResource`` timeouts longer than seven days, and a
  ``shrinkAfter`` shorter than a trainer's restart;
* a snake_case spelling of a nested key, alone or beside its camelCase one;
* a reservation path in a form the stack's backend does not send (infra/config/reservations.py).
"""

from __future__ import annotations

import copy
import types
import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from infra.config import StackConfig, StackConfigError, load_stack_file
from training.validation import config_bool

#: The dev stack's file as YAML reads it.
DEV: dict[str, Any] = yaml.safe_load((Path(__file__).parents[2] / "stacks" / "Pulumi.dev.yaml").read_text())["config"]
MULTISLICE = "https://cloud.google.com/kubernetes-engine/docs/how-to/tpu-multislice"


def on_backend(backend: str, capacity: str = "spot") -> dict[str, Any]:
    """The dev stack on ``backend``: two slices of v4-16 on gke (GKE takes multi-host slices only), of v5p-16 in
    us-east5-a on compute-engine (it offers no v4); 8 chips a slice, fsdp over them."""
    config = copy.deepcopy(DEV)
    accelerator, zone = ("v4-16", DEV["gcp:zone"]) if backend == "gke" else ("v5p-16", "us-east5-a")
    config |= {
        "gcp:zone": zone,
        "multislice:acceleratorType": accelerator,
        "multislice:backend": backend,
        "multislice:capacity": capacity,
    }
    config["multislice:training"]["parallelism"] = {
        "ici": {"data": 1, "fsdp": 8, "tensor": 1},
        "dcn": {"data": 2, "fsdp": 1, "tensor": 1},
    }
    config["multislice:training"]["global_batch_size"] = 32
    return config


GKE = on_backend("gke")


def with_value(config: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """``config`` with ``multislice:gke.version``-style ``dotted`` set to ``value``."""
    out = copy.deepcopy(config)
    head, *rest = dotted.split(".")
    node = out
    for part in [head, *rest][:-1]:
        node = node.setdefault(part, {})
    node[[head, *rest][-1]] = value
    return out


def stack_file(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": config}, sort_keys=False, allow_unicode=True))
    return path


def refusal(tmp_path: Path, config: dict[str, Any]) -> str:
    """The one line reading the stack file ``config`` gives."""
    with pytest.raises(StackConfigError) as err:
        load_stack_file(stack_file(tmp_path, config))
    lines = err.value.lines
    assert len(lines) == 1, lines
    return lines[0]


def read(tmp_path: Path, config: dict[str, Any]) -> StackConfig:
    return load_stack_file(stack_file(tmp_path, config))


# 1. GKE's Multislice floor --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.20", "1.27", "1.27.4", "1.27.4-gke.899"])
def test_a_gke_version_below_the_multislice_floor_is_refused(tmp_path, version):
    assert refusal(tmp_path, with_value(GKE, "multislice:gke.version", version)) == (
        f"multislice:gke.version: {version} is below 1.27.4-gke.900, the GKE version Multislice node pools need "
        f"({MULTISLICE}): pin 1.27.4-gke.900 or later, or leave it unset for the release channel's"
    )


@pytest.mark.parametrize("version", ["1.27.4-gke.900", "1.28", "1.35.0-gke.1"])
def test_a_gke_version_at_or_above_the_multislice_floor_is_read(tmp_path, version):
    assert read(tmp_path, with_value(GKE, "multislice:gke.version", version)).gke.version == version


# 2. JobSet's floor ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v0.1.0", "v0.9.9", "v0.10.0"])
def test_a_jobset_release_below_the_one_the_jobset_is_written_for_is_refused(tmp_path, version):
    assert refusal(tmp_path, with_value(GKE, "multislice:gke.jobSetVersion", version)) == (
        f"multislice:gke.jobSetVersion: {version} is below v0.10.1, the oldest JobSet release the stack's JobSet is "
        "written for (its failure policy's named rules; GKE asks for v0.10.1 or later for Multislice: docs/gke.md "
        "section 5): use v0.10.1 or later"
    )


@pytest.mark.parametrize("version", ["v0.10.1", "v0.12.0", "v1.0.0"])
def test_a_jobset_release_at_or_above_the_floor_is_read(tmp_path, version):
    assert read(tmp_path, with_value(GKE, "multislice:gke.jobSetVersion", version)).gke.jobset_version == version


# 3. the system pool's machine type -----------------------------------------------------------------------

SYSTEM_POOL = "multislice:gke.systemPool.machineType"


@pytest.mark.parametrize(
    "machine_type", ["ct5lp-hightpu-4t", "ct6e-standard-4t", "ct5p-hightpu-4t", "ct4p-hightpu-4t", "tpu7x-standard-4t"]
)
def test_a_tpu_machine_type_for_the_system_pool_is_refused(tmp_path, machine_type):
    assert refusal(tmp_path, with_value(GKE, SYSTEM_POOL, machine_type)) == (
        f"{SYSTEM_POOL}: {machine_type!r} is a TPU machine type; the system pool runs the JobSet controller and the "
        "cluster's services, which TPU nodes' taint keeps off: use a CPU machine type, e.g. e2-standard-4"
    )


@pytest.mark.parametrize("machine_type", ["foo-bar", "e2_standard_4", "e2-standard-", "standard-4", "e2-standard-4-"])
def test_a_name_of_no_machine_types_shape_is_refused(tmp_path, machine_type):
    assert refusal(tmp_path, with_value(GKE, SYSTEM_POOL, machine_type)) == (
        f"{SYSTEM_POOL}: {machine_type!r} is not a Compute Engine machine type: <series>-<type>-<vCPUs> such as "
        "e2-standard-4 or n2-highmem-8, or a custom type such as n2-custom-4-16384 "
        "(https://cloud.google.com/compute/docs/machine-resource)"
    )


@pytest.mark.parametrize(
    "machine_type",
    [
        "e2-standard-4",
        "n2-highmem-8",
        "n2d-standard-2",
        "e2-medium",
        "f1-micro",
        "c3-standard-4-lssd",
        "c3-highcpu-192-metal",
        "custom-2-4096",
        "n2-custom-4-16384",
        "n2-custom-2-15360-ext",
        "e2-custom-small-4096",
    ],
)
def test_compute_engine_machine_types_are_read(tmp_path, machine_type):
    assert read(tmp_path, with_value(GKE, SYSTEM_POOL, machine_type)).gke.system_pool.machine_type == machine_type


# 4. ports -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("port", "shown"), [("12345678901234", "123456789012…"), ("65536", "65536"), ("0", "0")])
def test_an_image_registry_port_outside_the_tcp_range_is_refused(tmp_path, port, shown):
    image = f"registry.example.com:{port}/team/img:1"
    assert refusal(tmp_path, with_value(GKE, "multislice:gke.image", image)) == (
        f"multislice:gke.image: {image!r}: the registry's port {shown} is not a TCP port (1 to 65535)"
    )


@pytest.mark.parametrize("image", ["localhost:5000/img:1", "registry.example.com:65535/team/img", "[::1]:1/img"])
def test_an_image_registry_port_in_range_is_read(tmp_path, image):
    assert read(tmp_path, with_value(GKE, "multislice:gke.image", image)).gke.image == image


def workload(tmp_path: Path, requirement: str) -> dict[str, Any]:
    requirements = tmp_path / "requirements-vm.txt"
    requirements.write_text(f"{requirement} --hash=sha256:{'a' * 64}\n")
    config = {key: value for key, value in DEV.items() if key != "multislice:training"}
    return config | {
        "multislice:workload": {"command": ["python3", "x.py"], "steps": 10, "requirements": str(requirements)}
    }


@pytest.mark.parametrize("port", ["12345678901234", "65536", "0"])
def test_a_requirement_url_port_outside_the_tcp_range_is_refused(tmp_path, port):
    requirement = f"foo @ https://ci:hunter22@files.example.com:{port}/foo-1.0.zip"
    line = refusal(tmp_path, workload(tmp_path, requirement))
    assert line == (
        f"multislice:workload.requirements: {tmp_path / 'requirements-vm.txt'}: line 1: "
        f"'foo @ https://ci:***@files.example.com:{port}/foo-1.0.zip': its port is not a TCP port (1 to 65535: "
        "RFC 6335, section 6)"
    )
    assert "hunter22" not in line


def test_a_requirement_url_port_in_range_is_read(tmp_path):
    config = read(tmp_path, workload(tmp_path, "foo @ https://files.example.com:8443/foo-1.0.zip"))
    assert config.workload is not None and config.workload.requirements is not None


# 5. booleans ----------------------------------------------------------------------------------------------

#: Every boolean key of a stack (tests below check none is missing), with the stack it is set on.
BOOLEAN_KEYS = [
    (DEV, "multislice:allowBackendChange"),
    (DEV, "multislice:warmStandby"),
    (DEV, "multislice:network.iapSsh"),
    (DEV, "multislice:network.nat"),
    (DEV, "multislice:bucket.forceDestroy"),
    (DEV, "multislice:bucket.adopt"),
    (DEV, "multislice:bucket.protect"),
    (DEV, "multislice:queuedResource.deleteOnComplete"),
    (DEV, "multislice:queuedResource.releaseOnComplete"),
    (DEV, "multislice:training.checkpoint.async_save"),
    (DEV, "multislice:training.model.tie_embeddings"),
    (GKE, "multislice:gke.regional"),
    (GKE, "multislice:gke.deletionProtection"),
    (GKE, "multislice:gke.installJobSet"),
    # Queued provisioning takes flex-start capacity, which GKE offers on no TPU v4: v5p-16 slices.
    (on_backend("compute-engine", "flex-start") | {"multislice:backend": "gke"}, "multislice:gke.queuedProvisioning"),
]
KEY_IDS = [key for _, key in BOOLEAN_KEYS]


@pytest.mark.parametrize(("config", "key"), BOOLEAN_KEYS, ids=KEY_IDS)
@pytest.mark.parametrize(("value", "shown"), [("yes", "'yes'"), ("on", "'on'"), ("1", "'1'"), (1, "1"), ("t", "'t'")])
def test_a_boolean_key_takes_true_or_false_only(tmp_path, config, key, value, shown):
    line = refusal(tmp_path, with_value(config, key, value))
    if "." not in key and not isinstance(value, str):  # a top-level key: the engine hands the program its text
        line = line.replace(f"got '{value}'", f"got {value}")
    assert line == f"{key}: got {shown}; takes true or false (as Pulumi's Config.get_bool reads it)"


@pytest.mark.parametrize(("config", "key"), BOOLEAN_KEYS, ids=KEY_IDS)
@pytest.mark.parametrize(("value", "expected"), [(True, True), ("true", True), ("True", True), ("False", False)])
def test_a_boolean_key_reads_what_pulumis_get_bool_reads(tmp_path, config, key, value, expected):
    stack = read(tmp_path, with_value(config, key, value))
    node: Any = stack
    for part in key.split(":", 1)[1].split("."):
        node = getattr(node, _field_of(type(node), part))
    assert node is expected


def _field_of(model: type[pydantic.BaseModel], key: str) -> str:
    return next(
        name for name, field in model.model_fields.items() if (field.alias or name) in (key, f"multislice:{key}")
    )


def _members(annotation: Any) -> list[Any]:
    """The types of an annotation, ``X | None`` split, each with its ``Annotated`` metadata (a list)."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        return [(member, [*metadata, *more]) for member, more in _members(base)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [pair for arg in typing.get_args(annotation) for pair in _members(arg)]
    return [(annotation, [])]


def _boolean_fields(model: type[pydantic.BaseModel], path: str, seen: set[type]) -> dict[str, list[Any]]:
    """Each boolean key below ``model`` (key path → the metadata of its ``bool``), walking nested models."""
    found: dict[str, list[Any]] = {}
    for name, field in model.model_fields.items():
        key = f"{path}{field.alias or name}"
        for member, metadata in _members(field.annotation):
            if member is bool:
                found[key] = [*field.metadata, *metadata]
            elif isinstance(member, type) and issubclass(member, pydantic.BaseModel) and member not in seen:
                found |= _boolean_fields(member, f"{key}.", seen | {model})
    return found


def test_every_boolean_key_of_a_stack_is_a_config_bool_and_tested():
    fields = _boolean_fields(StackConfig, "", set())
    assert sorted(fields) == sorted(KEY_IDS)
    unchecked = [
        key for key, metadata in fields.items() if not any(getattr(m, "func", None) is config_bool for m in metadata)
    ]
    assert unchecked == []


# 6. a non-ASCII image tag -------------------------------------------------------------------------------


def test_a_non_ascii_image_tag_is_refused_without_the_token_it_carries(tmp_path):
    token = "ghp_" + "A1b2" * 9
    image = f"ghcr.io/acme/trainer:{token}-bookwörm"
    line = refusal(tmp_path, with_value(GKE, "multislice:gke.image", image))
    assert line == (
        "multislice:gke.image: 'ghcr.io/acme/trainer:ghp_***-bookwörm' is not an image reference "
        "([domain/]path[:tag][@digest]: a lowercase path, a tag of at most 128 of [A-Za-z0-9_.-], a digest "
        "algorithm:hex) (a reference is ASCII: no other letters in a tag or a name)"
    )
    assert token not in line


@pytest.mark.parametrize("image", ["python:3.12-bookwörm", "python:３", "python:ǅ"])
def test_a_tag_of_unicode_letters_or_digits_is_refused(tmp_path, image):
    line = refusal(tmp_path, with_value(GKE, "multislice:gke.image", image))
    assert line.startswith(f"multislice:gke.image: {image!r} is not an image reference"), line


# 7. durations ---------------------------------------------------------------------------------------------

ELASTIC_MAX = "is longer than 7d (604800 s), the longest run of any TPU capacity with a run limit (flex-start)"


def test_a_shrink_after_longer_than_seven_days_is_refused(tmp_path):
    config = with_value(DEV, "multislice:elastic", {"minSlices": 1, "shrinkAfter": "3650000d"})
    assert refusal(tmp_path, config) == (
        f"multislice:elastic.shrinkAfter: 3650000d {ELASTIC_MAX}: the slices present wait that long for a lost "
        "one, held and billed; to never go on without it, leave minSlices unset"
    )


def test_a_grow_after_longer_than_seven_days_is_refused(tmp_path):
    config = with_value(DEV, "multislice:elastic", {"minSlices": 1, "growAfter": 8 * 86400})
    assert refusal(tmp_path, config) == (
        f"multislice:elastic.growAfter: 8d {ELASTIC_MAX}: the run would never grow back within one; to train on "
        "fewer slices for good, lower multislice:slices"
    )


@pytest.mark.parametrize(("value", "shown"), [("5s", "5s"), (1, "1s"), ("29s", "29s")])
def test_a_shrink_after_shorter_than_a_restart_is_refused(tmp_path, value, shown):
    # The emulation flapped at 5 s: every restart into the next epoch made a member look lost.
    config = with_value(DEV, "multislice:elastic", {"minSlices": 1, "shrinkAfter": value})
    assert refusal(tmp_path, config) == (
        f"multislice:elastic.shrinkAfter: {shown} is shorter than 30s, a heartbeat's staleness window and more "
        "than a trainer's restart: a slice restarting into the next epoch would be taken for lost at every "
        "change; use 30s or more"
    )


def test_a_shrink_after_of_thirty_seconds_is_read(tmp_path):
    config = read(tmp_path, with_value(DEV, "multislice:elastic", {"minSlices": 1, "shrinkAfter": "30s"}))
    assert config.elastic.shrink_after == 30


def test_elastic_waits_of_seven_days_are_read(tmp_path):
    config = read(tmp_path, with_value(DEV, "multislice:elastic", {"shrinkAfter": "7d", "growAfter": "6d24h"}))
    assert (config.elastic.shrink_after, config.elastic.grow_after) == (604800, 604800)


@pytest.mark.parametrize("key", ["createTimeout", "deleteTimeout"])
def test_a_queued_resource_wait_longer_than_seven_days_is_refused(tmp_path, key):
    assert refusal(tmp_path, with_value(DEV, f"multislice:queuedResource.{key}", "30d")) == (
        f"multislice:queuedResource.{key}: 30d is longer than 7d (604800 s): pulumi up holds the stack's update "
        "while it waits, and a queued resource still waiting stays queued for the next pulumi up to wait again"
    )


def test_valid_until_keeps_the_apis_own_bound(tmp_path):
    config = read(tmp_path, with_value(DEV, "multislice:queuedResource", {"validUntil": "30d", "createTimeout": "7d"}))
    assert (config.queued_resource.valid_until, config.queued_resource.create_timeout) == (30 * 86400, 7 * 86400)


# 8. snake_case spellings ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "key", "values", "suggested"),
    [
        (DEV, "multislice:elastic", {"min_slices": 1}, "minSlices"),
        (DEV, "multislice:elastic", {"min_slices": 1, "minSlices": 1}, "minSlices"),
        (DEV, "multislice:network", {"iap_ssh": True}, "iapSsh"),
        (DEV, "multislice:bucket", {"force_destroy": True}, "forceDestroy"),
        (DEV, "multislice:queuedResource", {"wait_for": "ACTIVE"}, "waitFor"),
        (on_backend("compute-engine"), "multislice:computeEngine", {"max_run_duration": "3d"}, "maxRunDuration"),
        (GKE, "multislice:gke", {"deletion_protection": True}, "deletionProtection"),
        (GKE, "multislice:gke", {"systemPool": {"machine_type": "e2-standard-8"}}, "machineType"),
    ],
    ids=["alone", "beside-camel", "network", "bucket", "queued-resource", "compute-engine", "gke", "system-pool"],
)
def test_a_snake_case_spelling_is_refused_naming_the_camel_case_key(tmp_path, config, key, values, suggested):
    snake = next(k for k in (values.get("systemPool") or values) if "_" in k)
    where = f"{key}.systemPool" if "systemPool" in values else key
    assert refusal(tmp_path, config | {key: values}) == (f"{where}.{snake}: unknown key (did you mean {suggested!r}?)")


# 9. reservation paths, per backend ------------------------------------------------------------------------

CE_RESERVED = on_backend("compute-engine", "reserved")
GKE_RESERVED = on_backend("gke", "reserved")
NAMED = "a reservation name (lowercase letters, digits, hyphens)"


def reservation(config: dict[str, Any], value: str) -> dict[str, Any]:
    return config | {"multislice:reservationName": value}


def test_a_reservations_resource_path_on_compute_engine_names_the_form_it_takes(tmp_path):
    project, zone = CE_RESERVED["gcp:project"], CE_RESERVED["gcp:zone"]
    path = f"projects/{project}/zones/{zone}/reservations/r"
    assert refusal(tmp_path, reservation(CE_RESERVED, path)) == (
        f"multislice:reservationName: {path!r} is the reservation's resource path; the compute-engine backend takes "
        f"{NAMED} or a projects/<project>/reservations/<name> path (Compute Engine's reservationAffinity form); it "
        "also reads the Cloud TPU API's projects/<project>/locations/<zone>/reservations/<name>: write "
        f"projects/{project}/reservations/r"
    )


@pytest.mark.parametrize("config", [CE_RESERVED, GKE_RESERVED], ids=["compute-engine", "gke"])
def test_compute_engines_reservation_form_is_read(tmp_path, config):
    path = f"projects/{config['gcp:project']}/reservations/r"
    assert read(tmp_path, reservation(config, path)).reservation_name == path


@pytest.mark.parametrize("config", [CE_RESERVED, GKE_RESERVED], ids=["compute-engine", "gke"])
def test_a_compute_engine_path_of_another_project_is_refused(tmp_path, config):
    line = refusal(tmp_path, reservation(config, "projects/other-project/reservations/r"))
    assert line == (
        "multislice:reservationName: 'projects/other-project/reservations/r' names projects/other-project, but the "
        f"stack's VMs are in project {config['gcp:project']!r}, zone {config['gcp:zone']!r} (gcp:project, "
        "gcp:zone): name a reservation there, or give its name alone"
    )


def test_the_cloud_tpu_path_on_gke_names_the_path_gke_takes(tmp_path):
    project, zone = GKE_RESERVED["gcp:project"], GKE_RESERVED["gcp:zone"]
    path = f"projects/{project}/locations/{zone}/reservations/r"
    assert refusal(tmp_path, reservation(GKE_RESERVED, path)) == (
        f"multislice:reservationName: {path!r} is the Cloud TPU API's path, which the gke backend does not send; it "
        f"takes {NAMED} or a projects/<project>/reservations/<name> path (Compute Engine's reservationAffinity "
        f"form): write projects/{project}/reservations/r"
    )


def test_the_queued_resource_backend_still_takes_the_tpu_apis_only_form(tmp_path):
    reserved = DEV | {"multislice:capacity": "reserved"}
    project, zone = reserved["gcp:project"], reserved["gcp:zone"]
    takes = f"{NAMED} or a projects/<project>/locations/<zone>/reservations/<name> path (the TPU API's only form)"
    path = f"projects/{project}/reservations/r"
    assert refusal(tmp_path, reservation(reserved, path)) == (
        f"multislice:reservationName: {path!r} is Compute Engine's reservationAffinity path, which the "
        f"queued-resource backend does not send; it takes {takes}: write "
        f"projects/{project}/locations/{zone}/reservations/r"
    )
    zonal = f"projects/{project}/zones/{zone}/reservations/r"
    assert refusal(tmp_path, reservation(reserved, zonal)) == (
        f"multislice:reservationName: {zonal!r} is the reservation's resource path; the queued-resource backend "
        f"takes {takes}: write projects/{project}/locations/{zone}/reservations/r"
    )
    assert refusal(tmp_path, reservation(reserved, "folders/7/r")) == (
        f"multislice:reservationName: 'folders/7/r' is not {takes}"
    )

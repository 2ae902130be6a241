"""``multislice:backend`` in a stack: which generations, zones and keys each backend takes.

Every refusal is one line naming the key, raised while the stack is read (before any resource).
Expected wording and zone lists are written out here from docs/compute-engine.md section 1.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from infra.config import StackConfig, StackConfigError, validate_stack
from tests.fakes.pulumi_program import evaluate

STACKS = Path(__file__).resolve().parents[2] / "stacks"


def dev_map() -> dict:
    return copy.deepcopy(yaml.safe_load((STACKS / "Pulumi.dev.yaml").read_text())["config"])


def ce_map() -> dict:
    """dev (2 slices of 4 chips, spot) on Compute Engine: tpu7x-8 is 4 chips like v4-8."""
    return dev_map() | {
        "multislice:backend": "compute-engine",
        "gcp:zone": "us-central1-c",
        "multislice:acceleratorType": "tpu7x-8",
    }


def errors_of(config: dict) -> list[str]:
    with pytest.raises(StackConfigError) as info:
        validate_stack("t", config, "test")
    return info.value.lines


def test_a_compute_engine_stack_is_valid_with_several_slices():
    config = validate_stack("t", ce_map(), "test")
    assert (config.backend, config.slices, config.accelerator.machine_type) == (
        "compute-engine",
        2,
        "tpu7x-standard-4t",
    )
    assert config.catalog_warnings == []
    assert config.delete_on_complete is False  # not built on compute-engine (spot would default it on)
    assert validate_stack("t", dev_map(), "test").delete_on_complete is True  # queued-resource: unchanged


@pytest.mark.parametrize(
    ("accelerator", "zone", "offered_by", "not_by"),
    [
        # "The Cloud TPU API is not supported on TPU7x and later TPU versions".
        ("tpu7x-8", "us-central1-c", "compute-engine and gke backends", "queued-resource"),
        # "Compute Engine supports the following TPU versions: TPU7x, TPU v6e, TPU v5p".
        ("v4-8", "us-central2-b", "queued-resource and gke backends", "compute-engine"),
        ("v5litepod-4", "us-west4-a", "queued-resource and gke backends", "compute-engine"),
    ],
)
def test_a_generation_the_backend_does_not_offer_is_refused_naming_both(accelerator, zone, offered_by, not_by):
    config = dev_map() | {"multislice:acceleratorType": accelerator, "gcp:zone": zone, "multislice:backend": not_by}
    if accelerator != "v4-8":
        config["multislice:training"]["parallelism"] = {"ici": {"fsdp": 4}, "dcn": {"data": 2}}
    (line,) = errors_of(config)
    assert line.startswith(f"multislice:acceleratorType: {accelerator} is offered by the {offered_by}, ")
    assert f"not by {not_by}" in line
    assert line.endswith(f"set multislice:backend: {offered_by.split()[0]}")


@pytest.mark.parametrize(("accelerator", "ici"), [("v5p-8", 4), ("v6e-8", 8), ("v6e-16", 16)])
def test_generations_on_both_backends_are_accepted_on_either(accelerator, ici):
    training = dev_map()["multislice:training"] | {
        "parallelism": {"ici": {"fsdp": ici}, "dcn": {"data": 2}},
        "global_batch_size": 64,
    }
    for backend in ("queued-resource", "compute-engine"):
        config = dev_map() | {
            "multislice:acceleratorType": accelerator,
            "gcp:zone": "us-east5-a",  # v5p and v6e on both (regions-zones page, North America)
            "multislice:backend": backend,
            "multislice:training": training,
        }
        assert validate_stack("t", config, "test").backend == backend


def test_the_zone_is_checked_against_compute_engine_zones():
    (line,) = errors_of(ce_map() | {"gcp:zone": "us-east5-a"})
    assert line == (
        "gcp:zone: us-east5-a does not offer TPU tpu7x (tpu7x-8) on Compute Engine; zones that do: us-central1-c, "
        "us-central1-ai1a (https://docs.cloud.google.com/tpu/docs/regions-zones); us-east5-a offers v5p, v6e; if "
        "Compute Engine offers it now, add 'multislice:allowUnlisted: [zone]' to the stack"
    )
    # v6e's Cloud TPU API zone europe-west4-a is not a Compute Engine zone of the catalog.
    v6e = ce_map() | {"multislice:acceleratorType": "v6e-4", "gcp:zone": "europe-west4-a"}
    (line,) = errors_of(v6e)
    assert line.startswith("gcp:zone: europe-west4-a does not offer TPU v6e (v6e-4) on Compute Engine; zones that do: ")
    assert validate_stack("t", v6e | {"multislice:backend": "queued-resource"}, "test").zone == "europe-west4-a"


def test_allow_unlisted_relaxes_the_compute_engine_zone_into_a_warning():
    config = validate_stack("t", ce_map() | {"gcp:zone": "us-east5-a", "multislice:allowUnlisted": ["zone"]}, "test")
    assert config.catalog_warnings == [
        "gcp:zone us-east5-a is not in the catalog's zones for TPU tpu7x on Compute Engine (us-central1-c, "
        "us-central1-ai1a); no action needed: multislice:allowUnlisted lets it through"
    ]


def test_runtime_version_is_refused_on_compute_engine():
    (line,) = errors_of(ce_map() | {"multislice:runtimeVersion": "v2-alpha-tpuv6e"})
    assert line.startswith("multislice:runtimeVersion: configures the TPU software version a queued resource boots")
    assert "compute-engine VMs boot an image" in line


@pytest.mark.parametrize(
    "settings",
    [
        {"waitFor": "PROVISIONING"},
        {"createTimeout": "1h"},
        {"deleteTimeout": "30m"},
        {"validUntil": "6h"},
        {"deleteOnComplete": True},
        {"deleteOnComplete": False},
        {"releaseOnComplete": True},
    ],
)
def test_every_queued_resource_key_is_refused_on_compute_engine(settings):
    (line,) = errors_of(ce_map() | {"multislice:queuedResource": settings})
    (key,) = settings
    assert line.startswith(
        f"multislice:queuedResource: configures the queued resource of the queued-resource backend ({key})"
    )
    assert "this stack's multislice:backend is compute-engine" in line


def test_compute_engine_settings_are_refused_on_the_queued_resource_backend():
    (line,) = errors_of(dev_map() | {"multislice:computeEngine": {"maxRunDuration": "1d"}})
    assert line == (
        "multislice:computeEngine: configures the compute-engine backend; this stack's multislice:backend is "
        "queued-resource"
    )
    assert validate_stack("t", ce_map() | {"multislice:computeEngine": {"maxRunDuration": "1d"}}, "test")


@pytest.mark.parametrize("stack_map", [dev_map, ce_map])
def test_a_validated_stack_dumped_and_read_again_is_the_same(stack_map):
    """The planner validates variants of a stack from its full dump (every key, defaults included):
    a key at its default configures nothing and is not refused on either backend."""
    config = validate_stack("t", stack_map(), "test")
    again = StackConfig.model_validate(config.model_dump(by_alias=True))
    assert again == config


def test_flex_start_needs_compute_engine_and_a_run_duration():
    (line,) = errors_of(dev_map() | {"multislice:capacity": "flex-start"})
    assert line.startswith("multislice:capacity: flex-start is offered by the compute-engine or gke backend only")
    (line,) = errors_of(ce_map() | {"multislice:capacity": "flex-start"})
    assert line.startswith("multislice:computeEngine.maxRunDuration: required with multislice:capacity flex-start")
    config = validate_stack(
        "t",
        ce_map() | {"multislice:capacity": "flex-start", "multislice:computeEngine": {"maxRunDuration": "3d"}},
        "test",
    )
    assert config.compute_engine.max_run_duration == 3 * 24 * 3600


def test_allow_backend_change_is_a_boolean_key_off_by_default():
    assert validate_stack("t", dev_map(), "test").allow_backend_change is False
    assert validate_stack("t", ce_map() | {"multislice:allowBackendChange": True}, "test").allow_backend_change
    (line,) = errors_of(dev_map() | {"multislice:allowBackendChange": "maybe"})
    assert line.startswith("multislice:allowBackendChange: ")


def test_effective_runtime_version_has_none_for_tpu7x():
    config = validate_stack("t", ce_map(), "test")
    with pytest.raises(ValueError, match="tpu7x-8 has no TPU software version"):
        _ = config.effective_runtime_version


def test_a_backend_refusal_stops_the_program_before_any_resource():
    with pytest.raises(StackConfigError) as err:
        evaluate("dev", ce_map() | {"multislice:backend": "queued-resource"})
    assert [line.split(":")[1] for line in err.value.lines] == ["acceleratorType"]

"""StackConfig / TrainConfig: every validation rule, with its error text, and the two read paths."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from infra import accelerators, config as config_mod
from infra.config import (
    StackConfigError,
    available_stacks,
    from_pulumi_config,
    load_stack,
    load_stack_file,
    validate_stack,
)
from tests.fakes.pulumi_program import engine_config
from training.config import TrainConfig, load_train_config

STACKS = Path(__file__).resolve().parents[2] / "stacks"


def dev_map() -> dict:
    return copy.deepcopy(yaml.safe_load((STACKS / "Pulumi.dev.yaml").read_text())["config"])


def errors_of(config: dict, stack: str = "t") -> list[str]:
    with pytest.raises(StackConfigError) as info:
        validate_stack(stack, config, "test")
    return info.value.lines


@pytest.mark.parametrize("stack", ["dev", "staging", "prod"])
def test_shipped_stacks_are_valid_and_both_read_paths_agree(stack):
    from_yaml = load_stack(stack, STACKS)
    raw = yaml.safe_load((STACKS / f"Pulumi.{stack}.yaml").read_text())["config"]
    from_engine = from_pulumi_config(stack, engine_config(raw))
    assert from_yaml == from_engine
    assert from_yaml.stack == stack


def test_dev_stack_is_the_cheapest_real_multislice():
    dev = load_stack("dev", STACKS)
    assert (dev.accelerator_type, dev.slices, dev.capacity) == ("v4-8", 2, "spot")
    assert dev.effective_runtime_version == accelerators.GENERATIONS["v4"].default_runtime_version


def test_available_stacks_lists_the_shipped_ones():
    assert {"dev", "staging", "prod"} <= set(available_stacks(STACKS))


def test_unknown_top_level_key_is_rejected_with_the_nearest_or_the_allowed_keys():
    config = dev_map() | {"multislice:slice": 2}
    (line,) = errors_of(config)
    assert line == "multislice:slice: unknown key (did you mean multislice:slices?)"
    (line,) = errors_of(dev_map() | {"multislice:xyzzy": 2})
    assert line.startswith("multislice:xyzzy: unknown key; allowed keys: multislice:acceleratorType, ")
    assert "multislice:slices" in line


def test_keys_without_namespace_belong_to_the_project():
    config = dev_map()
    config["slices"] = config.pop("multislice:slices")
    assert validate_stack("t", config, "test").slices == 2


def test_other_gcp_keys_and_namespaces_are_left_alone():
    config = dev_map() | {"gcp:impersonateServiceAccount": "x@y.iam.gserviceaccount.com", "pulumi:tags": {"a": 1}}
    assert validate_stack("t", config, "test").project == "acme-ml-dev"


def test_unknown_nested_training_key_names_its_path():
    config = dev_map()
    config["multislice:training"]["model"]["dmodel"] = 3
    (line,) = errors_of(config)
    assert line == "multislice:training.model.dmodel: unknown key (did you mean 'd_model'?)"


def test_unknown_accelerator_type_lists_allowed_values():
    config = dev_map() | {"multislice:acceleratorType": "v4-7"}
    (line,) = errors_of(config)
    assert line.startswith("multislice:acceleratorType: ")
    assert "v4-{8,16,32" in line


@pytest.mark.parametrize("slices", [0, 257])
def test_slices_between_1_and_256(slices):
    config = dev_map() | {"multislice:slices": slices}
    config["multislice:training"]["parallelism"]["dcn"] = {"data": 1}
    lines = errors_of(config)
    assert lines[0].startswith("multislice:slices: Input should be")
    assert ("1" if slices == 0 else "256") in lines[0]


def test_multislice_only_where_the_generation_supports_it(monkeypatch):
    real = accelerators.parse_accelerator_type

    def no_multislice(name):
        acc = real(name)
        return dataclasses.replace(acc, generation=dataclasses.replace(acc.generation, supports_multislice=False))

    monkeypatch.setattr(accelerators, "parse_accelerator_type", no_multislice)
    (line,) = errors_of(dev_map())
    assert line == "multislice:slices: Multislice needs TPU v4 or later; v4-8 allows only 1 slice"


def test_ici_product_must_equal_chips_per_slice():
    config = dev_map()
    config["multislice:training"]["parallelism"]["ici"] = {"fsdp": 8}
    config["multislice:training"]["global_batch_size"] = 32
    (line,) = errors_of(config)
    assert line == (
        "multislice:training.parallelism.ici: data×fsdp×tensor = 1×8×1 = 8 must equal the chips per slice of v4-8: 4"
    )


def test_dcn_product_must_equal_slices():
    config = dev_map()
    config["multislice:training"]["parallelism"]["dcn"] = {"data": 1}
    (line,) = errors_of(config)
    assert line == "multislice:training.parallelism.dcn: data×fsdp×tensor = 1×1×1 = 1 must equal multislice:slices: 2"


def test_dcn_tensor_must_be_1():
    config = dev_map()
    config["multislice:training"]["parallelism"]["dcn"] = {"data": 1, "tensor": 2}
    (line,) = errors_of(config)
    assert line.startswith("multislice:training.parallelism.dcn.tensor: must be 1")


def test_global_batch_divisible_by_data_parallel_size():
    config = dev_map()
    config["multislice:training"]["global_batch_size"] = 12  # data-parallel size is 2 × 4 = 8
    (line,) = errors_of(config)
    assert line.startswith("multislice:training.global_batch_size: 12 is not divisible by the data-parallel size 8")


def test_reservation_name_needs_reserved_capacity():
    config = dev_map() | {"multislice:reservationName": "my-reservation"}
    (line,) = errors_of(config)
    assert line.startswith("multislice:reservationName: is only used with multislice:capacity 'reserved'")


@pytest.mark.parametrize("backend", ["queued-resource", "compute-engine"])
@pytest.mark.parametrize(
    ("path", "names"),
    [
        ("projects/other-project/locations/{zone}/reservations/r", "projects/other-project in {zone}"),
        ("projects/{project}/locations/us-east1-d/reservations/r", "projects/{project} in us-east1-d"),
    ],
)
def test_a_reservation_path_elsewhere_than_the_stack_is_refused_not_cut(backend, path, names):
    """Each backend would send the path (queued resource) or its last segment (Compute Engine's
    affinity) for the stack's own project and zone: another one is refused before any resource."""
    from tests.helpers.compute_engine import ce_map

    base = dev_map() if backend == "queued-resource" else ce_map("v5p-16")
    project, zone = base["gcp:project"], base["gcp:zone"]
    config = base | {
        "multislice:capacity": "reserved",
        "multislice:reservationName": path.format(zone=zone, project=project),
    }
    (line,) = errors_of(config)
    assert line.startswith(f"multislice:reservationName: '{path.format(zone=zone, project=project)}' names ")
    assert names.format(zone=zone, project=project) in line and f"zone {zone!r}" in line
    same = base | {
        "multislice:capacity": "reserved",
        "multislice:reservationName": f"projects/{project}/locations/{zone}/reservations/r",
    }
    assert validate_stack("t", same, "test").reservation_name == same["multislice:reservationName"]
    (line,) = errors_of(base | {"multislice:capacity": "reserved", "multislice:reservationName": "folders/7/r"})
    assert "is not a reservation name" in line and "projects/<project>/locations/<zone>/reservations/<name>" in line


def test_capacity_lists_allowed_values():
    config = dev_map() | {"multislice:capacity": "cheap"}
    (line,) = errors_of(config)
    assert line == "multislice:capacity: got 'cheap'; allowed: 'spot', 'on-demand', 'reserved' or 'flex-start'"


def test_best_effort_capacity_is_refused_by_validation_not_at_preview(tmp_path):
    # The tpu_v2 API has no best-effort tier (only v2alpha1 does); Spot supersedes it.
    config = dev_map() | {"multislice:capacity": "best-effort"}
    (line,) = errors_of(config)
    assert line.startswith("multislice:capacity: got 'best-effort'; the tpu_v2 API has no best-effort tier")
    assert line.endswith("allowed: spot, on-demand, reserved, flex-start")
    assert config_mod.CAPACITY_TYPES == ("spot", "on-demand", "reserved", "flex-start")
    path = tmp_path / "Pulumi.be.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    with pytest.raises(StackConfigError) as info:
        load_stack_file(path)
    assert info.value.lines == [line]
    with pytest.raises(StackConfigError) as info:
        from_pulumi_config("be", engine_config(config))
    assert info.value.lines == [line]


@pytest.mark.parametrize("capacity", ["spot", "on-demand"])
def test_every_capacity_type_validates(capacity):
    assert validate_stack("t", dev_map() | {"multislice:capacity": capacity}, "test").capacity == capacity


@pytest.mark.parametrize("key", ["gcp:project", "gcp:zone", "multislice:acceleratorType"])
def test_required_keys(key):
    config = dev_map()
    del config[key]
    assert f"{key}: required key is missing" in errors_of(config)


def test_zone_format():
    config = dev_map() | {"gcp:zone": "us-central2"}
    (line,) = errors_of(config)
    assert line.startswith("gcp:zone: 'us-central2' is not a zone name")


def test_several_problems_are_reported_together():
    config = dev_map() | {"multislice:bogus": 1, "multislice:other": 2}
    lines = errors_of(config)
    assert [line.split(":")[1] for line in lines] == ["bogus", "other"]


def test_tensor_parallelism_must_divide_heads():
    config = dev_map()
    config["multislice:training"]["model"]["n_heads"] = 2
    config["multislice:training"]["parallelism"]["ici"] = {"fsdp": 1, "tensor": 4}
    config["multislice:training"]["global_batch_size"] = 16
    (line,) = errors_of(config)
    assert line == "multislice:training.model.n_heads: 2 is not divisible by the tensor mesh axis size 4"


def test_missing_stack_names_the_known_stacks(tmp_path):
    (tmp_path / "Pulumi.a.yaml").write_text("config: {}\n")
    with pytest.raises(StackConfigError, match=r"no stack 'b': .*Pulumi.b.yaml does not exist; stacks here: a"):
        load_stack("b", tmp_path)


def test_malformed_yaml_is_one_clear_error(tmp_path):
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text("config:\n  gcp:project: [unclosed\n")
    with pytest.raises(StackConfigError, match=r"is not valid YAML"):
        load_stack_file(path)


def test_duplicate_keys_are_refused_with_both_lines(tmp_path):
    # Pulumi's YAML reader (go-yaml v3) rejects a repeated key; PyYAML alone keeps the last one.
    path = tmp_path / "Pulumi.dup.yaml"
    text = (STACKS / "Pulumi.dev.yaml").read_text() + "  multislice:slices: 3\n"
    path.write_text(text)
    first = next(n for n, line in enumerate(text.splitlines(), 1) if line.startswith("  multislice:slices:"))
    with pytest.raises(StackConfigError) as info:
        load_stack_file(path)
    last = len(text.splitlines())
    assert (
        str(info.value) == f"stack file {path}: duplicate key 'multislice:slices' at line {last} "
        f"(first at line {first}); keep one of them"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("a: {x: 1, x: 2}\n", "duplicate key 'x' at line 1 (first at line 1)"),  # flow style, one line
        ("s: [{x: 1, x: 2}]\n", "duplicate key 'x' at line 1 (first at line 1)"),
        ("k: &k x\nm:\n  x: 1\n  *k : 2\n", "duplicate key 'x' at line 4 (first at line 3)"),  # alias key
        ("b: &b {x: 1, x: 2}\nc:\n  <<: *b\n", "duplicate key 'x' at line 1 (first at line 1)"),
        ("1: a\ntrue: b\n", "duplicate key 'true' at line 2 (same as '1' at line 1)"),  # one dict key
    ],
)
def test_every_spelling_of_a_repeated_key_is_caught(tmp_path, text, message):
    path = tmp_path / "Pulumi.dup.yaml"
    path.write_text(text)
    with pytest.raises(StackConfigError) as info:
        load_stack_file(path)
    assert str(info.value) == f"stack file {path}: {message}; keep one of them"


def test_merge_key_overrides_are_not_duplicates(tmp_path):
    path = tmp_path / "Pulumi.merge.yaml"
    path.write_text(
        "config:\n  gcp:project: p-123456\n  gcp:zone: us-central2-b\n  multislice:acceleratorType: v4-8\n"
        "  multislice:training:\n    parallelism: {ici: {fsdp: 4}}\n"
        "    model: {<<: {d_model: 64, n_heads: 2}, n_heads: 4}\n"
    )
    config = load_stack_file(path)
    assert (config.training.model.d_model, config.training.model.n_heads) == (64, 4)


@pytest.mark.parametrize(
    "change, key",
    [
        ({"multislice:slices": True}, "multislice:slices"),
        ({"multislice:network": {"mtu": False}}, "multislice:network.mtu"),
        ({"multislice:training": {"steps": True}}, "multislice:training.steps"),
        (
            {"multislice:training": {"optimizer": {"peak_learning_rate": True}}},
            "multislice:training.optimizer.peak_learning_rate",
        ),
        ({"multislice:training": {"model": {"d_ff": False}}}, "multislice:training.model.d_ff"),
    ],
)
def test_booleans_are_not_numbers(change, key):
    (line,) = errors_of(dev_map() | change)
    assert line.startswith(f"{key}: got ") and line.endswith("expected a number, not a boolean"), line


def test_boolean_fields_still_take_booleans():
    config = validate_stack("t", dev_map() | {"multislice:bucket": {"forceDestroy": True}}, "test")
    assert config.bucket.force_destroy is True


def test_secret_values_are_refused(tmp_path):
    config = dev_map() | {"multislice:runtimeVersion": {"secure": "AAAbase64"}}
    (line,) = errors_of(config)
    assert line.startswith("multislice:runtimeVersion: secret values are not supported")


def test_training_object_from_engine_must_be_json():
    config = engine_config(dev_map())
    config["multislice:training"] = "{not json"
    (line,) = errors_of(config)
    assert line.startswith("multislice:training: not a JSON object")


def test_train_config_json_round_trip_and_errors():
    dev = load_stack("dev", STACKS).training
    assert load_train_config(dev.model_dump_json()) == dev
    with pytest.raises(ValueError, match=r"sequence_length: Input should be greater than or equal to 8"):
        load_train_config({"sequence_length": 0})
    assert TrainConfig().global_batch_tokens == 32 * 256


def test_config_module_reads_defaults_from_catalog(monkeypatch):
    dev = load_stack("dev", STACKS)
    assert dev.region == "us-central2"
    assert config_mod.StackConfig.model_fields["slices"].alias == "multislice:slices"
    assert dev.runtime_version is None  # dev takes the catalog's runtime version
    real = accelerators.parse_accelerator_type

    def other_default(name):
        acc = real(name)
        return dataclasses.replace(acc, generation=dataclasses.replace(acc.generation, default_runtime_version="tpu-x"))

    monkeypatch.setattr(accelerators, "parse_accelerator_type", other_default)
    assert dev.effective_runtime_version == "tpu-x"
    assert dev.model_copy(update={"runtime_version": "mine"}).effective_runtime_version == "mine"


@pytest.mark.parametrize("name", [".", "..", "-x", "a/b", ""])
def test_run_and_stack_names_cannot_point_outside_their_directory(name):
    (line,) = errors_of(dev_map() | {"multislice:runName": name})
    assert line.startswith(f"multislice:runName: {name!r} must start with a letter or digit")
    with pytest.raises(StackConfigError, match=r"stack: .* must start with a letter or digit"):
        validate_stack(name, dev_map(), "test")


def test_namespace_typo_is_caught():
    config = dev_map()
    config["multislce:slices"] = config.pop("multislice:slices")
    lines = errors_of(config)
    assert "multislce:slices: unknown namespace (did you mean multislice:slices?)" in lines


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_non_finite_numbers_are_rejected(value):
    config = dev_map()
    config["multislice:training"]["optimizer"]["peak_learning_rate"] = value
    (line,) = errors_of(config)
    assert line == "multislice:training.optimizer.peak_learning_rate: Input should be a finite number"


def test_unreadable_stack_files(tmp_path):
    binary = tmp_path / "Pulumi.bin.yaml"
    binary.write_bytes(b"config:\n  gcp:project: \xff\xfe\n")
    with pytest.raises(StackConfigError, match="is not UTF-8 text"):
        load_stack_file(binary)
    deep = tmp_path / "Pulumi.deep.yaml"
    deep.write_text("config: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(StackConfigError, match="nests too deeply to be a stack file"):
        load_stack_file(deep)
    with pytest.raises(StackConfigError, match="is a directory"):
        load_stack_file(tmp_path)


def test_stacks_dir_discovery(tmp_path, monkeypatch):
    monkeypatch.delenv("MULTISLICE_STACKS_DIR", raising=False)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(outside)
    # No multislice Pulumi.yaml above the working directory: the checkout's own stacks/.
    assert config_mod.default_stacks_dir() == STACKS
    project = tmp_path / "proj"
    (project / "deep" / "er").mkdir(parents=True)
    (project / "Pulumi.yaml").write_text("name: multislice\nstackConfigDir: cfg\n")
    monkeypatch.chdir(project / "deep" / "er")
    assert config_mod.default_stacks_dir() == project / "cfg"
    (project / "deep" / "Pulumi.yaml").write_text("name: another-project\n")
    assert config_mod.default_stacks_dir() == project / "cfg"  # other projects' files are passed over
    monkeypatch.setenv("MULTISLICE_STACKS_DIR", str(tmp_path / "env"))
    assert config_mod.default_stacks_dir() == tmp_path / "env"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,  # nested past the parser: a RecursionError, were it not bounded
        "name: multislice\nstackConfigDir: cfg\n" + "#" * (1 << 20),  # over the stack file's 1 MiB
        "- name: multislice\n",  # a list, not a project
        "name: multislice\nname: again\n",  # a repeated key, as a stack file may not have
    ],
    ids=["nested", "oversized", "a-list", "repeated-key"],
)
def test_a_pulumi_yaml_above_past_the_stack_files_bounds_is_passed_over(tmp_path, monkeypatch, text):
    monkeypatch.delenv("MULTISLICE_STACKS_DIR", raising=False)
    (tmp_path / "Pulumi.yaml").write_text("name: multislice\nstackConfigDir: outer\n")
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "Pulumi.yaml").write_text(text)
    monkeypatch.chdir(inner)
    assert config_mod.default_stacks_dir() == tmp_path / "outer"


def test_object_valued_keys_are_the_ones_the_engine_sends_as_json_text():
    assert set(config_mod.STRUCTURED_KEYS) == {
        "multislice:workload",  # optional (None: the trainer), still an object when set
        "multislice:training",
        "multislice:network",
        "multislice:bucket",
        "multislice:queuedResource",
        "multislice:computeEngine",
        "multislice:gke",
        "multislice:elastic",
        "multislice:labels",
        "multislice:allowUnlisted",
    }
    config = engine_config(
        dev_map()
        | {
            "multislice:labels": {"team": "ml"},
            "multislice:network": {"mtu": 1500},
            "multislice:allowUnlisted": ["runtimeVersion"],
        }
    )
    assert isinstance(config["multislice:labels"], str) and isinstance(config["multislice:allowUnlisted"], str)
    parsed = from_pulumi_config("dev", config)
    assert (parsed.labels, parsed.network.mtu, parsed.allow_unlisted) == ({"team": "ml"}, 1500, ("runtimeVersion",))


# The catalog: zones and runtime versions per generation (infra.accelerators) ----------------


def test_a_zone_that_does_not_offer_the_generation_is_refused_with_the_ones_that_do():
    (line,) = errors_of(dev_map() | {"gcp:zone": "us-east5-a"})
    v4 = accelerators.GENERATIONS["v4"]
    assert line.startswith(
        f"gcp:zone: us-east5-a does not offer TPU v4 (v4-8); zones that do: {', '.join(v4.zones)} "
        "(https://cloud.google.com/tpu/docs/regions-zones)"
    )
    assert "us-east5-a offers v5p, v6e" in line  # where that zone would work
    assert line.endswith("add 'multislice:allowUnlisted: [zone]' to the stack")


@pytest.mark.parametrize(
    "version", ["tpu ubuntu", "tpu-ubuntu2204-base; curl x | sh", "TPU-UBUNTU2204-BASE", "-x", "a" * 64]
)
def test_a_runtime_version_is_a_plain_name(version):
    # Even with the catalog check relaxed: nothing else can reach the TPU API.
    for extra in ({}, {"multislice:allowUnlisted": ["runtimeVersion"]}):
        (line,) = errors_of(dev_map() | {"multislice:runtimeVersion": version} | extra)
        assert line.startswith(f"multislice:runtimeVersion: {version!r} is not a TPU software version name")


def test_a_runtime_version_of_another_generation_is_refused():
    (line,) = errors_of(dev_map() | {"multislice:runtimeVersion": "v2-alpha-tpuv6e"})
    assert line.startswith(
        "multislice:runtimeVersion: 'v2-alpha-tpuv6e' is not a TPU software version for v4; known: tpu-ubuntu2204-base"
    )
    assert line.endswith("add 'multislice:allowUnlisted: [runtimeVersion]' to the stack")


def test_allow_unlisted_admits_a_new_zone_or_version_with_a_warning():
    config = validate_stack(
        "t",
        dev_map()
        | {
            "gcp:zone": "us-central2-a",
            "multislice:runtimeVersion": "tpu-ubuntu2404-base",
            "multislice:allowUnlisted": ["zone", "runtimeVersion"],
        },
        "test",
    )
    assert [w.split(" is not in")[0] for w in config.catalog_warnings] == [
        "gcp:zone us-central2-a",
        "multislice:runtimeVersion 'tpu-ubuntu2404-base'",
    ]
    assert validate_stack("t", dev_map(), "test").catalog_warnings == []
    (line,) = errors_of(dev_map() | {"multislice:allowUnlisted": ["acceleratorType"]})
    assert line.startswith("multislice:allowUnlisted.0: got 'acceleratorType'; allowed: 'zone' or 'runtimeVersion'")


def test_every_shipped_stack_runs_a_listed_zone_and_version():
    for stack in available_stacks(STACKS):
        config = load_stack(stack, STACKS)
        gen = config.accelerator.generation
        assert config.zone in gen.zones and config.effective_runtime_version in gen.runtime_versions, stack
        assert config.allow_unlisted == () and config.catalog_warnings == []


@pytest.mark.parametrize("zone", ["us-central1-ai1a", "us-south1-ai1b"])
def test_ai_zones_are_zone_names(zone):
    # The regions-zones page lists AI zones such as us-central1-ai1a (v6e).
    config = validate_stack("t", dev_map() | {"gcp:zone": zone, "multislice:allowUnlisted": ["zone"]}, "test")
    assert config.region == zone.rsplit("-", 1)[0]


@pytest.mark.parametrize("capacity, default", [("spot", True), ("on-demand", True), ("reserved", False)])
@pytest.mark.parametrize("value", [True, False])
def test_delete_on_complete_overrides_the_capacity_default(capacity, default, value):
    base = dev_map() | {"multislice:capacity": capacity}
    if capacity == "reserved":
        base["multislice:reservationName"] = "my-reservation"
    assert validate_stack("t", base, "test").delete_on_complete is default
    config = validate_stack("t", base | {"multislice:queuedResource": {"deleteOnComplete": value}}, "test")
    assert config.delete_on_complete is value and config.deprecation_warnings == []


@pytest.mark.parametrize("value", [True, False])
def test_release_on_complete_is_a_deprecated_alias_of_delete_on_complete(tmp_path, value):
    # The key's name before "release" came to mean a software release only: same meaning, one
    # warning naming the new key, on both read paths.
    former = dev_map() | {"multislice:queuedResource": {"releaseOnComplete": value}}
    current = dev_map() | {"multislice:queuedResource": {"deleteOnComplete": value}}
    config = validate_stack("t", former, "test")
    assert config.delete_on_complete is value is validate_stack("t", current, "test").delete_on_complete
    (warning,) = config.deprecation_warnings
    assert warning == (
        "multislice:queuedResource.releaseOnComplete is deprecated (multislice:queuedResource.deleteOnComplete "
        "has the same meaning); action needed: rename it to multislice:queuedResource.deleteOnComplete"
    )
    path = tmp_path / "Pulumi.t.yaml"
    path.write_text(yaml.safe_dump({"config": former}))
    assert load_stack_file(path) == from_pulumi_config("t", engine_config(former)) == config


def test_release_on_complete_and_delete_on_complete_together_are_refused():
    both = dev_map() | {"multislice:queuedResource": {"releaseOnComplete": True, "deleteOnComplete": False}}
    (line,) = errors_of(both)
    assert line.startswith("multislice:queuedResource.releaseOnComplete: ")
    assert "both releaseOnComplete and deleteOnComplete are set: keep only deleteOnComplete" in line
    with pytest.raises(StackConfigError) as info:
        from_pulumi_config("t", engine_config(both))
    assert info.value.lines == [line]

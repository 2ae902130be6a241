"""``multislice:elastic``: the slice counts a run may train on (infra/config/elastic.py), refused
where the training cannot stay the same, and printed by ``plan`` with each count's accumulation
factor and tokens/s ceiling (infra/planner/elastic.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra import planner
from infra.cli import app
from infra.config import StackConfigError, elastic, validate_stack
from tests.helpers.gke import gke_map

STACKS = Path(__file__).resolve().parents[2] / "stacks"


def dev_map(**changes) -> dict:
    config = copy.deepcopy(yaml.safe_load((STACKS / "Pulumi.dev.yaml").read_text())["config"])
    return config | changes


def four_slices(dcn: dict, **elastic_settings) -> dict:
    """dev (v4-8: 4 chips, ici fsdp 4) as 4 slices with the DCN axes ``dcn``; global batch 16."""
    config = dev_map(**{"multislice:slices": 4})
    config["multislice:training"]["parallelism"]["dcn"] = {"data": 1, "fsdp": 1, "tensor": 1} | dcn
    if elastic_settings:
        config["multislice:elastic"] = elastic_settings
    return config


def errors_of(config: dict) -> list[str]:
    with pytest.raises(StackConfigError) as info:
        validate_stack("t", config, "test")
    return info.value.lines


def counts(config: dict) -> list[tuple[int, int, int]]:
    return [(c.slices, c.accumulation, c.microbatches) for c in elastic.allowed(validate_stack("t", config, "test"))]


def test_unset_the_run_trains_on_every_slice_only():
    assert counts(dev_map()) == [(2, 1, 1)]
    assert validate_stack("t", dev_map(), "test").deprecation_warnings == []


def test_the_counts_whose_factor_is_whole_and_divides_the_dcn_data_axis():
    # 4 slices as DCN data 4: 4, 2 and 1 slices take 1, 2 and 4 times the microbatches; 3 would take 4/3.
    assert counts(four_slices({"data": 4}, minSlices=1)) == [(4, 1, 1), (2, 2, 2), (1, 4, 4)]
    assert counts(four_slices({"data": 4}, minSlices=2)) == [(4, 1, 1), (2, 2, 2)]
    # DCN data 2 × fsdp 2: only the data axis shrinks, so 2 slices (data 1) and no fewer.
    assert counts(four_slices({"data": 2, "fsdp": 2}, minSlices=2)) == [(4, 1, 1), (2, 2, 2)]


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (four_slices({"data": 4}, minSlices=3), "3: 4 slices' work on 3 is 4/3 times the microbatches, not a whole"),
        (four_slices({"data": 2, "fsdp": 2}, minSlices=1), "the DCN data axis (2, multislice:training.parallelism"),
        (four_slices({"data": 4}, minSlices=5), "5 is above multislice:slices 4; use 1 to 4"),
        (four_slices({"data": 4}, minSlices=0), "greater than or equal to 1"),
        (four_slices({"data": 4}, minSlices=1, shrinkAfter="-5s"), "is not a duration"),
        (four_slices({"data": 4}, minSlices=1, growAfter="soon"), "is not a duration"),
        (four_slices({"data": 4}, minSlices=1, shrinkAfter=0), "the duration must be positive"),
        (four_slices({"data": 4}, minSlice=1), "unknown key (did you mean 'minSlices'?)"),
    ],
)
def test_a_count_the_run_cannot_train_on_is_one_line_naming_the_key(config, words):
    (line,) = errors_of(config)
    assert line.startswith("multislice:elastic."), line
    assert words in line, line


def test_the_refusal_lists_the_counts_that_are_allowed():
    (line,) = errors_of(four_slices({"data": 4}, minSlices=3))
    assert line.endswith("allowed counts: 4, 2, 1"), line


def test_plan_prints_each_count_with_its_factor_and_ceiling():
    config = validate_stack("t", four_slices({"data": 4}, minSlices=1, shrinkAfter="90s"), "test")
    plan = planner.plan(config)
    assert plan.elastic is not None
    peak = config.accelerator.generation.peak_bf16_flops_per_chip
    for count in plan.elastic.counts:  # 6N FLOPs per token at 100% MFU
        assert count.peak_tokens_per_s == pytest.approx(count.chips * peak / (6 * plan.parameters))
        assert count.chips == count.slices * 4
    assert [c.slices for c in plan.elastic.counts] == [4, 2, 1]
    assert (plan.elastic.shrink_after_s, plan.elastic.grow_after_s) == (90, 3 * 3600)
    as_json = json.loads(json.dumps(plan.to_json()))["elastic"]
    assert [c["accumulation"] for c in as_json["counts"]] == [1, 2, 4]


def test_plan_prints_the_counts_and_only_gke_says_elastic_is_not_carried_out(tmp_path):
    stack = tmp_path / "Pulumi.el.yaml"
    stack.write_text(yaml.safe_dump({"config": four_slices({"data": 4}, minSlices=2)}))
    result = CliRunner().invoke(app, ["plan", "--config-file", str(stack)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "multislice:elastic" not in result.stderr, result.stderr  # carried out on the queued resource
    said = " ".join(result.stdout.split())
    assert "slice counts (multislice:elastic): 4 slices: accumulation ×1 (1 microbatch)" in said
    assert "2 slices: accumulation ×2 (2 microbatches)" in said and "after 2m without a slice" in said
    assert "≥ 3h after the last change" in said and "not carried out" not in said
    on_gke = tmp_path / "Pulumi.elgke.yaml"
    on_gke.write_text(yaml.safe_dump({"config": gke_map(2, "spot", **{"multislice:elastic": {"minSlices": 1}})}))
    result = CliRunner().invoke(app, ["plan", "--config-file", str(on_gke)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "warning: multislice:elastic is checked and planned, not carried out on the gke backend yet" in result.stderr
    assert "(not carried out on this backend yet" in " ".join(result.stdout.split())


def test_a_workload_command_is_not_elastic():
    config = dev_map(**{"multislice:workload": {"command": ["python3", "train.py"], "steps": 10}})
    del config["multislice:training"]
    config["multislice:elastic"] = {"minSlices": 1}
    (line,) = errors_of(config)
    assert line.startswith("multislice:elastic.minSlices: 1: elastic slices are carried out by the bundled trainer")
    config["multislice:elastic"] = {"minSlices": 2}  # every slice: not elastic, allowed
    assert validate_stack("t", config, "test").elastic.min_slices == 2


def test_the_trainers_config_carries_min_slices_and_only_the_program_sets_it():
    from infra.startup.release import release_files

    config = validate_stack("t", four_slices({"data": 4}, minSlices=2), "test")
    root = Path(__file__).resolve().parents[2]
    files, _ = release_files(config, root)
    assert json.loads(files["config.json"])["min_slices"] == 2
    plain, _ = release_files(validate_stack("t", dev_map(), "test"), root)
    assert json.loads(plain["config.json"])["min_slices"] is None
    direct = dev_map()
    direct["multislice:training"]["min_slices"] = 1
    (line,) = errors_of(direct)
    assert line.startswith("multislice:training.min_slices: is the program's, filled from multislice:elastic")
    for field, key in (("shrink_after_s", "shrinkAfter"), ("grow_after_s", "growAfter")):
        direct = dev_map()
        direct["multislice:training"][field] = 7
        (line,) = errors_of(direct)
        assert line.startswith(f"multislice:training.{field}: is the program's, filled from multislice:elastic.{key}")


def test_the_trainers_config_carries_the_elastic_timings_in_seconds():
    from infra.startup.release import release_files

    config = validate_stack("t", four_slices({"data": 4}, minSlices=2, shrinkAfter="90s", growAfter="1h"), "test")
    files, _ = release_files(config, Path(__file__).resolve().parents[2])
    trainer = json.loads(files["config.json"])
    assert (trainer["shrink_after_s"], trainer["grow_after_s"]) == (90.0, 3600.0)

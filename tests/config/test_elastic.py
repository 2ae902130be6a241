"""``multislice:elastic``: the slice counts a run may train on (infra/config/elastic.py, by the
trainer's rule: every count whose global batch splits evenly, checked against the brute force of
tests/helpers/slice_counts.py), refused where the training cannot stay the same, and printed by
``plan`` with each count's microbatches and tokens/s ceiling (infra/planner/elastic.py)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra import planner
from infra.cli import app
from infra.config import StackConfigError, elastic, validate_stack
from tests.helpers.gke import gke_map
from tests.helpers.slice_counts import brute_force_counts

STACKS = Path(__file__).resolve().parents[2] / "stacks"


def dev_map(**changes) -> dict:
    config = copy.deepcopy(yaml.safe_load((STACKS / "Pulumi.dev.yaml").read_text())["config"])
    return config | changes


def four_slices(dcn: dict, *, batch: int = 16, **elastic_settings) -> dict:
    """dev (v4-8: 4 chips, ici fsdp 4) as as many slices as the DCN axes ``dcn`` make (4 unless
    told), global batch ``batch``."""
    axes = {"data": 1, "fsdp": 1, "tensor": 1} | dcn
    config = dev_map(**{"multislice:slices": axes["data"] * axes["fsdp"] * axes["tensor"]})
    config["multislice:training"]["parallelism"]["dcn"] = axes
    config["multislice:training"]["global_batch_size"] = batch
    if elastic_settings:
        config["multislice:elastic"] = elastic_settings
    return config


def errors_of(config: dict) -> list[str]:
    with pytest.raises(StackConfigError) as info:
        validate_stack("t", config, "test")
    return info.value.lines


def counts(config: dict) -> list[tuple[int, int, int, int]]:
    """``(slices, dcn data, microbatches, sequences of one replica's microbatch)`` of each allowed count,
    checked against the brute force; chips: 4 per slice."""
    stack = validate_stack("t", config, "test")
    allowed = elastic.allowed(stack)
    assert all(c.chips == 4 * c.slices for c in allowed)
    found = [(c.slices, c.dcn_data, c.microbatches, c.microbatch_rows) for c in allowed]
    assert found == brute_force_counts(stack.training, stack.elastic.min_slices or stack.slices)
    return found


def test_unset_the_run_trains_on_every_slice_only():
    assert counts(dev_map()) == [(2, 2, 1, 2)]
    assert validate_stack("t", dev_map(), "test").deprecation_warnings == []


def test_the_counts_that_divide_the_dcn_data_axis_are_as_before():
    # 4 slices as DCN data 4, 16 sequences: 16 replicas of 1 row; on 2 and 1 slices 2 and 4 microbatches
    # (the full count's × 4/n), a row each; 3 would make 12 replicas, which 16 rows do not split over.
    assert counts(four_slices({"data": 4}, minSlices=1)) == [(4, 4, 1, 1), (2, 2, 2, 1), (1, 1, 4, 1)]
    assert counts(four_slices({"data": 4}, minSlices=2)) == [(4, 4, 1, 1), (2, 2, 2, 1)]
    # DCN data 2 × fsdp 2: only the data axis shrinks, so 2 slices (data 1) and no fewer.
    assert counts(four_slices({"data": 2, "fsdp": 2}, minSlices=2)) == [(4, 2, 1, 1), (2, 1, 2, 1)]


def test_any_count_the_global_batch_splits_over():
    # 3 slices, 48 sequences: 12 replicas of 4 rows. Losing one leaves 2 slices (8 replicas of 6 rows, as
    # 2 microbatches of 3: no microbatch larger than the full count's 4), no longer 1.
    assert counts(four_slices({"data": 3}, batch=48, minSlices=1)) == [(3, 3, 1, 4), (2, 2, 2, 3), (1, 1, 3, 4)]
    # 4 slices, 48 sequences: 3 slices are 12 replicas of 4 rows, as 2 microbatches of 2 (≤ 3).
    assert counts(four_slices({"data": 4}, batch=48, minSlices=3)) == [(4, 4, 1, 3), (3, 3, 2, 2)]
    # DCN data 3 × fsdp 2 (6 slices): DCN fsdp keeps its 2, so 4 and 2 slices (DCN data 2 and 1).
    assert counts(four_slices({"data": 3, "fsdp": 2}, batch=48, minSlices=2)) == [
        (6, 3, 1, 2),
        (4, 2, 3, 1),
        (2, 1, 3, 2),
    ]


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (
            four_slices({"data": 4}, minSlices=3),
            "3: 4 slices cannot train as 3: multislice:training.global_batch_size 16 does not split over the "
            "data-parallel size 12 of 3 slices (dcn data 3 × dcn fsdp 1 × ici data 1 × ici fsdp 4)",
        ),
        (
            four_slices({"data": 2, "fsdp": 2}, minSlices=1),
            "1: 4 slices cannot train as 1: 1 is not a multiple of multislice:training.parallelism.dcn fsdp×tensor",
        ),
        (
            four_slices({"data": 3}, batch=36, minSlices=2),
            "2: 3 slices cannot train as 2: multislice:training.global_batch_size 36 does not split over the "
            "data-parallel size 8",
        ),
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
    (line,) = errors_of(four_slices({"data": 3}, batch=36, minSlices=2))
    assert line.endswith("allowed counts: 3, 1"), line
    (line,) = errors_of(four_slices({"data": 3, "fsdp": 2}, batch=48, minSlices=3))
    assert line.endswith("allowed counts: 6, 4, 2"), line


def test_the_stacks_checks_read_the_trainers_rule_without_jax():
    # infra/config/elastic.py calls training.elastic.count_shape: importing it must not import jax
    # (every CLI command validates a stack, most without the trainer).
    code = "import sys, infra.config, infra.planner; print('jax' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", result.stderr


def test_plan_prints_each_count_with_its_microbatches_and_ceiling():
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
    assert [(c["dcn_data"], c["microbatches"], c["microbatch_rows"]) for c in as_json["counts"]] == [
        (4, 1, 1),
        (2, 2, 1),
        (1, 4, 1),
    ]
    three = planner.plan(validate_stack("t", four_slices({"data": 3}, batch=48, minSlices=2), "test"))
    assert three.elastic is not None
    assert [(c.slices, c.microbatches, c.microbatch_rows) for c in three.elastic.counts] == [(3, 1, 4), (2, 2, 3)]


def test_plan_prints_the_counts_and_gke_refuses_elastic_in_one_line(tmp_path):
    stack = tmp_path / "Pulumi.el.yaml"
    stack.write_text(yaml.safe_dump({"config": four_slices({"data": 4}, minSlices=2)}))
    result = CliRunner().invoke(app, ["plan", "--config-file", str(stack)], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "multislice:elastic" not in result.stderr, result.stderr  # carried out on the queued resource
    said = " ".join(result.stdout.split())
    assert "slice counts (multislice:elastic): 4 slices (dcn data 4): 1 microbatch of 1 sequence per replica" in said
    assert "2 slices (dcn data 2): 2 microbatches of 1 sequence per replica" in said
    assert "after 2m without a slice" in said
    assert "≥ 3h after the last change" in said and "not carried out" not in said
    on_gke = tmp_path / "Pulumi.elgke.yaml"
    on_gke.write_text(yaml.safe_dump({"config": gke_map(2, "spot", **{"multislice:elastic": {"minSlices": 1}})}))
    result = CliRunner().invoke(app, ["plan", "--config-file", str(on_gke)], env={"COLUMNS": "250"})
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()[1:]  # under the stack's "is invalid:" line
    assert "multislice:elastic.minSlices: 1: elastic slices are not carried out on the gke backend" in line, line
    assert "spending maxRestarts at each change; unset minSlices" in line, line
    # Every slice as the minimum is no elastic run: the gke stack is read, the gate never runs in its Pods.
    on_gke.write_text(yaml.safe_dump({"config": gke_map(2, "spot", **{"multislice:elastic": {"minSlices": 2}})}))
    result = CliRunner().invoke(app, ["plan", "--config-file", str(on_gke)], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "multislice:elastic" not in result.stderr, result.output


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


def test_plan_says_why_a_stack_is_not_elastic():
    from infra.planner.elastic import describe

    unset = planner.plan(validate_stack("t", four_slices({"data": 4}), "test")).elastic
    every = planner.plan(validate_stack("t", four_slices({"data": 4}, minSlices=4), "test")).elastic
    assert unset is not None and every is not None
    assert describe(unset).endswith("(not elastic: multislice:elastic.minSlices is unset)")
    assert describe(every).endswith("(not elastic: multislice:elastic.minSlices is 4, every slice of the stack)")

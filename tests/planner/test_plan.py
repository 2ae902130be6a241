"""infra.planner: the plan of a stack, its ``--json`` document, and ``multislice plan``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra import planner
from infra.cli import app
from infra.config import load_stack
from tests.planner.stacks import STACKS, stack
from training.model import param_count


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_shipped_stacks_plan(name):
    config = load_stack(name, STACKS)
    p = planner.plan(config)
    assert p.chips == config.slices * config.accelerator.chips
    assert p.hosts == config.total_workers
    assert p.memory.fits
    assert p.dcn.tokens_per_replica == config.training.global_batch_tokens / config.training.parallelism.dcn.data
    assert p.recommendations[0].startswith("dcn tensor parallelism is 1")
    assert (len(planner.advisories(config)) > 0) == p.dcn.dcn_bound


def test_plan_describes_the_stack():
    config = stack("v4-16", slices=4, training={"global_batch_size": 64, "parallelism": {"ici": {"fsdp": 4, "tensor": 2}, "dcn": {"data": 2, "fsdp": 2}}})
    p = planner.plan(config)
    assert (p.stack, p.accelerator_type, p.generation) == ("t", "v4-16", "v4")
    assert (p.slices, p.chips_per_slice, p.chips, p.hosts_per_slice, p.hosts, p.chips_per_host) == (4, 8, 32, 2, 8, 4)
    assert p.mesh == {
        "data": {"dcn": 2, "ici": 1, "size": 2},
        "fsdp": {"dcn": 2, "ici": 4, "size": 8},
        "tensor": {"dcn": 1, "ici": 2, "size": 2},
    }
    assert p.parameters == param_count(config.training.model)
    assert (p.sequence_length, p.global_batch_size, p.global_batch_tokens) == (1024, 64, 64 * 1024)
    assert p.memory == planner.memory_per_chip(config.training, 32 * 2**30)
    assert p.dcn == planner.dcn_check(config.accelerator, config.training.parallelism, 64 * 1024)
    assert all(planner.MULTISLICE_OVERVIEW in p.sources[key] for key in ("arithmetic_intensity", "parallelism_guidance"))
    assert "arXiv:2205.05198" in p.sources["activations"]


# --- the command -----------------------------------------------------------------------------

runner = CliRunner()


def write_stack(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load((STACKS / "Pulumi.dev.yaml").read_text())
    config = copy.deepcopy(data["config"])
    edit(config)
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda c: c.update({"multislice:acceleratorType": "v4-12"}), "multislice:acceleratorType"),
        (lambda c: c["multislice:training"]["parallelism"]["ici"].update({"fsdp": 2}), "parallelism.ici"),
        (lambda c: c.update({"multislice:slices": 3}), "parallelism.dcn"),
        (lambda c: c["multislice:training"].update({"global_batch_size": 12}), "global_batch_size"),
        (lambda c: c["multislice:training"].update({"sequence_length": 0}), "sequence_length"),
        (lambda c: c["multislice:training"]["parallelism"]["ici"].update({"data": -1}), "parallelism.ici.data"),
        (lambda c: c.update({"multislice:slices": 0}), "multislice:slices"),
    ],
)
def test_cli_bad_stack_is_one_clear_error_naming_the_key(tmp_path, edit, key):
    result = runner.invoke(app, ["plan", "--config-file", str(write_stack(tmp_path, edit))])
    assert result.exit_code == 2
    assert "error:" in result.output and key in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not a crash


def test_cli_plan_json_has_the_documented_keys():
    result = runner.invoke(app, ["plan", "--stack", "staging", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key, kind in {
        "dcn_bound": bool,
        "min_batch_tokens": float,
        "operational_intensity": float,
        "arithmetic_intensity": float,
        "hbm_bytes_per_chip": int,
        "hbm_capacity_bytes": int,
        "fits_in_hbm": bool,
        "global_batch_tokens": int,
    }.items():
        assert isinstance(data[key], kind), key
    assert data["mesh"]["fsdp"] == {"dcn": 1, "ici": 16, "size": 16}
    assert (data["chips"], data["hosts"], data["slices"]) == (32, 8, 2)
    assert data["arithmetic_intensity"] == pytest.approx(22_000)


def test_cli_plan_human_output(tmp_path):
    result = runner.invoke(app, ["plan", "--config-file", str(STACKS / "Pulumi.dev.yaml")])
    assert result.exit_code == 0, result.output
    for text in ("stack dev", "mesh", "memory per chip", "22,000 FLOP/bit", "DCN-bound", "recommendations", "sources"):
        assert text in result.output

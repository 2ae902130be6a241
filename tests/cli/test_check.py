"""``multislice check`` (the policy pack offline) and ``multislice render --config``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack, load_stack_file, stack_file
from infra.policy.evaluate import check_world
from infra.policy.policies import POLICIES
from tests.fakes.pulumi_program import evaluate
from tests.fakes.queued_resource import clear_ambient_credentials
from training.warning_text import says_whether_to_act

ENV = {"COLUMNS": "250"}


@pytest.fixture(autouse=True)
def no_storage_access(monkeypatch, tmp_path):
    """The checked-in stacks' gs:// data sources are not listed: no emulated Cloud Storage (the
    session's, started by whichever test asked first, sets STORAGE_EMULATOR_HOST) and no
    credentials, so that the result does not depend on the tests that ran before."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    clear_ambient_credentials(monkeypatch, tmp_path)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV, color=False)


def edited_stack(tmp_path, stack: str, edit) -> str:
    document = yaml.safe_load(stack_file(stack).read_text())
    edit(document["config"])
    path = tmp_path / f"Pulumi.{stack}.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def test_a_good_stack_passes_with_advisories_only():
    result = invoke("check", "--stack", "dev")
    assert result.exit_code == 0, result.output
    assert f"stack dev: {len(POLICIES)} policies, 0 mandatory and" in result.output
    assert "[required-labels]" in result.output  # advisory: printed, not fatal


def test_each_warning_is_printed_once_and_says_whether_to_act(tmp_path):
    # load_config names the deprecated key, and so does the program check evaluates: one line. The
    # program's own (the dev stack is predicted DCN-bound) is a warning line too.
    path = edited_stack(tmp_path, "dev", lambda c: c.update({"multislice:queuedResource": {"releaseOnComplete": True}}))
    result = invoke("check", "--config-file", path)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == len(set(warnings)) == 2, result.stderr
    assert [w for w in warnings if "releaseOnComplete is deprecated" in w] and [w for w in warnings if "DCN" in w]
    assert all(says_whether_to_act(w) for w in warnings), warnings
    assert not [line for line in result.stderr.splitlines() if "predicted" in line and line not in warnings]


def over_hbm(config):
    config["multislice:training"]["model"]["d_model"] = 65536  # the example on v4-8


def test_a_stack_over_hbm_fails_the_mandatory_policy(tmp_path):
    path = edited_stack(tmp_path, "dev", over_hbm)
    load_stack_file(tmp_path / "Pulumi.dev.yaml")  # the config itself is valid: only the policy stops it
    result = invoke("check", "--config-file", path)
    assert result.exit_code == 1, result.output
    assert "mandatory [training-fits-hbm] queued-resource" in result.output
    assert (
        result.output.strip()
        .splitlines()[-1]
        .startswith("error: stack dev violates mandatory policies: training-fits-hbm")
    )


def test_the_documented_override_lets_it_pass(tmp_path):
    path = edited_stack(tmp_path, "dev", over_hbm)
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"training-fits-hbm": {"allowOverHbm": True}}))
    result = invoke("check", "--config-file", path, "--policy-config", str(policy))
    assert result.exit_code == 0, result.output
    assert "training-fits-hbm" not in result.output


def test_a_bad_policy_config_is_one_line(tmp_path):
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"training-fits-hmb": "advisory"}))
    result = invoke("check", "--stack", "dev", "--policy-config", str(policy))
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: policy config: unknown policy 'training-fits-hmb'; policies: "
        + ", ".join(p.name for p in __import__("infra.policy.policies", fromlist=["POLICIES"]).POLICIES)
    )


def test_a_fifo_as_policy_config_is_one_line_not_a_wait(tmp_path):
    fifo = tmp_path / "policy.json"
    os.mkfifo(fifo)  # reading it whole would wait for a writer: read_bounded refuses it on its descriptor
    result = invoke("check", "--stack", "dev", "--policy-config", str(fifo))
    assert result.exit_code == 2
    assert result.output.strip() == f"error: policy config {fifo}: a FIFO, not a regular file"


def test_an_invalid_stack_names_the_key(tmp_path):
    path = edited_stack(tmp_path, "dev", lambda c: c.update({"multislice:slices": 0}))
    result = invoke("check", "--config-file", path)
    assert result.exit_code == 2 and "multislice:slices" in result.output


def test_every_checked_in_stack_passes_the_mandatory_policies():
    for stack in ("dev", "staging", "prod"):
        assert [v for v in check_world(evaluate(stack)) if v.mandatory] == [], stack


def test_policy_config_levels_change_the_verdict():
    world = evaluate("dev")
    advisories = check_world(world)
    assert advisories and not any(v.mandatory for v in advisories)
    assert all(v.mandatory for v in check_world(world, {"required-labels": "mandatory"}))
    assert check_world(world, {"required-labels": {"enforcementLevel": "disabled"}}) == []


def test_render_config_prints_the_resolved_stack_file(tmp_path):
    result = invoke("render", "--stack", "staging", "--config")
    assert result.exit_code == 0, result.output
    resolved = yaml.safe_load(result.output)["config"]
    # every default is spelled out ...
    assert resolved["multislice:queuedResource"]["waitFor"] == "ACTIVE"
    assert "multislice:queuedResource" not in yaml.safe_load(stack_file("staging").read_text())["config"]
    # ... and the printed file is the same stack
    path = tmp_path / "Pulumi.staging.yaml"
    path.write_text(result.output)
    assert load_stack_file(path) == load_stack("staging")


def test_the_readme_lists_every_policy_with_its_level():
    from pathlib import Path

    from pulumi_policy import EnforcementLevel

    from infra.policy.policies import POLICIES

    review = (Path(__file__).resolve().parents[2] / "docs" / "review.md").read_text()
    section = review.split("## Review workflow", 1)[1].split("\n## ", 1)[0]
    mandatory_table, advisory_text = section.split("Advisory (warnings):", 1)
    for policy in POLICIES:
        where = mandatory_table if policy.enforcement_level is EnforcementLevel.MANDATORY else advisory_text
        assert f"`{policy.name}`" in where, policy.name


def test_a_value_unknown_until_the_update_is_advisory_as_in_the_cli():
    # During a real preview of a new stack the service account's email is not known yet;
    # pulumi_policy's analyzer reports "can't run during preview" as advisory. So does check.
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE

    from tests.fakes.pulumi_program import QR_TYPE

    world = evaluate("dev")
    qr = world.one(QR_TYPE)
    qr.inputs["serviceAccount"] = UNKNOWN_STRING_VALUE
    found = [v for v in check_world(world) if v.policy == "tpu-dedicated-service-account"]
    assert len(found) == 1 and not found[0].mandatory and "during preview" in found[0].message


def test_a_relative_source_is_read_beside_the_stack_file_as_plan_and_render_read_it(tmp_path):
    """A stack file kept outside stacks/ (the README's day one) names its source relative to itself."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('training')\n")
    document = yaml.safe_load((Path(__file__).parents[1] / "stacks" / "Pulumi.emu-command.yaml").read_text())
    document["config"]["multislice:workload"]["source"] = "src"
    path = tmp_path / "Pulumi.mine.yaml"
    path.write_text(yaml.safe_dump(document))
    for command in ("plan", "render", "check"):
        result = CliRunner().invoke(app, [command, "--config-file", str(path)])
        assert result.exit_code == 0, (command, result.output)

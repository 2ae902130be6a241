"""Every hint a command prints names a command that works as printed. Each scenario here makes a
command print hints (a stack kept outside ``stacks/``, as a user's own): the ``multislice …``
commands in its output are collected (in backticks, or after a colon: ``see:``, ``resume with:``,
``every VM's:``) and each is checked as the user would run it (tests/helpers/hints.py): the
command exists, its options parse, and the stack it names resolves (``--stack`` or
``--config-file``), without running it (some start an emulation). The advisory's hint is also run,
being cheap. The tests that run the README's day one and docs/compute-engine.md's example as
written check the hints of their outputs the same way."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
import typer.main
from typer.testing import CliRunner

from infra import planner
from infra.cli import app
from infra.config import load_stack_file
from infra.emulated import state as state_lib
from infra.emulated.state import LocalPaths
from tests.helpers.compute_engine_stack import stack_file as compute_engine_stack_file
from tests.helpers.hints import hints, works_as_printed

EMU = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"


def invoke(tmp_path: Path, args: list[str]):
    env = {"MULTISLICE_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "250"}
    return CliRunner().invoke(app, args, env=env, color=False)


def own_stack(tmp_path: Path) -> Path:
    path = tmp_path / "mine" / "Pulumi.long.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(EMU.read_text())
    return path


def test_the_hints_of_local_commands_without_a_run_work_as_printed(tmp_path):
    stack = own_stack(tmp_path)
    outputs = [
        invoke(tmp_path, ["local", "exec", "--config-file", str(stack), "--", "hostname"]).output,
        invoke(tmp_path, ["local", "logs", "--config-file", str(stack)]).output,
    ]
    paths = LocalPaths(tmp_path / "state" / "long")
    paths.root.mkdir(parents=True)
    config = load_stack_file(stack)
    state_lib.record_deletion(paths, config.queued_resource_name, config.run_dir)
    outputs.append(invoke(tmp_path, ["local", "exec", "--config-file", str(stack), "--", "hostname"]).output)
    found = [h for output in outputs for h in hints(output)]
    assert len(found) == 3, outputs
    assert all("--config-file" in h for h in found), found  # not a --stack that resolves nowhere
    for args in found:
        works_as_printed(args)


def test_the_hints_of_a_compute_engine_stack_s_refused_reset_work_as_printed(tmp_path):
    stack = compute_engine_stack_file(tmp_path)
    output = invoke(tmp_path, ["local", "reset", "--config-file", str(stack), "--yes"]).output
    found = hints(output)
    assert [h[:2] for h in found] == [["local", "down"], ["local", "up"]], output
    for args in found:
        works_as_printed(args)


def test_the_advisory_hint_runs_as_printed(tmp_path):
    stack = own_stack(tmp_path)
    lines = planner.advisories(load_stack_file(stack))  # the emu stack is predicted DCN-bound
    found = [h for line in lines for h in hints(line)]
    assert found and all(h == ["plan", "--config-file", str(stack.absolute())] for h in found), lines
    assert invoke(tmp_path, found[0]).exit_code == 0


def test_a_hint_naming_a_stack_that_resolves_nowhere_is_caught(tmp_path):
    # The check itself: the hint `check` printed before stacks were named as they were read.
    with pytest.raises(typer.Exit):
        works_as_printed(["plan", "--stack", "long"])

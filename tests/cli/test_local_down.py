"""``multislice local down --stack NAME`` refuses a name that is neither a stack nor a stack
that ran locally (a typo must not answer "nothing is running" while the real run goes on),
and still stops, or reports idle, a stack that did run (``--config-file`` stacks have no
file under stacks/)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from infra.cli import app


def down(tmp_path, monkeypatch, *args: str):
    monkeypatch.setenv("MULTISLICE_STATE_DIR", str(tmp_path))
    return CliRunner().invoke(app, ["local", "down", *args], env={"COLUMNS": "250"}, color=False)


def test_a_name_that_is_not_a_stack_is_refused(tmp_path, monkeypatch):
    (tmp_path / "emu").mkdir()
    (tmp_path / "emu" / "emulator.json").write_text(json.dumps({"pid": 0, "emulation_id": "", "vms": []}))
    result = down(tmp_path, monkeypatch, "--stack", "emu-typo")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert "--stack 'emu-typo': no such stack" in text
    assert "stacks: dev, prod, staging" in text and "local runs: emu" in text and "running now: emu" in text
    assert (tmp_path / "emu" / "emulator.json").exists()  # nothing was touched


def test_a_stack_that_ran_locally_is_accepted_without_a_stack_file(tmp_path, monkeypatch):
    (tmp_path / "emu").mkdir()
    result = down(tmp_path, monkeypatch, "--stack", "emu")
    assert result.exit_code == 0, result.output
    assert "no local run of stack 'emu' is running" in result.output


def test_a_stack_of_the_project_that_never_ran_is_accepted(tmp_path, monkeypatch):
    result = down(tmp_path, monkeypatch, "--stack", "dev")
    assert result.exit_code == 0, result.output
    assert "no local run of stack 'dev' is running" in result.output
    assert down(tmp_path, monkeypatch).output.strip() == "no local run is running"

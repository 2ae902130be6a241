"""The README stays true: its set-up commands use real options, its reference names every key."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import BaseModel
from typer.testing import CliRunner

from infra.cli import app
from infra.config import StackConfig
from training.config import TrainConfig

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def field_keys(model: type[BaseModel]) -> set[str]:
    keys = set()
    for name, field in model.model_fields.items():
        keys.add(field.alias or name)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys |= field_keys(annotation)
    return keys


def test_every_stack_key_is_documented():
    top = {field.alias for field in StackConfig.model_fields.values() if field.alias}
    nested = set()
    for field in StackConfig.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel) and field.annotation is not TrainConfig:
            nested |= field_keys(field.annotation)
    missing = sorted(key for key in top | nested if f"`{key}" not in README and f"{key}`" not in README and f" {key} " not in README)
    assert missing == []


def test_every_training_key_is_documented():
    missing = sorted(key for key in field_keys(TrainConfig) if key not in README)
    assert missing == []


def test_set_up_commands_use_existing_options():
    commands = re.findall(r"^pip install uv && uv run --frozen (.+)$", README, flags=re.M)
    assert len(commands) == 2 and commands[1] == "pytest"
    words = commands[0].split()
    assert words[:3] == ["multislice", "local", "up"]
    help_text = CliRunner().invoke(app, ["local", "up", "--help"], env={"COLUMNS": "200"}).output
    for option in (w for w in words if w.startswith("--")):
        assert option in help_text


def test_ci_runs_the_readme_test_command():
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    assert "pip install uv && uv run --frozen pytest" in ci

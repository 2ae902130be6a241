"""infra/cli/options.py: loading a stack for a command prints the deprecated keys it uses."""

from __future__ import annotations

import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.config import stack_file


def test_a_command_warns_once_about_release_on_complete_naming_its_new_key(tmp_path):
    document = yaml.safe_load(stack_file("dev").read_text())
    document["config"]["multislice:queuedResource"] = {"releaseOnComplete": False}
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(app, ["plan", "--config-file", str(path)], color=False)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: multislice:queuedResource.releaseOnComplete is deprecated (multislice:queuedResource."
        "deleteOnComplete has the same meaning); action needed: rename it to multislice:queuedResource.deleteOnComplete"
    ]


def test_a_stack_with_delete_on_complete_loads_without_a_warning(tmp_path):
    document = yaml.safe_load(stack_file("dev").read_text())
    document["config"]["multislice:queuedResource"] = {"deleteOnComplete": False}
    path = tmp_path / "Pulumi.dev.yaml"
    path.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(app, ["plan", "--config-file", str(path)], color=False)
    assert result.exit_code == 0, result.output
    assert "warning:" not in result.stderr

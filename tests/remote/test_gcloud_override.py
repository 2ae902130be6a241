"""``$MULTISLICE_GCLOUD`` set to something that runs nothing (a directory, a file that is not
executable, a missing path, a name not on PATH): the message names the variable and its value, says
what the value is, and what to set it to; ``multislice exec`` prints it as its one ``error:`` line
and exits 2, before any gcloud runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.remote import gcloud
from infra.remote.gcloud import GCLOUD_ENV
from infra.remote.selection import RemoteError

ROOT = Path(__file__).resolve().parents[2]
FIX = "set it to the gcloud executable (e.g. ~/google-cloud-sdk/bin/gcloud), or unset it to run gcloud from PATH"


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def refusal(monkeypatch, value: str) -> str:
    monkeypatch.setenv(GCLOUD_ENV, value)
    with pytest.raises(RemoteError) as err:
        gcloud.gcloud_executable()
    assert err.value.exit_code == 2
    return str(err.value)


def test_a_directory_is_named_as_one(tmp_path, monkeypatch):
    assert refusal(monkeypatch, str(tmp_path)) == f"{GCLOUD_ENV} is set to {str(tmp_path)!r}, a directory: {FIX}"


def test_a_directory_holding_gcloud_names_the_executable_in_it(tmp_path, monkeypatch):
    found = executable(tmp_path / "google-cloud-sdk" / "bin" / "gcloud")
    sdk = str(tmp_path / "google-cloud-sdk")
    assert (
        refusal(monkeypatch, sdk)
        == f"{GCLOUD_ENV} is set to {sdk!r}, a directory: set it to the gcloud executable in it, {found}"
    )


def test_a_file_that_is_not_executable_is_named_as_one(tmp_path, monkeypatch):
    path = tmp_path / "gcloud"
    path.write_text("#!/bin/sh\n")
    path.chmod(0o644)
    assert (
        refusal(monkeypatch, str(path)) == f"{GCLOUD_ENV} is set to {str(path)!r}, a file that is not executable: {FIX}"
    )


def test_a_missing_path_is_named_as_one(tmp_path, monkeypatch):
    path = str(tmp_path / "nowhere" / "gcloud")
    assert refusal(monkeypatch, path) == f"{GCLOUD_ENV} is set to {path!r}, which does not exist: {FIX}"


def test_a_name_not_on_path_is_named_as_one(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert refusal(monkeypatch, "gcloud-beta") == f"{GCLOUD_ENV} is set to 'gcloud-beta', which is not on PATH: {FIX}"


def test_an_executable_is_used_and_an_unset_variable_still_means_gcloud_on_path(tmp_path, monkeypatch):
    path = executable(tmp_path / "sdk" / "gcloud")
    monkeypatch.setenv(GCLOUD_ENV, str(path))
    assert gcloud.gcloud_executable() == str(path)
    monkeypatch.delenv(GCLOUD_ENV)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(RemoteError, match=r"^'gcloud' was not found on PATH: install the Google Cloud CLI"):
        gcloud.gcloud_executable()


def test_exec_prints_one_error_line_naming_the_variable_and_exits_2(tmp_path):
    data = yaml.safe_load((ROOT / "tests" / "stacks" / "Pulumi.emu.yaml").read_text())
    data["config"]["multislice:network"] = {"iapSsh": True}
    stack = tmp_path / "Pulumi.emu.yaml"
    stack.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(
        app,
        ["exec", "--config-file", str(stack), "--log-dir", str(tmp_path / "logs"), "--", "hostname"],
        env={"COLUMNS": "250", GCLOUD_ENV: str(tmp_path)},
        color=False,
    )
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == [f"error: {GCLOUD_ENV} is set to {str(tmp_path)!r}, a directory: {FIX}"]
    assert not (tmp_path / "logs").exists()

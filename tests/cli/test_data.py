"""``multislice data prepare`` and ``python -m training data prepare``: a dataset at a local
path or in a stack's emulated bucket; bad input is one ``error:`` line and exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack_file
from infra.emulated import gcs_clients
from tests.helpers.cli_imports import DRIVER, HEAVY
from tests.helpers.datasets import corpus
from training.data import manifest
from training.data.storage import Storage

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"


def multislice(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["data", "prepare", *args], env={"COLUMNS": "250", **(env or {})}, color=False)


def test_prepare_writes_a_dataset_once(tmp_path):
    source = corpus(tmp_path, files=4)
    out = tmp_path / "ds"
    first = multislice(source, str(out), "--tokenizer", "bpe", "--vocab-size", "300")
    assert first.exit_code == 0, first.output
    assert "prepared " in first.output and "tokenizer bpe (300 ids, uint16)" in first.output
    assert json.loads((out / "manifest.json").read_text())["tokenizer"]["vocab_size"] == 300
    again = multislice(source, str(out), "--tokenizer", "bpe", "--vocab-size", "300")
    assert again.exit_code == 0 and "is already prepared" in again.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokenizer", "{bad}"], "the tokenizer file {bad} does not parse as a Hugging Face tokenizers JSON file"),
        (["--tokenizer", "bpe"], "--tokenizer bpe needs --vocab-size"),
        (["--dtype", "int8"], "token dtype 'int8' is not one of auto, uint16, uint32"),
        (["--eval-fraction", "0.7"], "--eval-fraction '0.7': must be a finite number greater than 0 and less than 0.5"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, args, message):
    source = corpus(tmp_path, files=2)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    result = multislice(source, str(tmp_path / "ds"), *[a.format(bad=bad) for a in args])
    assert result.exit_code == 2, result.output
    assert f"error: {message.format(bad=bad)}" in result.output.replace("\n", " ")
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_emulated_writes_into_the_stacks_emulated_bucket(tmp_path):
    config = load_stack_file(STACK)
    source = corpus(tmp_path, files=3)
    out = f"gs://{config.bucket_name}/datasets/tiny"
    env = {"MULTISLICE_STATE_DIR": str(tmp_path / "state")}
    result = multislice(source, out, "--emulated", "--config-file", str(STACK), env=env)
    assert result.exit_code == 0, result.output
    assert f"writing to the emulated Cloud Storage of stack '{config.stack}'" in result.output
    with gcs_clients.clients_pointed_at(tmp_path / "state" / config.stack / "gcs", tmp_path / "reader.log") as stored:
        assert stored
        assert manifest.load(Storage(out)).splits["train"].tokens > 0
    elsewhere = multislice(source, "gs://another-bucket/datasets/x", "--emulated", "--config-file", str(STACK), env=env)
    assert elsewhere.exit_code == 2
    assert f"--emulated writes only the stack's bucket gs://{config.bucket_name}" in elsewhere.output


def test_the_trainers_own_command_prepares_without_jax(tmp_path):
    source = corpus(tmp_path, files=2)
    out = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(out), "data", "prepare", source, str(tmp_path / "a")],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and json.loads(out.read_text())["code"] in (0, None), proc.stderr
    assert not [m for m in json.loads(out.read_text())["modules"] if m.split(".")[0] in HEAVY]
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    own = subprocess.run(
        [sys.executable, "-m", "training", "data", "prepare", source, str(tmp_path / "b"), "--tokenizer", str(bad)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert own.returncode == 2 and "does not parse as a Hugging Face tokenizers JSON file" in own.stderr
    ok = subprocess.run(
        [sys.executable, "-m", "training", "data", "prepare", source, str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ok.returncode == 0 and (tmp_path / "c" / "manifest.json").exists(), ok.stderr

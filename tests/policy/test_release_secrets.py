"""The mandatory ``startup-script-safe`` policy scans everything a command's release carries, not
only the startup script's text: the workload's ``env`` (in ``workload.json``), its requirements
(a password in a URL's user-info part), its source files inline, and a source too large for the
script that travels as its own bucket object. Each is found through ``multislice check``, named
by where it is, and the secret itself is never printed. The credentials below are made up in the
documented shapes (infra/policy/secret_patterns.py)."""

from __future__ import annotations

import json
import random
import re
import string
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.policy.release_contents import embedded_release

COMMAND_STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu-command.yaml"
AWS_KEY_ID = "AKIA" + "Q7ZK3M9WX2PLR5TN"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzz3kq9v2Lp"
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
URL_PASSWORD = "s3cr3t-pw-77"


def command_stack(tmp_path: Path, *, env=None, requirements: str | None = None, files=None) -> Path:
    source = tmp_path / "src"
    source.mkdir()
    for name, text in {"train.py": "print('training')\n", **(files or {})}.items():
        (source / name).write_text(text)
    document = yaml.safe_load(COMMAND_STACK.read_text())
    workload = document["config"]["multislice:workload"]
    workload["source"] = str(source)
    if env is not None:
        workload["env"] = env
    if requirements is not None:
        (tmp_path / "requirements.txt").write_text(requirements)
        workload["requirements"] = str(tmp_path / "requirements.txt")
    path = tmp_path / "Pulumi.leaky.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def check(path: Path):
    return CliRunner().invoke(app, ["check", "--config-file", str(path)])


#: Random letters: a source this large (over the 32 KiB inline limit) travels through the bucket.
FILLER = "".join(random.Random(1).choices(string.ascii_letters, k=64 * 1024))

#: Every kind of leak in one release (one ``check`` evaluation): where each is found, and the value.
INLINE = {
    "env": {"AWS_SECRET_ACCESS_KEY": AWS_SECRET, "AWS_ACCESS_KEY_ID": AWS_KEY_ID},
    "requirements": f"pkg @ https://ci:{URL_PASSWORD}@pypi.example.com/pkg-1.0.tar.gz --hash=sha256:{'e' * 64}\n",
    "files": {"settings.py": f"TOKEN = load() or '{GITHUB_TOKEN}'\n"},
}
FOUND = (  # workload.json is indented JSON: each env entry on a line of its own
    ("workload.json", "a hard-coded password or token", AWS_SECRET),
    ("workload.json", "an AWS access key id", AWS_KEY_ID),
    ("workload-requirements.txt", "a password in a URL", URL_PASSWORD),
    ("workload/settings.py", "a GitHub token", GITHUB_TOKEN),
)


def assert_found(result, found) -> None:
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert "startup-script-safe" in output.split("violates mandatory policies:")[-1]
    for where, kind, secret in found:
        assert re.search(rf"{re.escape(where)} line \d+ holds {kind}", output), (where, kind, result.output)
        assert secret not in result.output  # where and what, never the value


def test_a_credential_anywhere_in_the_release_is_a_mandatory_violation(tmp_path):
    """The env (as workload.json), a requirement URL and a source file of one release: each found."""
    assert_found(check(command_stack(tmp_path, **INLINE)), FOUND)


def test_a_credential_in_a_source_sent_through_the_bucket_is_found_there(tmp_path):
    """A source over the inline limit travels as its own bucket object: scanned from its file."""
    result = check(command_stack(tmp_path, files={"settings.py": f"GH = '{GITHUB_TOKEN}'\n", "blob.txt": FILLER}))
    assert_found(result, [("settings.py", "a GitHub token", GITHUB_TOKEN)])
    assert "multislice:workload.source" in " ".join(result.output.split())


def test_a_clean_release_is_no_violation(tmp_path):
    path = command_stack(tmp_path, env={"LOG_LEVEL": "info", "TOKENIZER": "bpe"}, files={"util.py": "x = 1\n"})
    result = check(path)
    assert result.exit_code == 0, result.output
    assert "startup-script-safe" not in result.output


def test_the_release_is_read_back_from_the_script_it_is_embedded_in(tmp_path):
    """What the scan reads is the release the script carries, byte for byte."""
    from infra import startup
    from infra.config import load_stack_file

    config = load_stack_file(command_stack(tmp_path, env={"A": "1"}))
    rendered = startup.render(config)
    carried = embedded_release(rendered.text)
    assert json.loads(carried["workload.json"])["env"] == {"A": "1"}
    assert set(carried) == set(rendered.files)  # every file of the release, read back
    assert embedded_release("#!/bin/bash\necho no release\n") == {}


#: The same stack on each backend: the keys that move it there (a v5p slice for compute-engine, which
#: offers no v4; a multi-host v4-16 slice for gke, whose Multislice pools are multi-host).
ON_BACKEND = {
    "queued-resource": {},
    "compute-engine": {
        "multislice:backend": "compute-engine",
        "multislice:acceleratorType": "v5p-8",
        "gcp:zone": "us-east5-a",
    },
    "gke": {"multislice:backend": "gke", "multislice:acceleratorType": "v4-16"},
}


@pytest.mark.parametrize("backend", sorted(ON_BACKEND))
def test_the_same_secret_is_the_same_violation_on_every_backend(tmp_path, backend):
    """A token in the workload's env: on queued-resource and compute-engine the release travels in
    node or instance-template metadata, on gke in the startup ConfigMap; each is scanned, so the
    finding is the same: startup-script-safe, workload.json, the kind, never the value."""
    path = command_stack(tmp_path, env={"HF_TOKEN": GITHUB_TOKEN, "EXPECTED_DEVICES": 8})
    document = yaml.safe_load(path.read_text())
    document["config"].update(ON_BACKEND[backend])
    if backend == "gke":
        document["config"]["multislice:workload"]["env"]["EXPECTED_DEVICES"] = 16
    path.write_text(yaml.safe_dump(document))
    result = check(path)
    assert_found(result, [("workload.json", "a GitHub token", GITHUB_TOKEN)])
    where = {"gke": "ConfigMap", "compute-engine": "TPU resource", "queued-resource": "TPU resource"}[backend]
    assert "[startup-script-safe] " in result.output and where in result.output, result.output


def test_provider_credentials_in_plain_text_are_a_violation_and_secrets_are_not(tmp_path):
    """gcp:accessToken / gcp:credentials written in plain text in the stack file: the stack file is
    committed; as Pulumi secrets (``{secure: …}``) they are fine. The value is never printed."""
    token = "ya29." + "a0AfB_" + "x" * 40
    path = command_stack(tmp_path)
    document = yaml.safe_load(path.read_text())
    document["config"]["gcp:accessToken"] = token
    path.write_text(yaml.safe_dump(document))
    result = check(path)
    assert result.exit_code == 1, result.output
    output = " ".join(result.output.split())
    assert (
        "[values-carry-no-credentials] stack: stack file: gcp:accessToken holds a Google OAuth access token" in output
    )
    assert "pulumi config set --secret gcp:accessToken" in output and token not in result.output
    document["config"]["gcp:accessToken"] = {"secure": "v1:AAAABBBBCCCC"}
    path.write_text(yaml.safe_dump(document))
    assert "values-carry-no-credentials" not in check(path).output

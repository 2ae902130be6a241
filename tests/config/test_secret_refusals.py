"""A refused value is named by its key, never quoted with a secret it carries (training/redaction.py):
the config's messages show a value through ``redacted()``, and do not show at all a value that may be
a secret by its name alone (an ``env`` value, a label value). The credentials are made up and
assembled at run time from pieces."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import StackConfigError, validate_stack
from infra.config.requirement_urls import url_problem

ROOT = Path(__file__).parents[2]
BASE = yaml.safe_load((ROOT / "tests" / "stacks" / "Pulumi.emu-command.yaml").read_text())["config"]
GITHUB = "gh" + "p_" + "a1B2c3D4e5F6g7H8i9J0" + "k1L2m3N4o5P6q7R8"
PASSWORD = "pa$$ w0rd'" + "Qx7"
URL_PASSWORD = "s3cr3t" + "-pw-" + "9317"
HASH = "e" * 64


def edited(edit) -> dict[str, Any]:
    config = copy.deepcopy(BASE)
    config["multislice:workload"]["source"] = str(ROOT / "tests" / "fakes" / "workload")
    edit(config)
    return config


def workload(**changes):
    return lambda config: config["multislice:workload"].update(changes)


def env(**values):
    return lambda config: config["multislice:workload"]["env"].update(values)


def setting(key: str, value: Any):
    return lambda config: config.update({key: value})


CASES = {
    "an env value that is a list": (env(DB_PASSWORD=[PASSWORD]), "multislice:workload.env", PASSWORD),
    "an env that is a list": (workload(env=[f"DB_PASSWORD={PASSWORD}"]), "multislice:workload.env", PASSWORD),
    "an env name holding a token": (workload(env={f"TOKEN={GITHUB}": "1"}), "multislice:workload.env", GITHUB),
    "a command holding a token": (
        workload(command=f"python3 x.py --token {GITHUB}"),
        "multislice:workload.command",
        GITHUB,
    ),
    "a command argument not a string": (
        workload(command=["python3", {"--token": GITHUB}]),
        "multislice:workload.command",
        GITHUB,
    ),
    "a source that is a URL": (
        workload(source=f"https://ci:{URL_PASSWORD}@host/x"),
        "multislice:workload.source",
        URL_PASSWORD,
    ),
    "a label value with a URL": (
        setting("multislice:labels", {"src": f"postgres://u:{URL_PASSWORD}@db"}),
        "multislice:labels",
        URL_PASSWORD,
    ),
    "a label value under a password's name": (
        setting("multislice:labels", {"db-password": PASSWORD}),
        "multislice:labels",
        PASSWORD,
    ),
    "a label key holding a token": (setting("multislice:labels", {f"x{GITHUB}": "a"}), "multislice:labels", GITHUB),
    "a project id that is a URL": (setting("gcp:project", f"https://u:{URL_PASSWORD}@x"), "gcp:project", URL_PASSWORD),
    "a zone that is a token": (setting("gcp:zone", GITHUB), "gcp:zone", GITHUB),
    "a capacity that is a token": (setting("multislice:capacity", GITHUB), "multislice:capacity", GITHUB),
    "a subnet range that is a token": (
        setting("multislice:network", {"subnetCidr": GITHUB}),
        "multislice:network",
        GITHUB,
    ),
    "a bucket name that is a token": (setting("multislice:bucket", {"name": GITHUB}), "multislice:bucket", GITHUB),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_refusal_names_the_key_without_the_secret(case):
    edit, key, secret = CASES[case]
    with pytest.raises(StackConfigError) as err:
        validate_stack("leaky", edited(edit), "test")
    text = str(err.value)
    assert key in text, text
    assert secret not in text and secret not in " ".join(text.split()), text


@pytest.mark.parametrize(
    "line",
    [
        f"pkg @ git+https://ci:{URL_PASSWORD}@github.com/acme/x",  # a checkout
        f"pkg @ http://ci:{URL_PASSWORD}@pypi.example.com/x.tar.gz --hash=sha256:{HASH}",  # plain http
        f"pkg @ https://ci:{URL_PASSWORD}@pypi.example.com/x.tar.gz",  # no hash
        f"https://ci:{URL_PASSWORD}@pypi.example.com/x.tar.gz --hash=sha256:{HASH}",  # no name
        f"pkg==1.0 --index-url=https://ci:{URL_PASSWORD}@pypi.example.com/simple",  # an option
        f"pkg @ https://ci:{URL_PASSWORD}@pypi.example.com:0/x.tar.gz --hash=sha256:{HASH}",  # a bad port
    ],
)
def test_a_requirement_refusal_hides_the_url_password(tmp_path, line):
    (tmp_path / "requirements.txt").write_text(line + "\n")
    config = edited(workload(requirements=str(tmp_path / "requirements.txt")))
    with pytest.raises(StackConfigError) as err:
        validate_stack("leaky", config, "test")
    text = str(err.value)
    assert "multislice:workload.requirements" in text and URL_PASSWORD not in text, text
    assert "***" in text


def test_every_url_problem_hides_the_user_information():
    for url in (
        f"git+https://ci:{URL_PASSWORD}@github.com/a/b",
        f"http://ci:{URL_PASSWORD}@h/x.tgz",
        f"ftp://ci:{URL_PASSWORD}@h/x.tgz",
        f"https://ci:{URL_PASSWORD}@h/x.tgz",
    ):
        for name in (None, "pkg"):
            problem = url_problem(name, url, [])
            assert problem is not None and URL_PASSWORD not in problem, problem

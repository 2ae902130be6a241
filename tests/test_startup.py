"""infra/startup.py and its template infra/startup.sh.in: the rendered startup script is
reproducible, small and valid bash, and the template is filled exactly. What the script does
on a VM is tests/test_startup_sh.py."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from infra import lockfile, startup
from infra.bundle import build_bundle
from infra.config import StackConfig, load_stack

ROOT = Path(__file__).resolve().parents[1]
STACKS = ("dev", "staging", "prod")
SHELLCHECK = Path("/usr/bin/shellcheck")


def _copy_project(dest: Path) -> Path:
    """Copy only what rendering needs into ``dest``."""
    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "training", dest / "training", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("uv.lock", "pyproject.toml", ".python-version"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def stacks() -> dict[str, StackConfig]:
    return {name: load_stack(name, ROOT / "stacks") for name in STACKS}


@pytest.fixture(scope="module")
def rendered(stacks) -> dict[str, startup.RenderedScript]:
    return {name: startup.render(config, project_root=ROOT) for name, config in stacks.items()}


# Reproducibility and size ---------------------------------------------------------------------


def test_identical_bytes_from_two_checkouts(tmp_path, stacks, rendered):
    first = _copy_project(tmp_path / "a" / "checkout")
    second = _copy_project(tmp_path / "elsewhere" / "deeper" / "x")
    os.utime(second / "training" / "config.py", (0, 0))  # mtimes must not matter
    for name, config in stacks.items():
        a = startup.render(config, project_root=first)
        b = startup.render(config, project_root=second)
        assert a == b == rendered[name], name
        for path in (first, second, ROOT, Path.home()):
            assert str(path) not in a.text


def test_stacks_differ_only_where_they_should(rendered):
    assert len({r.text for r in rendered.values()}) == len(STACKS)
    assert len({r.bundle_sha256 for r in rendered.values()}) == 1
    assert len({r.requirements_sha256 for r in rendered.values()}) == 1


def test_no_timestamps(rendered):
    date = re.compile(r"\b(19|20)\d\d-[01]\d-[0-3]\d\b")
    clock = re.compile(r"\b[0-2]\d:[0-5]\d:[0-5]\d\b")
    for name, script in rendered.items():
        assert not date.search(script.text), (name, date.search(script.text))
        assert not clock.search(script.text), (name, clock.search(script.text))
        assert "upload-time" not in script.text


def test_header_and_fields(stacks, rendered):
    requirements = lockfile.pinned_requirements(ROOT)
    for name, script in rendered.items():
        config = stacks[name]
        head = "\n".join(script.text.splitlines()[:6])
        assert script.text.startswith("#!/bin/bash\n")
        assert f"stack {name}:" in head
        assert f"{config.accelerator_type} x {config.slices}" in head
        assert f"bundle sha256:       {script.bundle_sha256}" in head
        assert f"requirements sha256: {script.requirements_sha256}" in head
        assert "rendered by infra/startup.py — do not edit" in head
        data = script.text.encode()
        assert script.size_bytes == len(data)
        assert script.sha256 == hashlib.sha256(data).hexdigest()
        assert script.requirements_sha256 == requirements.sha256
        assert requirements.text in script.text
        assert lockfile.pinned_uv(ROOT).requirement_text in script.text
        assert config.training.model_dump_json() + "\n" in script.text


def test_size_within_target(rendered):
    for name, script in rendered.items():
        assert script.size_bytes <= startup.TARGET_SIZE_BYTES, (name, script.size_bytes)
        assert script.size_bytes <= startup.METADATA_VALUE_LIMIT_BYTES


def test_too_large_is_an_error(tmp_path, stacks):
    project = _copy_project(tmp_path / "big")
    # ~300 KB of incompressible text in a module: the script cannot fit in 256 KiB.
    blob = hashlib.sha256(b"seed").digest()
    chunks = [hashlib.sha256(blob + i.to_bytes(4, "big")).hexdigest() for i in range(5000)]
    (project / "training" / "blob.py").write_text("BLOB = (\n" + "".join(f"    '{c}'\n" for c in chunks) + ")\n")
    with pytest.raises(startup.StartupScriptTooLarge) as info:
        startup.render(stacks["dev"], project_root=project)
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert "256 KiB" in message and "'dev'" in message
    assert re.search(r"is \d+ bytes", message)


def test_too_large_respects_the_limit_constant(monkeypatch, stacks, rendered):
    monkeypatch.setattr(startup, "METADATA_VALUE_LIMIT_BYTES", rendered["dev"].size_bytes - 1)
    with pytest.raises(startup.StartupScriptTooLarge, match=str(rendered["dev"].size_bytes)):
        startup.render(stacks["dev"], project_root=ROOT)


# Shell validity ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", STACKS)
def test_bash_syntax(tmp_path, rendered, name):
    script = tmp_path / "startup.sh"
    script.write_text(rendered[name].text)
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(not SHELLCHECK.exists(), reason="/usr/bin/shellcheck is not installed on this machine")
def test_shellcheck(tmp_path, rendered):
    script = tmp_path / "startup.sh"
    script.write_text(rendered["dev"].text)
    result = subprocess.run([str(SHELLCHECK), "--shell=bash", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_bundle_in_script_decodes_to_the_same_bytes(rendered):
    text = rendered["dev"].text
    body = text.split("<<'MULTISLICE_BUNDLE'\n", 1)[1].split("\nMULTISLICE_BUNDLE\n", 1)[0]
    decoded = base64.b64decode(body)
    assert hashlib.sha256(decoded).hexdigest() == rendered["dev"].bundle_sha256
    assert decoded == build_bundle(ROOT / "training")


# Template -----------------------------------------------------------------------------------


def test_template_is_package_data():
    """render() reads the template through importlib.resources (what an installed wheel
    has), and it is the checked-in file."""
    assert startup.template() == (ROOT / "infra" / startup.TEMPLATE_RESOURCE).read_text(encoding="utf-8")
    assert startup.template().startswith("#!/bin/bash\n")


@pytest.mark.skipif(not SHELLCHECK.exists(), reason="/usr/bin/shellcheck is not installed on this machine")
def test_shellcheck_template():
    """The template itself is a well-formed script: each payload placeholder has its own line
    and every heredoc is closed."""
    path = ROOT / "infra" / startup.TEMPLATE_RESOURCE
    result = subprocess.run([str(SHELLCHECK), "--shell=bash", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_placeholder_is_filled(rendered):
    placeholders = set(re.findall(r"@@([A-Z0-9_]+)@@", startup.template()))
    assert {"STACK", "BUNDLE_BASE64", "REQUIREMENTS", "CONFIG_JSON"} <= placeholders
    for name, script in rendered.items():
        assert not re.search(r"@@[A-Z0-9_]+@@", script.text), name


def test_fill_is_one_pass_and_refuses_drift():
    assert startup.fill("a=@@A@@ b=@@B@@\n", {"A": "@@B@@", "B": "2"}) == "a=@@B@@ b=2\n"
    with pytest.raises(ValueError, match=r"placeholders without a value \['B'\]"):
        startup.fill("@@A@@ @@B@@", {"A": "1"})
    with pytest.raises(ValueError, match=r"values without a placeholder \['C'\]"):
        startup.fill("@@A@@", {"A": "1", "C": "3"})

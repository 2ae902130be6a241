"""The render-time check of a command's requirements (infra/startup/workload.py, ``check_requirements``):
a marker whose value depends on a Python patch release that ``.python-version`` does not pin is
refused naming the key and its line (it was decided on 3.11.0 and 3.11.99 only, so
``python_full_version == "3.11.3"`` passed as "not for the VM" whatever the VM's release), at render
and through ``multislice plan``; and every refusal that says to compile the file gives the whole
command, with the VMs' Python version and platform."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.startup import lockfile, workload as workload_release
from infra.startup.install_target import InstallTarget, read_python_version
from infra.startup.uv_lock import Lock

ROOT = Path(__file__).resolve().parents[2]
HASH = "a" * 64
BASE = {"gcp:project": "my-project-123", "gcp:zone": "us-central2-b", "multislice:acceleratorType": "v4-8"}
runner = CliRunner()


def minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def requirements(marker: str) -> str:
    return f"absl-py==2.1.0 --hash=sha256:{HASH}\nunknown-pkg==1.0 ; {marker} \\\n    --hash=sha256:{HASH}\n"


@pytest.mark.parametrize("quote", ["'", '"'])
def test_a_marker_on_a_patch_release_is_refused_naming_the_key_and_line(quote):
    target = InstallTarget(minor(read_python_version(ROOT)))
    marker = f"python_full_version == {quote}{target.python_version}.3{quote}"
    with pytest.raises(workload_release.WorkloadError) as err:
        workload_release.check_requirements(requirements(marker), target, None)
    assert str(err.value) == (
        f"multislice:workload.requirements: line 2: unknown-pkg==1.0: marker {marker!r} depends on the patch release "
        f"of Python {target.python_version}, which .python-version does not pin (the VMs run the "
        f"{target.python_version} release `uv python install {target.python_version}` picks); write the marker on "
        f"python_version, or pin a full version (e.g. {target.python_version}.9) in .python-version"
    )
    # Pinned to a full version, the marker is decided on it: not for 3.x.9, for 3.x.3.
    workload_release.check_requirements(requirements(marker), InstallTarget(f"{target.python_version}.9"), None)
    workload_release.check_requirements(requirements(marker), InstallTarget(f"{target.python_version}.3"), None)
    workload_release.check_requirements(requirements(f"python_version == '{target.python_version}'"), target, None)


def test_cli_plan_refuses_a_marker_on_a_patch_release_with_exit_2(tmp_path):
    version = read_python_version(ROOT)
    assert version.count(".") == 1, "this checkout pins a full Python version: such a marker is then decided on it"
    marker = f'python_full_version == "{version}.3"'
    (tmp_path / "req.txt").write_text(requirements(marker))
    path = tmp_path / "stacks" / "Pulumi.wl.yaml"
    path.parent.mkdir()
    workload = {"command": ["x"], "steps": 1, "requirements": "../req.txt"}
    path.write_text(yaml.safe_dump({"config": {**BASE, "multislice:workload": workload}}))
    result = runner.invoke(app, ["plan", "--config-file", str(path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    (line,) = result.output.splitlines()
    assert line.startswith(
        f"error: multislice:workload.requirements: line 2: unknown-pkg==1.0: marker {marker!r} depends on the patch "
        f"release of Python {version}"
    ), line


def test_every_hint_of_the_check_gives_the_whole_compile_command():
    target = lockfile.install_target(ROOT)
    command = (
        f"`uv pip compile requirements.in --generate-hashes --python-version {target.python_version} "
        "--python-platform x86_64-manylinux_2_35 -o requirements-vm.txt`"
    )
    assert f"`{target.compile_command}`" == command
    lock = Lock(ROOT / "uv.lock")
    numpy = next(iter(lock.candidates("numpy")))
    mac = [w["hash"].split(":", 1)[1] for w in numpy["wheels"] if "macosx" in w["url"]]
    header = "#    uv pip compile r.in --python-version {v} --python-platform {p} --generate-hashes\n"
    pin = f"numpy=={numpy['version']} --hash=sha256:{mac[0]}\n"
    for text, refused in [
        (header.format(v="3.12", p="x86_64-manylinux_2_35") + pin, "compiled for Python 3.12"),
        (header.format(v=target.python_version, p="aarch64-apple-darwin") + pin, "compiled for platform aarch64"),
        ("#    uv pip compile 'r.in\n" + pin, "its uv pip compile header"),
        (pin, "none of its hashed files installs on"),
    ]:
        with pytest.raises(workload_release.WorkloadError) as err:
            workload_release.check_requirements(text, target, lock)
        assert refused in str(err.value) and str(err.value).endswith(command), str(err.value)

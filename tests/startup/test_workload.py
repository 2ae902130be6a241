"""A stack's own command in the release (infra/startup/workload.py, script.py, boot.sh.in,
trainer.sh): what the release holds, what changes it, the render-time check of the command's
requirements for the VM, the install of a hash-pinned URL requirement (the boot's uv command,
run for real), and the boot of a VM whose command's source comes through the bucket."""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from infra import startup
from infra.config import StackConfig
from infra.startup import lockfile, workload as workload_release
from infra.startup.templates import BOOT_RESOURCE, template
from infra.startup.uv_lock import Lock
from tests.fakes.startup_vm import (
    BUCKET,
    ROOT,
    RUN_DIR,
    TPU_ENV,
    Vm,
    gcs,  # noqa: F401 (fixture)
    prefixed,
)

BASE = {"gcp:project": "acme-ml", "gcp:zone": "us-central2-b", "multislice:acceleratorType": "v4-16"}


def command_stack(tmp_path, **workload) -> StackConfig:
    source = tmp_path / "src"
    if not source.exists():
        source.mkdir()
        (source / "train.py").write_text("print('training')\n")
    spec = {"command": ["python3", "train.py"], "steps": 10, "source": str(source), **workload}
    return StackConfig.model_validate({"stack": "dev", **BASE, "multislice:slices": 2, "multislice:workload": spec})


def render(config: StackConfig) -> startup.RenderedScript:
    return startup.render(config, project_root=ROOT)


def test_the_release_holds_the_command_not_the_trainer_config(tmp_path):
    rendered = render(command_stack(tmp_path, env={"A": "1"}))
    files = set(rendered.files)
    assert {"workload.json", "workload/train.py", "boot.sh", "trainer.sh", "requirements.txt"} <= files
    assert "config.json" not in files and "workload-source.json" not in files
    release = tarfile.open(fileobj=io.BytesIO(rendered.release))
    spec = json.loads(release.extractfile("workload.json").read())  # type: ignore[union-attr]
    assert spec == {"command": ["python3", "train.py"], "env": {"A": "1"}, "steps": 10}
    boot = release.extractfile("boot.sh").read().decode()  # type: ignore[union-attr]
    assert "readonly WORKLOAD=command\n" in boot and "Description=multislice command (stack dev" in boot
    assert rendered.workload_source == b"" and rendered.workload_source_object is None


@pytest.mark.parametrize(
    "change",
    [
        {"command": ["python3", "train.py", "--fast"]},
        {"env": {"A": "2"}},
        {"steps": 11},
    ],
)
def test_a_change_to_the_command_is_a_new_release(tmp_path, change):
    before = render(command_stack(tmp_path))
    after = render(command_stack(tmp_path, **change))
    assert after.release_id != before.release_id
    assert [p for p in after.files if after.files[p] != before.files.get(p)] == ["workload.json"]


def test_a_change_to_the_source_is_a_new_release(tmp_path):
    before = render(command_stack(tmp_path))
    (tmp_path / "src" / "train.py").write_text("print('training faster')\n")
    after = render(command_stack(tmp_path))
    assert after.release_id != before.release_id
    assert [p for p in after.files if after.files[p] != before.files.get(p)] == ["workload/train.py"]


def test_the_trainer_stack_keeps_its_release(tmp_path):
    config = StackConfig.model_validate(
        {"stack": "dev", **BASE, "multislice:slices": 1, "multislice:training": {"parallelism": {"ici": {"fsdp": 8}}}}
    )
    rendered = render(config)
    assert "config.json" in rendered.files and "workload.json" not in rendered.files
    boot = tarfile.open(fileobj=io.BytesIO(rendered.release)).extractfile("boot.sh").read().decode()  # type: ignore[union-attr]
    assert "readonly WORKLOAD=trainer\n" in boot and "Description=multislice trainer (stack dev" in boot


def test_a_large_source_goes_through_the_bucket(tmp_path, monkeypatch):
    monkeypatch.setattr(workload_release, "INLINE_SOURCE_BYTES", 100)
    rendered = render(command_stack(tmp_path))
    assert not any(p.startswith("workload/") for p in rendered.files) and "workload-source.json" in rendered.files
    sha = hashlib.sha256(rendered.workload_source).hexdigest()
    assert rendered.workload_source_object == f"multislice/dev/sources/{sha}.tar"
    names = tarfile.open(fileobj=io.BytesIO(rendered.workload_source)).getnames()
    assert names == ["train.py"]
    (tmp_path / "src" / "train.py").write_text("print('changed')\n")
    assert render(command_stack(tmp_path)).release_id != rendered.release_id  # the reference names the sha256


def test_requirements_ship_and_are_checked_for_the_vm(tmp_path):
    target = lockfile.install_target(ROOT)
    lock = Lock(ROOT / "uv.lock")
    numpy = next(p for p in lock.candidates("numpy"))
    wheels = {w["url"].rsplit("/", 1)[-1]: w["hash"].split(":", 1)[1] for w in numpy["wheels"]}
    good = next(h for name, h in wheels.items() if target.wheel_rank(name) is not None)
    mac = [h for name, h in wheels.items() if "macosx" in name]
    version = numpy["version"]

    def check(text):
        workload_release.check_requirements(text, target, lock)

    check(f"numpy=={version} --hash=sha256:{good}\n")
    check(f"unknown-pkg==1.0 --hash=sha256:{'c' * 64}\n")  # not in the lock: uv checks it on the VM
    check(f"numpy=={version} ; sys_platform == 'darwin' --hash=sha256:{mac[0]}\n")  # not for the VM
    with pytest.raises(workload_release.WorkloadError, match=r"numpy==.*none of its hashed files installs on CPython"):
        check(f"numpy=={version} " + " ".join(f"--hash=sha256:{h}" for h in mac) + "\n")
    header = (
        "# This file was autogenerated by uv via the following command:\n"
        "#    uv pip compile r.in --python-version {v} --python-platform {p} --generate-hashes\n"
    )
    with pytest.raises(workload_release.WorkloadError, match="compiled for Python 3.12"):
        check(header.format(v="3.12", p="x86_64-manylinux_2_35") + f"numpy=={version} --hash=sha256:{good}\n")
    with pytest.raises(workload_release.WorkloadError, match="compiled for platform aarch64-apple-darwin"):
        check(
            header.format(v=target.python_version, p="aarch64-apple-darwin")
            + f"numpy=={version} --hash=sha256:{good}\n"
        )
    (tmp_path / "req.txt").write_text(f"numpy=={version} --hash=sha256:{good}\n")
    rendered = render(command_stack(tmp_path, requirements=str(tmp_path / "req.txt")))
    assert "workload-requirements.txt" in rendered.files
    boot = tarfile.open(fileobj=io.BytesIO(rendered.release)).extractfile("boot.sh").read().decode()  # type: ignore[union-attr]
    sha = hashlib.sha256((tmp_path / "req.txt").read_bytes()).hexdigest()
    assert f"readonly WORKLOAD_REQUIREMENTS_SHA256={sha}\n" in boot


#: A hash-pinned direct reference, as MaxText's requirements end (docs/workloads.md).
URL_REQUIREMENT = (
    "google-jetstream @ https://github.com/AI-Hypercomputer/JetStream/archive/"
    f"29329e8e73820993f77cfc8efe34eb2a73f5de98.zip \\\n    --hash=sha256:{'d' * 64}\n"
)


def test_a_url_requirement_ships_and_the_vm_installs_it_hash_checked(tmp_path, gcs):  # noqa: F811
    target = lockfile.install_target(ROOT)
    lock = Lock(ROOT / "uv.lock")
    numpy = next(p for p in lock.candidates("numpy"))
    good = next(
        w["hash"].split(":", 1)[1]
        for w in numpy["wheels"]
        if target.wheel_rank(w["url"].rsplit("/", 1)[-1]) is not None
    )
    text = f"numpy=={numpy['version']} --hash=sha256:{good}\n" + URL_REQUIREMENT
    workload_release.check_requirements(text, target, lock)
    # A name uv.lock knows, as a URL: the lock records no archive of it, so uv checks its hash on the VM.
    workload_release.check_requirements(
        f"numpy @ https://example.com/numpy.zip --hash=sha256:{'e' * 64}\n", target, lock
    )
    with pytest.raises(
        workload_release.WorkloadError, match=r"^multislice:workload.requirements: line 1: .* plain http"
    ):
        workload_release.check_requirements(f"x @ http://example.com/x.zip --hash=sha256:{'e' * 64}\n", target, lock)
    (tmp_path / "req.txt").write_text(text)
    rendered = render(command_stack(tmp_path, requirements=str(tmp_path / "req.txt")))
    shipped = tarfile.open(fileobj=io.BytesIO(rendered.release)).extractfile("workload-requirements.txt")
    assert shipped is not None and shipped.read() == text.encode()  # as written: uv reads it on the VM
    # The VM builds the command's virtualenv from it in hash-checking mode, as it builds the trainer's.
    attributes = {"agent-worker-number": "2", "tpu-env": TPU_ENV, "multislice-run-dir": RUN_DIR}
    (tmp_path / "vm").mkdir()
    machine = Vm(tmp_path / "vm", rendered.text, attributes, gcs)
    with machine.metadata:
        result = machine.run(use_fake_python=False)
    assert result.returncode == 0, result.stdout
    release = machine.home / "releases" / rendered.release_id
    installs = [c for c in (machine.fake_dir / "calls").read_text().splitlines() if c.startswith("uv --no-config pip ")]
    assert len(installs) == 2 and all(" --require-hashes --compile-bytecode -r " in c for c in installs), installs
    assert f"-r {release}/workload-requirements.txt " in installs[1]
    assert (machine.fake_dir / "requirements.txt").read_text() == text  # what the last install read
    sha = hashlib.sha256(text.encode()).hexdigest()
    assert (machine.home / "venvs" / sha / ".complete").read_text().strip() == sha
    assert machine.argv(1)[-1] == str((machine.home / "venvs" / sha / "bin").resolve())


def wheel(directory: Path) -> Path:
    """A minimal pure-Python wheel, ``demo_pkg-1.0-py3-none-any.whl``, written in ``directory``."""
    files = {
        "demo_pkg/__init__.py": b"VALUE = 42\n",
        "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
        "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in files.items()
    ]
    files["demo_pkg-1.0.dist-info/RECORD"] = ("\n".join([*record, "demo_pkg-1.0.dist-info/RECORD,,"]) + "\n").encode()
    path = directory / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def test_the_vms_install_command_installs_a_hash_pinned_url_archive(tmp_path):
    """The real uv (the one uv.lock pins for the VMs), run as boot.sh runs it, installs a
    ``name @ URL --hash=sha256:…`` requirement and refuses it with a wrong hash or none. The URL
    is a loopback http server (no network here, and no certificate for one); the check that a
    stack's URLs are https is the config's (tests/config/test_workload.py), not uv's."""
    uv = Path(sys.prefix) / "bin" / "uv"
    if not uv.is_file():
        pytest.skip("no uv in this environment (uv sync installs the dev group)")
    boot = template(BOOT_RESOURCE)
    assert (
        '"$uv" --no-config pip install --python "$tmp/venv/bin/python" --require-hashes --compile-bytecode \\\n'
        '    -r "$requirements"'
    ) in boot
    served = tmp_path / "served"
    served.mkdir()
    sha = hashlib.sha256(wheel(served).read_bytes()).hexdigest()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/demo_pkg-1.0-py3-none-any.whl"
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "cache"), "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}
    env.pop("PYTHONPYCACHEPREFIX", None)  # the tests' own (tests/conftest.py); a VM's boot sets none
    venv = tmp_path / "venv"
    subprocess.run(
        [str(uv), "--no-config", "venv", "--offline", "--python", sys.executable, str(venv)],
        env=env,
        check=True,
        capture_output=True,
        timeout=60,
    )

    def install(line: str) -> subprocess.CompletedProcess[str]:
        (tmp_path / "req.txt").write_text(line + "\n")
        command = [str(uv), "--no-config", "pip", "install", "--python", str(venv / "bin" / "python")]
        command += ["--require-hashes", "--compile-bytecode", "-r", str(tmp_path / "req.txt"), "--no-index"]  # no PyPI
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    try:
        # uv wraps its messages to the terminal's width (COLUMNS): compare them with their lines joined.
        missing = install(f"demo-pkg @ {url}")
        assert missing.returncode != 0 and "all requirements must have a hash" in " ".join(missing.stderr.split())
        wrong = install(f"demo-pkg @ {url} --hash=sha256:{'0' * 64}")
        assert wrong.returncode != 0 and "Hash mismatch" in " ".join(wrong.stderr.split()), wrong.stderr
        good = install(f"demo-pkg @ {url} \\\n    --hash=sha256:{sha}")
        assert good.returncode == 0, good.stderr
    finally:
        server.shutdown()
        server.server_close()
    # --compile-bytecode: the installed module's bytecode is there before any import of it.
    assert list(venv.glob("lib/python*/site-packages/demo_pkg/__pycache__/__init__.*.pyc")), list(venv.rglob("*.pyc"))
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import demo_pkg; print(demo_pkg.VALUE)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stdout.strip() == "42", out.stderr


def test_a_vm_fetches_a_large_source_and_starts_the_command(tmp_path, monkeypatch, gcs):  # noqa: F811
    monkeypatch.setattr(workload_release, "INLINE_SOURCE_BYTES", 100)
    rendered = render(command_stack(tmp_path))
    assert rendered.workload_source_object is not None
    gcs.put(BUCKET, rendered.workload_source_object, rendered.workload_source)
    attributes = {"agent-worker-number": "2", "tpu-env": TPU_ENV, "multislice-run-dir": RUN_DIR}
    (tmp_path / "vm").mkdir()
    machine = Vm(tmp_path / "vm", rendered.text, attributes, gcs)
    with machine.metadata:
        result = machine.run()
        assert result.returncode == 0, result.stdout
        lines = prefixed(result.stdout)
        assert f"workload source: fetching gs://{BUCKET}/{rendered.workload_source_object}" in lines
        release = machine.home / "releases" / rendered.release_id
        assert (release / "workload" / "train.py").read_text() == "print('training')\n"
        unit = (machine.unit_dir / "multislice-trainer.service").read_text()
        assert f"trainer.sh command {machine.bin / 'python'} {RUN_DIR} " in unit and "PYTHONPATH" not in unit
        argv = machine.argv(1)
        assert argv[1:6] == ["-m", "training.workload", "run", "--spec", f"{release.resolve()}/workload.json"]
        assert argv[6:] == ["--run-dir", RUN_DIR, "--bin", str(machine.bin.resolve())]
        # A corrupt source stops the boot with a message naming it.
        gcs.put(BUCKET, rendered.workload_source_object, b"not the source")
        (release / "workload").rename(release / "gone")
        result = machine.run()
        assert result.returncode != 0 and "is corrupt: sha256" in result.stdout

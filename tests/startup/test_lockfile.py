"""infra/startup/lockfile.py: the VM's pinned requirements are a complete, minimal, deterministic
closure of the trainer's dependencies taken from uv.lock. (Reading the lock:
tests/startup/test_uv_lock.py; the VM as a target: tests/startup/test_install_target.py.)"""

from __future__ import annotations

import ast
import importlib.metadata
import shutil
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from infra.startup import lockfile
from infra.startup.bundle import bundle_files
from infra.startup.install_target import InstallTarget
from infra.startup.uv_lock import LockfileError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pinned() -> lockfile.PinnedRequirements:
    return lockfile.pinned_requirements(ROOT)


def _training_imports() -> dict[str, str]:
    """Top-level names of absolute imports anywhere in the training/*.py a VM runs (the bundle:
    not ``MACHINE_ONLY_PACKAGES``, which only the user's machine runs) → first file seen."""
    found: dict[str, str] = {}
    for path in bundle_files(ROOT / "training"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], path.name)
    return found


def test_training_imports_are_satisfied_by_the_closure(pinned):
    imports = _training_imports()
    third_party = {
        name: where
        for name, where in imports.items()
        if name not in sys.stdlib_module_names and name not in ("training", "__future__")
    }
    assert "infra" not in third_party, "training/ must not import infra/ (it ships to the VMs)"
    assert third_party, "expected training/ to import jax, numpy, …"
    dists = importlib.metadata.packages_distributions()
    problems = []
    for name, where in sorted(third_party.items()):
        # Not installed here (e.g. gcsfs comes only with the tpu extra): assume the import
        # name is the distribution name.
        providers = {canonicalize_name(d) for d in dists.get(name, [])} or {canonicalize_name(name)}
        if not providers & set(pinned.names):
            problems.append(f"{where}: import {name}: provided by {sorted(providers)}, none in the VM requirements")
    assert not problems, "\n".join(problems)


def test_roots_and_tpu_extra_present(pinned):
    for root in lockfile.TRAINER_REQUIREMENTS:
        assert root in pinned, root
    # jax[tpu] brings libtpu (and requests); the tpu extra brings gcsfs (gs:// for orbax/epath).
    for name in ("libtpu", "requests", "gcsfs", "jaxlib"):
        assert name in pinned, name
    assert pinned["jax"].version == pinned["jaxlib"].version


def test_closure_contains_no_infra_only_packages(pinned):
    for name in ("pulumi", "pulumi-gcp", "google-cloud-tpu", "pytest", "uv", "multislice"):
        assert name not in pinned, name


def test_closure_is_dependency_complete(pinned):
    """Every dependency (from the installed distributions' own metadata) of a pinned package
    that is installed here is pinned too: the closure is closed."""
    missing = []
    for package in pinned.packages:
        try:
            requires = importlib.metadata.requires(package.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # e.g. libtpu / gcsfs: not in the local environment
        for text in requires:
            req = Requirement(text)
            if req.marker is None or all(req.marker.evaluate(env) for env in pinned.target.marker_values()):
                if canonicalize_name(req.name) not in pinned:
                    missing.append(f"{package.name} needs {req}")
    assert not missing, missing


def test_versions_match_the_local_environment(pinned):
    """This machine is also Linux x86_64 CPython 3.11 synced from the same lock."""
    for package in pinned.packages:
        try:
            installed = importlib.metadata.version(package.name)
        except importlib.metadata.PackageNotFoundError:
            continue
        assert installed == package.version, package.name


def test_one_hash_per_target_compatible_artifact(pinned):
    tags = set(pinned.target.tags)
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    by_key = {(canonicalize_name(p["name"]), p["version"]): p for p in lock["package"]}
    for package in pinned.packages:
        entry = by_key[(package.name, package.version)]
        compatible = {
            w["hash"].removeprefix("sha256:")
            for w in entry.get("wheels", [])
            if set(parse_wheel_filename(w["url"].rsplit("/", 1)[-1])[3]) & tags
        }
        assert not package.from_sdist, f"{package.name}: no wheel for the target"
        assert compatible, package.name
        assert list(package.hashes) == sorted(compatible), package.name
        assert len(set(package.hashes)) == len(package.hashes)
        for artifact in package.artifacts:
            assert artifact.filename.endswith(".whl")
            assert not any(bad in artifact.filename for bad in ("macosx", "win", "aarch64", "musllinux")), artifact


def test_requirements_text_format(pinned):
    text = pinned.text
    assert text.endswith("\n")
    blocks = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    names = [line.split("==")[0] for line in blocks]
    assert names == sorted(names)
    assert len(blocks) == len(pinned.packages)
    for line in blocks:
        assert "==" in line and line.endswith(" \\"), line
    hashes = [line.strip().rstrip(" \\") for line in text.splitlines() if line.startswith(" ")]
    assert all(h.startswith("--hash=sha256:") and len(h) == len("--hash=sha256:") + 64 for h in hashes)
    assert len(hashes) == sum(len(p.hashes) for p in pinned.packages)
    # Small enough for the startup script (`uv export`, with every hash of every file: ~170 KB).
    assert len(text.encode()) < 16 * 1024


def test_deterministic(pinned):
    again = lockfile.pinned_requirements(ROOT)
    assert again.text == pinned.text
    assert again.sha256 == pinned.sha256
    assert len(pinned.sha256) == 64


def test_pyproject_dependencies_include_every_root():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    for root in lockfile.TRAINER_REQUIREMENTS:
        assert canonicalize_name(root) in declared, root
    tpu = {Requirement(r).name: Requirement(r) for r in project["optional-dependencies"][lockfile.TPU_EXTRA]}
    assert "tpu" in tpu["jax"].extras


def test_pinned_uv_wheel():
    wheel = lockfile.pinned_uv(ROOT)
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    (uv,) = [p for p in lock["package"] if p["name"] == "uv"]
    assert wheel.version == uv["version"]
    assert "x86_64" in wheel.filename and "manylinux" in wheel.filename and "musllinux" not in wheel.filename
    assert {"url": wheel.url, "hash": f"sha256:{wheel.sha256}"}.items() <= next(
        w for w in uv["wheels"] if w["url"] == wheel.url
    ).items()
    assert wheel.requirement_text == f"uv=={wheel.version} \\\n    --hash=sha256:{wheel.sha256}\n"


def test_markers_follow_the_python_version():
    """numpy is locked twice (2.4.x below 3.12, 2.5.x above): the target picks one."""
    py311 = lockfile.pinned_requirements(ROOT, target=InstallTarget("3.11"))
    py312 = lockfile.pinned_requirements(ROOT, target=InstallTarget("3.12"))
    assert py311["numpy"].version != py312["numpy"].version
    assert all("cp312" in a.filename or "py3" in a.filename or "abi3" in a.filename for a in py312["numpy"].artifacts)
    assert py311.text != py312.text


def test_missing_root_names_the_package():
    with pytest.raises(LockfileError, match="'not-a-package'"):
        lockfile.pinned_requirements(ROOT, roots=("jax", "not-a-package"))
    with pytest.raises(LockfileError, match="extra 'gpu'"):
        lockfile.pinned_requirements(ROOT, extras=("gpu",))


def test_no_matching_artifact_names_the_package(tmp_path):
    """A lock whose only numpy artifacts are for another platform cannot be pinned."""
    text = (ROOT / "uv.lock").read_text()
    data = tomllib.loads(text)
    numpy = next(p for p in data["package"] if p["name"] == "numpy" and p["version"].startswith("2.4"))
    start = text.index(f'name = "numpy"\nversion = "{numpy["version"]}"')
    end = text.index("[[package]]", start)
    block = text[start:end]
    kept = [line for line in block.splitlines() if not ("x86_64" in line and "linux" in line) and "sdist" not in line]
    (tmp_path / "uv.lock").write_text(text[:start] + "\n".join(kept) + "\n\n" + text[end:])
    shutil.copy(ROOT / ".python-version", tmp_path / ".python-version")
    with pytest.raises(LockfileError, match=r"numpy==2\.4.*no wheel"):
        lockfile.pinned_requirements(tmp_path)

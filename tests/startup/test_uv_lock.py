"""infra/startup/uv_lock.py: reading uv.lock (packages by canonical name, edges resolved to entries,
artifacts with their sha256) and its errors, each naming the file or package."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.startup.uv_lock import PROJECT_NAME, Artifact, Lock, LockfileError, package_key

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lock() -> Lock:
    return Lock(ROOT / "uv.lock")


def test_the_project_and_its_packages(lock):
    project = lock.project()
    assert package_key(project) == (PROJECT_NAME, "0.1.0")
    assert "editable" in project["source"]
    assert [package_key(p) for p in lock.candidates("PyYAML")] == [("pyyaml", lock.candidates("pyyaml")[0]["version"])]
    assert lock.candidates("not-a-package") == []
    with pytest.raises(LockfileError, match="the project 'six' is not recorded"):
        lock.project("six")


def test_resolve_uses_version_and_source_when_a_name_is_locked_twice(lock):
    versions = sorted(p["version"] for p in lock.candidates("numpy"))
    assert len(versions) == 2  # numpy differs below and above Python 3.12
    with pytest.raises(LockfileError, match=rf"x → numpy: 'numpy' is ambiguous in uv.lock \(versions .*{versions[0]}"):
        lock.resolve({"name": "numpy"}, context="x → numpy")
    assert lock.resolve({"name": "numpy", "version": versions[1]}, context="x")["version"] == versions[1]
    with pytest.raises(LockfileError, match="x: 'numpy' is not in uv.lock"):
        lock.resolve({"name": "numpy", "version": "0.0.1"}, context="x")


def test_unreadable_locks_are_errors(tmp_path):
    with pytest.raises(LockfileError, match="does not exist; run `uv lock`"):
        Lock(tmp_path / "uv.lock")
    (tmp_path / "bad.lock").write_text("[[package]\n")
    with pytest.raises(LockfileError, match="is not valid TOML"):
        Lock(tmp_path / "bad.lock")
    (tmp_path / "empty.lock").write_text("version = 1\n")
    with pytest.raises(LockfileError, match=r"has no \[\[package\]\] entries"):
        Lock(tmp_path / "empty.lock")


def test_artifact_from_lock_entry():
    url = "https://files.example/packages/ab/cd/six-1.17.0-py2.py3-none-any.whl"
    artifact = Artifact.from_lock_entry({"url": url, "hash": "sha256:" + "a" * 64}, package="six==1.17.0")
    assert artifact == Artifact(filename="six-1.17.0-py2.py3-none-any.whl", url=url, sha256="a" * 64)
    with pytest.raises(LockfileError, match="six==1.17.0: lock entry .* has no URL or sha256 hash"):
        Artifact.from_lock_entry({"url": url, "hash": "md5:00"}, package="six==1.17.0")
    with pytest.raises(LockfileError, match="six==1.17.0"):
        Artifact.from_lock_entry({"hash": "sha256:" + "a" * 64}, package="six==1.17.0")

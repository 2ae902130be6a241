"""infra/startup/content_cache.py and the work cached by content: the trainer bundle
(``infra.startup.bundle.cached_bundle``), the xz stream of a release (``infra.startup.bundle.cached_compress``)
and the VM's pins (``infra.startup.lockfile.vm_pins``). A changed
input is a miss, an unchanged one (even with a new mtime) a hit; entries are atomic and
checked."""

from __future__ import annotations

import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra import startup
from infra.config import load_stack
from infra.startup import bundle, content_cache, lockfile
from infra.startup.content_cache import ContentCache, key_of

ROOT = Path(__file__).resolve().parents[2]


def _copy_project(dest: Path) -> Path:
    dest.mkdir(parents=True)
    shutil.copytree(ROOT / "training", dest / "training", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("uv.lock", "pyproject.toml", ".python-version"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture
def counted(monkeypatch):
    """Calls of the uncached computations, by name."""
    calls: list[str] = []
    real_build, real_pins, real_compress = bundle.build_bundle, lockfile.pinned_requirements, bundle.compress

    def build_bundle(training_dir, *args):
        calls.append("bundle")
        return real_build(training_dir, *args)

    def pinned_requirements(*args, **kwargs):
        calls.append("pins")
        return real_pins(*args, **kwargs)

    def compress(data, *args):
        calls.append("xz")
        return real_compress(data, *args)

    monkeypatch.setattr(bundle, "build_bundle", build_bundle)
    monkeypatch.setattr(bundle, "compress", compress)
    monkeypatch.setattr(lockfile, "pinned_requirements", pinned_requirements)
    return calls


def test_key_is_length_prefixed_and_typed_by_bytes():
    assert key_of("ab", "c") != key_of("a", "bc")
    assert key_of("é") == key_of("é".encode())
    assert key_of() != key_of("")


def test_store_round_trip_and_miss(tmp_path):
    cache = ContentCache(tmp_path / "c")
    assert cache.get("ns", "k") is None
    cache.put("ns", "k", b"payload\nwith lines")
    assert cache.get("ns", "k") == b"payload\nwith lines"
    assert cache.get("other", "k") is None
    assert [p.name for p in (tmp_path / "c").rglob("*") if p.is_file()] == ["k"]  # no temporary left


def test_corrupt_entry_is_a_miss_and_is_rewritten(tmp_path):
    cache = ContentCache(tmp_path)
    cache.put("ns", "k", b"good")
    entry = next(p for p in tmp_path.rglob("k"))
    entry.write_bytes(entry.read_bytes()[:-1] + b"X")  # a flipped byte
    assert cache.get("ns", "k") is None
    assert cache.get_or_compute("ns", "k", lambda: b"good") == b"good"
    assert cache.get("ns", "k") == b"good"
    entry.write_bytes(b"no checksum line")
    assert cache.get("ns", "k") is None


def test_unwritable_cache_still_computes(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache directory should be")
    cache = ContentCache(blocker)
    assert cache.get_or_compute("ns", "k", lambda: b"value") == b"value"
    assert cache.get("ns", "k") is None


def test_errors_are_not_cached(tmp_path):
    cache = ContentCache(tmp_path)

    def fail() -> bytes:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        cache.get_or_compute("ns", "k", fail)
    assert cache.get_or_compute("ns", "k", lambda: b"later") == b"later"


def test_concurrent_writers_leave_one_valid_entry(tmp_path):
    # Several processes store the same key at once (each writes many times): every reader in
    # between sees a whole entry or none, and the survivor verifies.
    code = (
        "import sys; from pathlib import Path; from infra.startup.content_cache import ContentCache\n"
        "c = ContentCache(Path(sys.argv[1])); payload = bytes(range(256)) * 4096\n"
        "for _ in range(30):\n"
        "    c.put('ns', 'k', payload)\n"
        "    got = c.get('ns', 'k')\n"
        "    assert got == payload, 'torn or corrupt entry read'\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert ContentCache(tmp_path).get("ns", "k") == bytes(range(256)) * 4096
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == ["k"]


def test_bundle_hits_on_same_content_and_misses_on_a_change(tmp_path, counted):
    project = _copy_project(tmp_path / "p")
    cache = ContentCache(tmp_path / "cache")
    first = bundle.cached_bundle(project / "training", cache)
    assert counted == ["bundle"]
    for path in (project / "training").glob("*.py"):
        os.utime(path, (1, 1))  # mtimes never invalidate
    assert bundle.cached_bundle(project / "training", ContentCache(tmp_path / "cache")) == first
    assert counted == ["bundle"]
    # A changed file: a miss, and the value is the uncached bundle of the new content.
    config = project / "training" / "config.py"
    config.write_text(config.read_text() + "\n# changed\n")
    second = bundle.cached_bundle(project / "training", cache)
    assert counted == ["bundle", "bundle"]
    assert second != first and second == bundle.build_bundle(project / "training")
    # A new file is a change too.
    (project / "training" / "extra.py").write_text("X = 1\n")
    bundle.cached_bundle(project / "training", cache)
    assert counted.count("bundle") == 4  # the miss and the reference build above


def test_bundle_key_covers_the_building_code(tmp_path, counted, monkeypatch):
    project = _copy_project(tmp_path / "p")
    cache = ContentCache(tmp_path / "cache")
    bundle.cached_bundle(project / "training", cache)
    fake_source = tmp_path / "bundle.py"
    fake_source.write_text(Path(bundle.__file__).read_text() + "\n# compresslevel changed\n")
    monkeypatch.setattr(bundle, "__file__", str(fake_source))
    bundle.cached_bundle(project / "training", cache)
    assert counted == ["bundle", "bundle"]


def test_release_compression_hits_on_same_content_and_misses_on_a_change(tmp_path, counted):
    cache = ContentCache(tmp_path / "cache")
    release = bundle.build_archive({"boot.sh": b"echo one\n", "training/a.py": b"A = 1\n"})
    first = bundle.cached_compress(release, cache)
    assert counted == ["xz"] and lzma.decompress(first) == release
    assert bundle.cached_compress(release, ContentCache(tmp_path / "cache")) == first
    assert counted == ["xz"]
    changed = bundle.build_archive({"boot.sh": b"echo two\n", "training/a.py": b"A = 1\n"})
    assert lzma.decompress(bundle.cached_compress(changed, cache)) == changed
    assert counted == ["xz", "xz"]
    bundle.cached_compress(release, cache, preset=1)  # another preset: another stream
    assert counted == ["xz", "xz", "xz"]


def test_pins_hit_on_same_content_and_miss_on_a_changed_lock(tmp_path, counted):
    project = _copy_project(tmp_path / "p")
    cache = ContentCache(tmp_path / "cache")
    uncached = lockfile.vm_pins(project)
    assert counted == ["pins"]
    assert lockfile.vm_pins(project, cache) == uncached
    assert lockfile.vm_pins(project, cache) == uncached
    os.utime(project / "uv.lock", (1, 1))
    assert lockfile.vm_pins(project, cache) == uncached
    assert counted == ["pins", "pins"]
    requirements = lockfile.pinned_requirements(project)
    assert uncached.requirements_text == requirements.text and uncached.requirements_sha256 == requirements.sha256
    assert uncached.uv_requirement_text == lockfile.pinned_uv(project).requirement_text
    del counted[:]
    # A changed lock (one wheel hash of a pinned package rewritten): a miss that sees it.
    digest = requirements.packages[0].hashes[0]
    lock = (project / "uv.lock").read_text()
    assert digest in lock
    (project / "uv.lock").write_text(lock.replace(digest, "0" * 64))
    changed = lockfile.vm_pins(project, cache)
    assert counted == ["pins"]
    assert "0" * 64 in changed.requirements_text and changed != uncached
    # And a changed .python-version.
    (project / ".python-version").write_text("3.12\n")
    assert lockfile.vm_pins(project, cache).python_version == "3.12"
    assert counted == ["pins", "pins"]


def test_a_broken_lock_still_fails_and_is_not_cached(tmp_path, counted):
    project = _copy_project(tmp_path / "p")
    (project / "uv.lock").unlink()
    cache = ContentCache(tmp_path / "cache")
    for _ in range(2):
        with pytest.raises(lockfile.LockfileError, match="uv.lock does not exist"):
            lockfile.vm_pins(project, cache)
    assert counted == ["pins", "pins"]


def test_render_uses_the_project_cache_and_gives_the_same_bytes(tmp_path, counted, monkeypatch):
    project = _copy_project(tmp_path / "p")
    monkeypatch.delenv(content_cache.CACHE_DIR_ENV, raising=False)
    config = load_stack("dev", ROOT / "stacks")
    first = startup.render(config, project_root=project)
    assert counted == ["bundle", "pins", "xz"]
    assert (project / ".multislice" / "cache").is_dir()
    second = startup.render(config, project_root=project)
    assert counted == ["bundle", "pins", "xz"]  # all hit
    assert second == first
    monkeypatch.setenv(content_cache.CACHE_DIR_ENV, str(tmp_path / "elsewhere"))
    assert startup.render(config, project_root=project) == first  # a cold cache: same bytes
    assert counted == ["bundle", "pins", "xz"] * 2
    assert (tmp_path / "elsewhere").is_dir()


def test_each_shipped_module_is_stripped_once_per_content(tmp_path, monkeypatch):
    """``bundle.cached_stripper``: the files are those the uncached function gives; again, nothing is
    stripped; a changed module alone is stripped again; another checkout of the same modules sharing
    the cache (a revision ``multislice diff`` renders) strips none."""
    project = _copy_project(tmp_path / "p")
    cache = ContentCache(tmp_path / "cache")
    expected = bundle.trainer_files(project / "training")
    stripped: list[bytes] = []
    real = bundle.strip_documentation

    def strip(source: bytes) -> bytes:
        stripped.append(source)
        return real(source)

    monkeypatch.setattr(bundle, "strip_documentation", strip)
    assert bundle.trainer_files(project / "training", cache) == expected
    assert len(stripped) == len(expected)
    assert bundle.trainer_files(project / "training", cache) == expected
    assert len(stripped) == len(expected)  # all hit
    with open(project / "training" / "model" / "transformer.py", "a") as module:
        module.write("CHANGED = 1  # a change\n")
    changed = bundle.trainer_files(project / "training", cache)
    assert len(stripped) == len(expected) + 1
    assert changed["training/model/transformer.py"].endswith(b"CHANGED = 1\n")
    other = _copy_project(tmp_path / "q")
    startup.render(load_stack("dev", ROOT / "stacks"), project_root=other, cache=cache)
    assert len(stripped) == len(expected) + 1
    assert not (other / ".multislice").exists()  # the cache given, not the checkout's

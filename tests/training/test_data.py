"""training.data.text and training.data.files: real text, per-step batches, host row slicing, bad sources."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from training.data.base import DataError
from training.data.files import _split_glob, _stdlib_files, is_eval_file, list_source_files
from training.data.text import ByteCorpus, TextDataset


@pytest.fixture(scope="module")
def stdlib_data():
    return TextDataset("stdlib", sequence_length=64, eval_fraction=0.05, seed=0)


def test_default_corpus_is_the_stdlib_source(stdlib_data):
    names = {f.relative for f in stdlib_data.train.corpus.files} | {f.relative for f in stdlib_data.eval.corpus.files}
    assert "os.py" in names and "json/decoder.py" in names
    assert stdlib_data.train.corpus.size > 5_000_000  # megabytes of real text, not a toy string


def test_train_and_eval_files_are_disjoint_and_split_by_path(stdlib_data):
    train = {f.relative for f in stdlib_data.train.corpus.files}
    held_out = {f.relative for f in stdlib_data.eval.corpus.files}
    assert train and held_out and not train & held_out
    assert all(is_eval_file(name, 0.05) for name in held_out)
    share = len(held_out) / (len(train) + len(held_out))
    assert 0.02 < share < 0.10


def test_rows_are_a_pure_function_of_the_step(stdlib_data):
    again = TextDataset("stdlib", sequence_length=64, eval_fraction=0.05, seed=0)
    a = stdlib_data.train_rows(7, 16, 0, 16)
    b = again.train_rows(7, 16, 0, 16)
    assert a.shape == (16, 65) and a.dtype == np.int32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, stdlib_data.train_rows(8, 16, 0, 16))
    other_seed = TextDataset("stdlib", sequence_length=64, eval_fraction=0.05, seed=1)
    assert not np.array_equal(a, other_seed.train_rows(7, 16, 0, 16))


def test_host_rows_are_slices_of_the_global_batch(stdlib_data):
    full = stdlib_data.train_rows(3, 8, 0, 8)
    np.testing.assert_array_equal(stdlib_data.train_rows(3, 8, 4, 8), full[4:])
    np.testing.assert_array_equal(stdlib_data.eval_rows(1, 8, 2, 5), stdlib_data.eval_rows(1, 8, 0, 8)[2:5])


def test_examples_are_windows_of_the_concatenated_files(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"0123456789")
    (tmp_path / "b.txt").write_bytes(b"abcdefghij")
    (tmp_path / "c.txt").write_bytes(b"ABCDEFGHIJ")
    corpus = ByteCorpus(list_source_files(str(tmp_path / "*.txt")))
    assert corpus.size == 33
    assert bytes(corpus.read(8, 6)) == b"89\nabc"
    assert bytes(corpus.read(20, 5)) == b"j\nABC"


def test_each_epoch_visits_every_example_once(tmp_path):
    (tmp_path / "a.txt").write_bytes(bytes(range(32, 127)) * 3)
    (tmp_path / "z.txt").write_bytes(b"held out? " * 20)
    ds = TextDataset(str(tmp_path / "*.txt"), sequence_length=8, eval_fraction=0.01, seed=3)
    n = ds.train.num_examples
    order = [ds.train_order[i] for i in range(n)]
    assert sorted(order) == list(range(n))
    assert [ds.train_order[i] for i in range(n, 2 * n)] != order  # reshuffled next epoch


def test_glob_matching_nothing_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match=r"training.data.source '.*nothing-\*.txt' matches no non-empty file"):
        TextDataset(str(tmp_path / "nothing-*.txt"), 8, 0.05, 0)


def test_corpus_shorter_than_one_sequence_is_a_clear_error(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"tiny")
    (tmp_path / "b.txt").write_bytes(b"tiny")
    with pytest.raises(DataError, match="fewer than one sequence"):
        TextDataset(str(tmp_path / "*.txt"), 64, 0.05, 0)


def test_gcs_glob_splits_into_bucket_prefix_and_pattern():
    assert _split_glob("gs://bucket/corpora/bytes/*.txt") == ("gs://bucket/corpora/bytes", "*.txt")
    assert _split_glob("/data/**/*.txt") == ("/data", "**/*.txt")


def test_a_gcs_glob_is_listed_and_read_through_the_storage_api(bucket):
    # The emulated Cloud Storage of tests/conftest.py, reached as a TPU VM reaches GCS.
    from etils import epath

    base = epath.Path(f"gs://{bucket}/corpora/bytes")
    for name, content in (
        ("a.txt", b"0123456789"),
        ("b.txt", b"abcdefghij"),
        ("c.txt", b"ABCDEFGHIJ"),
        ("d.md", b"no"),
        ("e.txt", b""),
    ):
        (base / name).write_bytes(content)
    files = list_source_files(f"gs://{bucket}/corpora/bytes/*.txt")
    assert [(f.relative, f.size) for f in files] == [("a.txt", 10), ("b.txt", 10), ("c.txt", 10)]  # empty e.txt skipped
    corpus = ByteCorpus(files)
    assert corpus.size == 33
    assert bytes(corpus.read(8, 6)) == b"89\nabc"
    assert bytes(corpus.read(20, 5)) == b"j\nABC"
    with pytest.raises(DataError, match="matches no non-empty file"):
        list_source_files(f"gs://{bucket}/corpora/none/*.txt")


def _rglob_stdlib_files(root: Path) -> list[tuple[str, str, int]]:
    """The definition the stdlib listing keeps: ``rglob("*.py")`` less site-packages and
    ``__pycache__``, empty files dropped, by relative path."""
    found = []
    for path in root.rglob("*.py"):
        relative = path.relative_to(root).as_posix()
        if "site-packages" not in relative and "__pycache__" not in relative and path.stat().st_size:
            found.append((str(path), relative, path.stat().st_size))
    return sorted(found, key=lambda f: f[1])


def _listed(files) -> list[tuple[str, str, int]]:
    return sorted(((f.path, f.relative, f.size) for f in files), key=lambda f: f[1])


def test_stdlib_listing_matches_rglob_on_the_real_stdlib():
    root = Path(sysconfig.get_paths()["stdlib"])
    assert _listed(list_source_files("stdlib")) == _rglob_stdlib_files(root)


def test_stdlib_listing_skips_packages_caches_and_symlinked_directories(tmp_path):
    for relative, text in {
        "a.py": "x = 1\n",
        "empty.py": "",
        "notes.txt": "not python\n",
        "pkg/b.py": "y = 2\n",
        "pkg/deep/c.py": "z = 3\n",
        "pkg/__pycache__/b.py": "cached\n",
        "site-packages/numpy/d.py": "installed\n",
        "lib/my-site-packages-copy/e.py": "installed too\n",
        ".hidden/f.py": "hidden\n",
    }.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    (tmp_path / "linked").symlink_to(tmp_path / "pkg", target_is_directory=True)  # not followed
    listed = _listed(_stdlib_files(tmp_path))
    assert listed == _rglob_stdlib_files(tmp_path)
    assert [relative for _, relative, _ in listed] == [".hidden/f.py", "a.py", "pkg/b.py", "pkg/deep/c.py"]


def test_the_readers_dependencies_are_imported_before_the_start_up_thread():
    # training.train.run opens the data set in a thread while its main thread goes on importing
    # (gcsfs's modules, reading the run directory). Importing grain runs etils'
    # `epy.lazy_imports()`, which swaps builtins.__import__ for the whole process while it lasts:
    # done in that thread, it made a main-thread import fail at random ("Relative import
    # statements not supported"; seen in test_trusted_restore on a loaded machine). Importing the
    # trainer must have imported both readers' dependencies already.
    code = "import sys, training.train; print(sorted(m for m in ('grain', 'training.data.tokens') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[-2] == "['grain', 'training.data.tokens']"

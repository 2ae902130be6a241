"""training.data.tokens: a prepared dataset read by row with ranged reads and prefetch; batches a
pure function of the step; damaged shards and small datasets stopped before training; the
model's vocabulary from the manifest (training.data.sources.with_vocabulary)."""

from __future__ import annotations

import concurrent.futures
import os
import threading

import numpy as np
import pytest

from tests.helpers.datasets import corpus
from training.config import TrainConfig, load_train_config
from training.data import tokens as token_data
from training.data.base import DataError
from training.data.sources import check_source, is_prepared_dataset, open_dataset, with_vocabulary
from training.data.storage import Storage, StorageError
from training.data.text import TextDataset
from training.prepare import shards as prepare


@pytest.fixture(scope="module")
def byte_dataset(tmp_path_factory) -> tuple[str, str]:
    """(source glob, dataset root): a byte dataset of several shards."""
    tmp = tmp_path_factory.mktemp("bytes")
    source = corpus(tmp)
    root = str(tmp / "ds")
    prepare.prepare(prepare.PrepareSpec(source, root, shard_mb=0.05))
    return source, root


def test_rows_equal_the_byte_readers_rows(byte_dataset):
    # A byte dataset holds the byte reader's text, and both cut and order examples alike.
    source, root = byte_dataset
    tokens = token_data.TokenDataset(root, 64, 16, seed=3)
    text = TextDataset(source, 64, 0.05, 3)
    assert tokens.train.num_examples == text.train.num_examples
    for step in (0, 7, 1000):
        rows = tokens.train_rows(step, 16, 0, 16)
        assert rows.dtype == np.int32 and rows.shape == (16, 65)
        np.testing.assert_array_equal(rows, text.train_rows(step, 16, 0, 16))
    np.testing.assert_array_equal(tokens.eval_rows(1, 16, 0, 16), text.eval_rows(1, 16, 0, 16))
    tokens.close()


def test_rows_are_a_pure_function_of_the_step_whatever_was_prefetched(byte_dataset):
    _, root = byte_dataset
    ahead = token_data.TokenDataset(root, 32, 8, seed=0, steps=50)
    in_order = [ahead.train_rows(step, 8, 2, 6) for step in range(10)]  # prefetched after the first
    fresh = token_data.TokenDataset(root, 32, 8, seed=0)
    for step in (9, 3, 0, 5):  # out of order: nothing prefetched matches
        np.testing.assert_array_equal(fresh.train_rows(step, 8, 2, 6), in_order[step])
        np.testing.assert_array_equal(fresh.train_rows(step, 8, 0, 8)[2:6], in_order[step])  # host rows
    other_seed = token_data.TokenDataset(root, 32, 8, seed=1)
    assert not np.array_equal(other_seed.train_rows(3, 8, 2, 6), in_order[3])
    for dataset in (ahead, fresh, other_seed):
        dataset.close()


def test_a_step_reads_only_its_rows_ranged_and_the_next_steps_ahead(byte_dataset, monkeypatch):
    _, root = byte_dataset
    reads: list[tuple[int, list[tuple[str, int, int]]]] = []
    real = Storage.read_ranges

    def recorded(self, ranges):
        reads.append((threading.get_ident(), ranges))
        return real(self, ranges)

    monkeypatch.setattr(Storage, "read_ranges", recorded)
    dataset = token_data.TokenDataset(root, 32, 8, seed=0, steps=4)
    reads.clear()
    dataset.train_rows(0, 8, 4, 8)
    # Let the prefetch finish before closing (close() drops reads that have not started yet,
    # which on a loaded machine can be either of the two).
    concurrent.futures.wait(list(dataset._pending.values()), timeout=60)
    dataset.close()
    # Step 0 here, steps 1 and 2 (PREFETCH_DEPTH) on the prefetch threads; step 3 is the run's last.
    assert len(reads) == 1 + token_data.PREFETCH_DEPTH
    assert [tid == threading.get_ident() for tid, _ in reads].count(True) == 1
    for _, ranges in reads:
        rows = len({(name, start) for name, start, _ in ranges})
        assert 4 <= rows <= 8  # four rows, a row over two shards is two ranges
        assert sum(end - start for _, start, end in ranges) == 4 * 33 * 2  # 4 rows × 33 uint16 tokens, no more
    monkeypatch.setattr(Storage, "read_ranges", real)
    again = token_data.TokenDataset(root, 32, 8, seed=0, steps=4)
    reads.clear()
    again.train_rows(3, 8, 4, 8)  # the last step: nothing beyond it is read
    again.close()
    assert reads == []


def test_a_failed_prefetch_raises_at_the_step_that_needs_it(byte_dataset, monkeypatch):
    _, root = byte_dataset
    dataset = token_data.TokenDataset(root, 32, 8, seed=0)
    real = dataset._read_train

    def failing(step, *args):
        if step == 2:
            raise OSError("injected read failure")
        return real(step, *args)

    monkeypatch.setattr(dataset, "_read_train", failing)
    dataset.train_rows(0, 8, 0, 8)
    dataset.train_rows(1, 8, 0, 8)
    with pytest.raises(OSError, match="injected read failure"):
        dataset.train_rows(2, 8, 0, 8)
    dataset.close()


@pytest.mark.parametrize("damage", ["truncated", "replaced", "missing"])
def test_a_damaged_shard_stops_training_before_the_first_step_naming_it(tmp_path, damage):
    source = corpus(tmp_path, files=6)
    root = tmp_path / "ds"
    prepare.prepare(prepare.PrepareSpec(source, str(root), shard_mb=0.05))
    shard = sorted(root.glob("train/*.bin"))[1]
    content = shard.read_bytes()
    if damage == "truncated":
        shard.write_bytes(content[: len(content) // 2])
    elif damage == "replaced":
        shard.write_bytes(bytes(reversed(content)))
    else:
        shard.unlink()
    expected = {
        "truncated": "bytes, the manifest says",
        "replaced": "does not match its checksum",
        "missing": "is missing",
    }
    with pytest.raises(DataError, match=rf"shard {root}/train/{shard.name} .*{expected[damage]}"):
        token_data.TokenDataset(str(root), 32, 8, seed=0)


def test_a_replaced_shard_in_the_bucket_is_caught_by_its_md5(tmp_path, bucket):
    source = corpus(tmp_path, files=6)
    root = f"gs://{bucket}/datasets/d"
    prepare.prepare(prepare.PrepareSpec(source, root, shard_mb=0.05))
    storage = Storage(root)
    original = storage.read("train/00000.bin")
    assert original is not None
    storage.write_bytes("train/00000.bin", bytes(reversed(original)))  # same size, other bytes
    with pytest.raises(DataError, match=r"shard gs://.*/train/00000.bin does not match its checksum: md5"):
        token_data.TokenDataset(root, 32, 8, seed=0)
    storage.write_bytes("train/00000.bin", original)
    dataset = token_data.TokenDataset(root, 32, 8, seed=0)
    local = token_data.TokenDataset(
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "l"), shard_mb=0.05)).manifest
        and str(tmp_path / "l"),
        32,
        8,
        seed=0,
    )
    np.testing.assert_array_equal(dataset.train_rows(5, 8, 0, 8), local.train_rows(5, 8, 0, 8))
    dataset.close()
    local.close()


def test_fewer_tokens_than_one_global_batch_is_a_clear_error(tmp_path):
    (tmp_path / "a.txt").write_text("a few words\n" * 20)
    (tmp_path / "b.txt").write_text("held out\n")
    prepare.prepare(prepare.PrepareSpec(str(tmp_path / "*.txt"), str(tmp_path / "ds")))
    with pytest.raises(DataError, match=r"the train split has \d+ tokens, fewer than one global batch needs"):
        token_data.TokenDataset(str(tmp_path / "ds"), 32, 16, seed=0)


def test_the_source_names_a_prepared_dataset_or_text(byte_dataset, tmp_path):
    source, root = byte_dataset
    config = TrainConfig.model_validate({"sequence_length": 32, "global_batch_size": 8, "data": {"source": root}})
    dataset = open_dataset(config)
    assert isinstance(dataset, token_data.TokenDataset) and dataset.vocab_size == 256
    dataset.close()
    assert not is_prepared_dataset(source) and not is_prepared_dataset(str(tmp_path))
    check_source(root)
    with pytest.raises(DataError, match="matches no non-empty file"):
        check_source(str(tmp_path / "nothing"))


def test_the_vocabulary_comes_from_the_data_unless_the_stack_sets_it():
    config = TrainConfig.model_validate({"parallelism": {"ici": {"tensor": 2}}})
    assert config.model.vocab_size is None and config.vocab_size == 256
    assert with_vocabulary(config, 600).vocab_size == 600
    padded = config.model_copy(update={"model": config.model.model_copy(update={"vocab_size": 640})})
    assert with_vocabulary(padded, 600).vocab_size == 640  # larger than the data's: padding
    small = config.model_copy(update={"model": config.model.model_copy(update={"vocab_size": 512})})
    with pytest.raises(
        DataError, match=r"training.model.vocab_size is 512, smaller than the vocabulary .* \(600 ids\)"
    ):
        with_vocabulary(small, 600)
    with pytest.raises(
        DataError, match="not divisible by the tensor mesh axis size 2; set training.model.vocab_size to 602"
    ):
        with_vocabulary(config, 601)
    with pytest.raises(ValueError, match="model.vocab_size: 601 is not divisible by the tensor mesh axis size 2"):
        load_train_config({"model": {"vocab_size": 601}, "parallelism": {"ici": {"tensor": 2}}})
    with pytest.raises(ValueError, match="model.vocab_size"):
        load_train_config({"model": {"vocab_size": 1}})


def test_a_local_object_or_shard_that_is_not_a_regular_file_is_refused_not_waited_on(tmp_path):
    # training.run_objects.file_bytes and open_regular: a FIFO would block the open, a device never ends.
    (tmp_path / "train").mkdir()
    os.mkfifo(tmp_path / "manifest.json")
    os.mkfifo(tmp_path / "train" / "00000.bin")
    storage = Storage(str(tmp_path))
    with pytest.raises(StorageError) as raised:
        storage.read("manifest.json")
    assert str(raised.value) == f"cannot read {tmp_path}/manifest.json: a FIFO, not a regular file"
    with pytest.raises(StorageError) as raised:
        storage.read_ranges([("train/00000.bin", 0, 4)])
    assert str(raised.value) == f"cannot read bytes 0-4 of {tmp_path}/train/00000.bin: a FIFO, not a regular file"
    storage.close()

"""training.prepare.shards: token shards and a manifest from text, with bytes, a tokenizer file or a
trained BPE; resumable after an interruption, never rewriting a finished dataset; bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.datasets import corpus
from training.data import manifest as manifest_lib
from training.data.storage import Storage
from training.data.text import TextDataset
from training.prepare import shards as prepare


def tokens_of(root: str, split: str) -> np.ndarray:
    manifest = manifest_lib.load(Storage(root))
    parts = [
        np.fromfile(f"{root}/{s.name}", dtype=f"<{np.dtype(manifest.dtype).str[1:]}")
        for s in manifest.splits[split].shards
    ]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=manifest.dtype)


def test_a_byte_dataset_holds_exactly_the_text_the_byte_reader_reads(tmp_path):
    source = corpus(tmp_path)
    out = str(tmp_path / "bytes")
    result = prepare.prepare(prepare.PrepareSpec(source, out, shard_mb=0.05))
    manifest = result.manifest
    assert (manifest.dtype, manifest.vocab_size, manifest.tokenizer.kind) == ("uint16", 256, "bytes")
    assert len(manifest.splits["train"].shards) > 2  # several shards: the corpus is several times a shard
    text = TextDataset(source, 8, 0.05, 0)
    expected = text.train.corpus.read(0, text.train.corpus.size)
    np.testing.assert_array_equal(tokens_of(out, "train"), expected)
    held_out = text.eval.corpus.read(0, text.eval.corpus.size)
    np.testing.assert_array_equal(tokens_of(out, "eval"), held_out)
    assert manifest.splits["train"].documents == len(text.train.corpus.files)
    for shard in manifest.splits["train"].shards:  # checksums of what is on disk
        assert Storage(out).sha256(shard.name) == shard.sha256
    assert json.loads((tmp_path / "bytes" / "manifest.json").read_text())["format"] == "multislice-tokens"


def test_a_big_file_is_cut_into_pieces_after_newlines(tmp_path):
    lines = [f"line {i} " + "x" * (i % 50) + "\n" for i in range(4000)]
    (tmp_path / "big.txt").write_text("".join(lines))
    (tmp_path / "small.txt").write_text("held out\n" * 10)
    out = str(tmp_path / "ds")
    result = prepare.prepare(prepare.PrepareSpec(str(tmp_path / "*.txt"), out, shard_mb=0.02, eval_fraction=0.01))
    shards = result.manifest.splits["train"].shards
    assert len(shards) >= 5
    contents = [Path(out, s.name).read_bytes()[::2] for s in shards]  # uint16 bytes: the low byte is the text
    assert all(c.endswith(b"\n") for c in contents)  # every piece ends after a newline
    assert b"".join(contents) == "".join(lines).encode() + b"\n"  # nothing lost or doubled at the cuts


def test_a_trained_bpe_and_a_tokenizer_file_give_the_same_tokens(tmp_path):
    source = corpus(tmp_path)
    bpe = str(tmp_path / "bpe")
    result = prepare.prepare(prepare.PrepareSpec(source, bpe, tokenizer="bpe", vocab_size=600, shard_mb=0.1))
    manifest = result.manifest
    assert (manifest.tokenizer.kind, manifest.vocab_size, manifest.dtype) == ("bpe", 600, "uint16")
    stored = Path(bpe, "tokenizer.json")
    import hashlib

    assert manifest.tokenizer.sha256 == hashlib.sha256(stored.read_bytes()).hexdigest()
    train = tokens_of(bpe, "train")
    assert train.max() < 600 and len(train) < manifest.splits["train"].source_bytes / 2  # real merges
    assert (train == manifest.tokenizer.separator[0]).sum() == manifest.splits["train"].documents
    # The same tokenizer given as a file: the same shards, bit for bit.
    again = prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "file"), tokenizer=str(stored), shard_mb=0.1))
    assert again.manifest.tokenizer.kind == "file"
    assert [s.sha256 for s in again.manifest.splits["train"].shards] == [
        s.sha256 for s in manifest.splits["train"].shards
    ]


def test_a_large_vocabulary_is_stored_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(70_000)} | {"[UNK]": 70_000}
    path = tmp_path / "big-vocab.json"
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    word_level.save(str(path))
    (tmp_path / "a.txt").write_text("t1 t69999 t2\n" * 50)
    result = prepare.prepare(prepare.PrepareSpec(str(tmp_path / "a.txt"), str(tmp_path / "ds"), tokenizer=str(path)))
    assert (result.manifest.dtype, result.manifest.vocab_size) == ("uint32", 70_001)
    assert 69_999 in tokens_of(str(tmp_path / "ds"), "train")
    with pytest.raises(prepare.PrepareError, match=r"70,001 tokens, more than uint16 holds \(65,536 ids\)"):
        prepare.prepare(
            prepare.PrepareSpec(str(tmp_path / "a.txt"), str(tmp_path / "ds16"), tokenizer=str(path), dtype="uint16")
        )


def test_an_interrupted_prepare_resumes_writing_only_the_missing_shards(tmp_path, monkeypatch):
    source = corpus(tmp_path)
    reference = prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "reference"), shard_mb=0.05)).manifest
    out = tmp_path / "ds"
    real_write = prepare._write_shard
    calls = []

    def interrupted(storage, name, *args):
        calls.append(name)
        if len(calls) == 3:  # a kill while the third shard is written: its staging file is half full
            staged = storage.local_staging(name)
            staged.write_bytes(b"half")
            raise KeyboardInterrupt
        return real_write(storage, name, *args)

    monkeypatch.setattr(prepare, "_write_shard", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare(prepare.PrepareSpec(source, str(out), shard_mb=0.05))
    assert not (out / "manifest.json").exists()
    finished = {name: (out / name).stat().st_mtime_ns for name in calls[:2]}
    third = out / calls[2]
    assert not third.exists()  # never visible under its name unfinished
    monkeypatch.setattr(prepare, "_write_shard", real_write)
    result = prepare.prepare(prepare.PrepareSpec(source, str(out), shard_mb=0.05))
    assert sorted(result.kept) == sorted(calls[:2]) and calls[2] in result.written
    assert {name: (out / name).stat().st_mtime_ns for name in calls[:2]} == finished  # not rewritten
    assert result.manifest.splits == reference.splits  # the same dataset as an uninterrupted run
    assert not list(out.glob("*/*.tmp-*"))  # the interrupted run's staging file is gone


def test_a_shard_damaged_before_the_manifest_is_written_again(tmp_path, monkeypatch):
    source = corpus(tmp_path, files=6)
    out = tmp_path / "ds"
    real_manifest = prepare.Manifest.to_json
    monkeypatch.setattr(prepare.Manifest, "to_json", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare(prepare.PrepareSpec(source, str(out), shard_mb=0.05))
    monkeypatch.setattr(prepare.Manifest, "to_json", real_manifest)
    damaged = sorted(out.glob("train/*.bin"))[0]
    damaged.write_bytes(damaged.read_bytes()[:-10])
    result = prepare.prepare(prepare.PrepareSpec(source, str(out), shard_mb=0.05))
    assert result.written == [f"train/{damaged.name}"]
    manifest_lib.verify_shards(Storage(str(out)), result.manifest)


def test_a_finished_dataset_is_never_rewritten(tmp_path):
    source = corpus(tmp_path, files=4)
    out = tmp_path / "ds"
    prepare.prepare(prepare.PrepareSpec(source, str(out)))
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    again = prepare.prepare(prepare.PrepareSpec(source, str(out)))
    assert again.already_prepared and again.written == []
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == stamps
    with pytest.raises(prepare.PrepareError, match="already holds a dataset prepared from"):
        prepare.prepare(prepare.PrepareSpec("stdlib", str(out)))


def test_an_unfinished_prepare_of_other_options_is_refused(tmp_path, monkeypatch):
    source = corpus(tmp_path, files=4)
    monkeypatch.setattr(prepare, "_write_shard", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "ds")))
    with pytest.raises(
        prepare.PrepareError, match="holds an unfinished prepare of another source listing or other options"
    ):
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "ds"), shard_mb=1.0))


def test_bad_input_is_one_clear_error(tmp_path):
    source = corpus(tmp_path, files=3)
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": "1.0", "model": {"type": "nonsense"')
    with pytest.raises(prepare.PrepareError, match=r"tokenizer file .*bad.json does not parse as a Hugging Face"):
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "a"), tokenizer=str(bad)))
    with pytest.raises(prepare.PrepareError, match="cannot read the tokenizer file"):
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "b"), tokenizer=str(tmp_path / "none.json")))
    with pytest.raises(prepare.PrepareError, match="--tokenizer bpe needs --vocab-size"):
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "c"), tokenizer="bpe"))
    with pytest.raises(prepare.PrepareError, match="the source .*matches no non-empty file"):
        prepare.prepare(prepare.PrepareSpec(str(tmp_path / "none-*.txt"), str(tmp_path / "d")))
    assert not any((tmp_path / name).exists() for name in "abcd")  # nothing written


def test_a_tokenizer_file_or_a_stored_plan_past_its_bounds_is_one_clear_error(tmp_path, monkeypatch):
    import os

    from training.prepare import text_stream
    from training.run_objects import UnreadableObject

    source = corpus(tmp_path, files=3)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)  # reading it whole would wait for a writer: refused on its descriptor
    with pytest.raises(prepare.PrepareError, match=r"fifo.json \(--tokenizer\): it is not a file"):
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "a"), tokenizer=str(fifo)))  # checked first
    with pytest.raises(prepare.PrepareError) as raised:  # and when it became one since: refused on its descriptor
        prepare._tokenizer(prepare.PrepareSpec(source, str(tmp_path / "a"), tokenizer=str(fifo)), None, [], [])
    assert str(raised.value) == f"cannot read the tokenizer file {fifo}: a FIFO, not a regular file"
    with pytest.raises(UnreadableObject, match=rf"^cannot read {fifo}: a FIFO, not a regular file$"):  # source text
        list(text_stream.segments(str(fifo), 0, 10, 10))
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 65)
    monkeypatch.setattr(prepare, "MAX_OBJECT_BYTES", 64)
    with pytest.raises(prepare.PrepareError, match=rf"^the tokenizer file {big} is over 64 bytes, the most read; "):
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "b"), tokenizer=str(big)))
    plan = tmp_path / "c" / "prepare" / "plan.json"
    plan.parent.mkdir(parents=True)
    plan.write_bytes(b"[" * 100_000)  # nested past the parser: a RecursionError, were it not bounded
    with pytest.raises(prepare.PrepareError) as raised:
        prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "c")))
    assert str(raised.value) == (
        f"{plan} is not a plan a prepare wrote (JSON nested deeper than this reader takes); delete {tmp_path / 'c'}"
    )


def test_a_gs_dataset_is_written_through_the_storage_api(tmp_path, bucket):
    source = corpus(tmp_path, files=6)
    out = f"gs://{bucket}/datasets/small"
    result = prepare.prepare(prepare.PrepareSpec(source, out, shard_mb=0.05))
    storage = Storage(out)
    assert manifest_lib.is_dataset(storage)
    for shard in result.manifest.splits["train"].shards:
        info = storage.info(shard.name)
        assert info is not None and (info.size, info.md5) == (shard.bytes, shard.md5)  # the server's own MD5
    local = prepare.prepare(prepare.PrepareSpec(source, str(tmp_path / "local"), shard_mb=0.05)).manifest
    assert [s.sha256 for s in result.manifest.splits["train"].shards] == [
        s.sha256 for s in local.splits["train"].shards
    ]

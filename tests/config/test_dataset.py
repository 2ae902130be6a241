"""infra.config.dataset: a stack's prepared dataset (its manifest.json, local or gs://) against
the model's vocabulary before any resource exists; skipped with one warning when unreadable."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import vm_contract as contract
from infra.config import StackConfigError, dataset as dataset_lib
from infra.config.dataset import DatasetCheck, check_dataset, manifest_location
from tests.fakes.queued_resource import clear_ambient_credentials, refuse_connections
from tests.helpers.datasets import VOCAB, prepared
from tests.planner.stacks import stack
from training.data import manifest as manifest_lib
from training.data.storage import Storage

VOCAB_KEY = "multislice:training.model.vocab_size"
SOURCE_KEY = "multislice:training.data.source"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("dataset")
    return prepared(str(root / "bpe"), root / "text")


def with_manifest(root: Path, dataset: str, **tokenizer) -> str:
    """A copy of ``dataset``'s manifest at ``root`` with tokenizer fields changed (the check reads
    the manifest only)."""
    real = manifest_lib.load(Storage(dataset))
    changed = real.model_copy(update={"tokenizer": real.tokenizer.model_copy(update=tokenizer)})
    root.mkdir(parents=True)
    (root / manifest_lib.MANIFEST).write_bytes(changed.to_json())
    return str(root)


def on(source: str, model: dict | None = None, **training) -> dict:
    return {
        "data": {"source": source},
        "model": {"d_model": 256, "n_layers": 2, "n_heads": 4, **(model or {})},
    } | training


def refused(config) -> list[str]:
    with pytest.raises(StackConfigError) as err:
        check_dataset(config)
    return err.value.lines


def test_a_vocabulary_smaller_than_the_manifests_names_the_key_and_both_numbers(dataset):
    lines = refused(stack(training=on(dataset, {"vocab_size": 256})))
    assert len(lines) == 1 and lines[0].startswith(f"{VOCAB_KEY}: 256 is smaller than"), lines
    assert f"({VOCAB} ids in its manifest.json)" in lines[0] and dataset in lines[0]
    assert f"at least {VOCAB}" in lines[0]


def test_an_unset_vocabulary_takes_the_manifests_for_the_plan(dataset):
    config = stack(training=on(dataset))
    checked = check_dataset(config)
    assert (checked.manifest, checked.vocab_size, checked.warning) == (f"{dataset}/manifest.json", VOCAB, None)
    assert checked.config.training.vocab_size == VOCAB and checked.config.training.model.vocab_size == VOCAB
    assert config.training.model.vocab_size is None  # the stack as written is untouched
    larger = stack(training=on(dataset, {"vocab_size": 512}))
    assert check_dataset(larger) == DatasetCheck(larger, f"{dataset}/manifest.json", VOCAB)


def test_a_tensor_axis_that_does_not_divide_the_manifests_vocabulary_names_the_key(dataset):
    tensor = {"parallelism": {"ici": {"fsdp": 1, "tensor": 4}, "dcn": {"data": 2}}}
    lines = refused(stack(training=on(dataset, **tensor)))
    assert len(lines) == 1 and lines[0].startswith(f"{VOCAB_KEY}: unset"), lines
    assert "tensor mesh axis size 4" in lines[0] and f"to {VOCAB + 2}" in lines[0]
    check_dataset(stack(training=on(dataset, {"vocab_size": VOCAB + 2}, **tensor)))  # padded: accepted


def test_a_presets_vocabulary_smaller_than_the_manifests_names_the_preset(dataset, tmp_path):
    big = with_manifest(tmp_path / "big", dataset, vocab_size=40_000)  # above llama-2's 32,000
    model = {"preset": "llama-2-7b", "d_model": 256, "n_layers": 2, "n_heads": 4, "d_ff": 512}
    lines = refused(stack(training=on(big, model)))
    assert len(lines) == 1 and lines[0].startswith("multislice:training.model.preset: llama-2-7b's vocabulary"), lines
    assert "32,000" in lines[0] and "40,000" in lines[0] and f"set {VOCAB_KEY} to at least 40000" in lines[0]
    check_dataset(stack(training=on(big, model | {"vocab_size": 40_000})))  # the override wins


def test_a_manifest_the_trainer_would_refuse_fails_naming_the_source(dataset, tmp_path):
    wide = with_manifest(tmp_path / "wide", dataset, vocab_size=70_000)  # more ids than its uint16 holds
    lines = refused(stack(training=on(wide, {"vocab_size": 70_000})))
    assert len(lines) == 1 and lines[0].startswith(f"{SOURCE_KEY}: ") and "does not fit its dtype uint16" in lines[0]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    lines = refused(stack(training=on(str(broken))))
    assert len(lines) == 1 and lines[0].startswith(f"{SOURCE_KEY}: ") and "is not a dataset manifest" in lines[0]


def test_an_unreadable_manifest_is_one_warning_naming_the_source(tmp_path):
    for source, reason in [
        (str(tmp_path / "elsewhere"), "does not exist on this machine"),
        (str(tmp_path), f"{tmp_path}/manifest.json does not exist (not prepared yet?)"),
    ]:
        config = stack(training=on(source))
        checked = check_dataset(config)
        assert checked.config is config and checked.vocab_size is None
        assert checked.warning is not None and checked.warning.startswith(f"{SOURCE_KEY} {source}: ")
        assert "was not checked" in checked.warning and reason in checked.warning


def test_a_fifo_or_an_oversized_manifest_is_one_warning_not_a_wait(tmp_path, monkeypatch):
    import os

    from training import run_objects

    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "manifest.json")  # reading it whole would wait for a writer: refused on its descriptor
    big = tmp_path / "big"
    big.mkdir()
    (big / "manifest.json").write_bytes(b" " * 65)
    monkeypatch.setattr(run_objects, "MAX_OBJECT_BYTES", 64)  # the most the manifest's reader decodes
    for source, reason in [
        (fifo, f"cannot read {fifo}/manifest.json: a FIFO, not a regular file"),
        (big, f"cannot read {big}/manifest.json: 65 bytes, over the 64 read"),
    ]:
        checked = check_dataset(stack(training=on(str(source))))
        assert checked.warning is not None and f"({reason}); no action needed: " in checked.warning


def test_byte_sources_read_nothing(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("some text\n")
    for source in ("stdlib", f"{tmp_path}/*.txt", str(text), "gs://acme-corpora/text/*.txt"):
        assert manifest_location(source) is None
        config = stack(training=on(source))
        assert check_dataset(config) == DatasetCheck(config)
    assert manifest_location("gs://b/datasets/web/") == "gs://b/datasets/web/manifest.json"


def test_a_gs_dataset_is_read_from_cloud_storage(bucket, tmp_path):
    root = prepared(f"gs://{bucket}/datasets/bpe", tmp_path / "text")
    lines = refused(stack(training=on(root, {"vocab_size": 256})))
    assert len(lines) == 1 and lines[0].startswith(f"{VOCAB_KEY}: 256 is smaller") and f"({VOCAB} ids" in lines[0]
    checked = check_dataset(stack(training=on(root)))
    assert (checked.manifest, checked.config.training.vocab_size) == (f"{root}/manifest.json", VOCAB)

    missing = f"gs://{bucket}/datasets/later"
    warning = check_dataset(stack(training=on(missing))).warning
    assert warning is not None and warning.startswith(f"{SOURCE_KEY} {missing}: ") and "does not exist" in warning
    Storage(f"gs://{bucket}/text").write_bytes("corpus.txt", b"some text\n")  # one object: read as bytes
    object_source = stack(training=on(f"gs://{bucket}/text/corpus.txt"))
    assert check_dataset(object_source) == DatasetCheck(object_source)


def test_a_gs_dataset_without_credentials_sends_nothing(monkeypatch, tmp_path):
    assert dataset_lib.EMULATOR_ENV == contract.STORAGE_ENDPOINT_ENV  # what the emulation sets
    monkeypatch.delenv(dataset_lib.EMULATOR_ENV, raising=False)
    clear_ambient_credentials(monkeypatch, tmp_path)
    attempts = refuse_connections(monkeypatch)
    source = "gs://acme-ml-prod-corpora/datasets/web"
    warning = check_dataset(stack(training=on(source))).warning
    assert warning is not None and warning.startswith(f"{SOURCE_KEY} {source}: ")
    assert "no Google Cloud credentials found" in warning
    assert attempts == []


def test_a_command_stack_is_not_checked(dataset):
    config = stack(training=on(dataset, {"vocab_size": 256}))
    command = config.model_copy(update={"workload": object()})  # any workload: the trainer does not run
    assert check_dataset(command).config is command

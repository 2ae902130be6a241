"""training.train on a prepared dataset (a BPE of 512 tokens) in the emulated bucket: the model's
vocabulary comes from the manifest, and a crash or a preemption then a resume give the losses
of an uninterrupted run bit for bit, as on bytes (tests/training/test_train.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import uuid

import pytest

from tests.helpers.datasets import corpus
from tests.helpers.train_runs import CONFIG, SINGLE, losses
from training import train
from training.checkpoint import manager as checkpointing
from training.config import TrainConfig
from training.data.tokens import TokenDataset
from training.model import transformer as model
from training.prepare import shards as prepare
from training.run_dir import RunDir

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
logging.getLogger("asyncio").disabled = True  # as tests/training/test_train.py


@pytest.fixture(scope="module")
def dataset(gcs_server, tmp_path_factory) -> str:
    """gs://<bucket>/datasets/bpe512: 40 files of the standard library, BPE of 512 tokens."""
    name = f"prepared-{uuid.uuid4().hex[:12]}"
    gcs_server.create_bucket(name)
    root = f"gs://{name}/datasets/bpe512"
    text = corpus(tmp_path_factory.mktemp("text"), files=40)
    prepare.prepare(prepare.PrepareSpec(text, root, tokenizer="bpe", vocab_size=512, shard_mb=0.2))
    return root


@pytest.fixture(scope="module")
def config(dataset) -> TrainConfig:
    return CONFIG.model_copy(update={"data": CONFIG.data.model_copy(update={"source": dataset})})


@pytest.fixture(scope="module")
def uninterrupted(dataset, config) -> str:
    run_dir = f"{dataset.rsplit('/datasets/', 1)[0]}/runs/uninterrupted"
    result = train.run(config, run_dir, SINGLE)
    assert result.exit_code == train.EXIT_COMPLETE and result.step == 12
    return run_dir


def new_run(dataset: str) -> str:
    return f"{dataset.rsplit('/datasets/', 1)[0]}/runs/{uuid.uuid4().hex[:8]}"


def test_the_model_takes_the_manifests_vocabulary(uninterrupted, config):
    recorded = json.loads(RunDir(uninterrupted).read("train_config.json"))
    assert recorded["model"]["vocab_size"] is None  # as the stack gives it: the data decides
    assert all(loss < 6.3 for _, loss in losses(uninterrupted)[-3:])  # below ln(512): it learns


def test_crash_then_resume_gives_bit_identical_losses(uninterrupted, config, dataset, monkeypatch):
    run_dir = new_run(dataset)
    real_rows = TokenDataset.train_rows

    def crash_at_step_9(self, step, *args):
        if step == 9:
            raise RuntimeError("injected crash")
        return real_rows(self, step, *args)

    monkeypatch.setattr(TokenDataset, "train_rows", crash_at_step_9)
    shapes = []
    real_init = model.init_params
    monkeypatch.setattr(
        model, "init_params", lambda cfg, vocab_size, key: shapes.append(vocab_size) or real_init(cfg, vocab_size, key)
    )
    with pytest.raises(RuntimeError, match="injected crash"):
        train.run(config, run_dir, SINGLE)
    assert shapes and set(shapes) == {512}  # the embedding and unembedding have the manifest's 512 rows
    monkeypatch.setattr(TokenDataset, "train_rows", real_rows)
    result = train.run(config, run_dir, SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_COMPLETE, 12)
    resumed = losses(run_dir)
    assert dict(resumed) == dict(losses(uninterrupted))  # bit for bit: floats compared exactly
    assert [s for s, _ in resumed[-4:]] == [9, 10, 11, 12]


def test_sigterm_saves_then_resume_completes_bit_identically(uninterrupted, config, dataset, monkeypatch):
    config = config.model_copy(update={"checkpoint": config.checkpoint.model_copy(update={"async_save": False})})
    run_dir = new_run(dataset)
    real_rows = TokenDataset.train_rows

    def preempt_at_step_5(self, step, *args):
        if step == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_rows(self, step, *args)

    monkeypatch.setattr(TokenDataset, "train_rows", preempt_at_step_5)
    result = train.run(config, run_dir, SINGLE)
    assert (result.exit_code, result.step) == (train.EXIT_PREEMPTED, 6)
    monkeypatch.setattr(TokenDataset, "train_rows", real_rows)
    assert train.run(config, run_dir, SINGLE).exit_code == train.EXIT_COMPLETE
    assert dict(losses(run_dir)) == dict(losses(uninterrupted))
    assert [s for s, _ in losses(run_dir)] == list(range(1, 13))


def test_a_stack_vocabulary_smaller_than_the_manifests_is_a_config_error(config, dataset, caplog):
    small = config.model_copy(update={"model": config.model.model_copy(update={"vocab_size": 256})})
    with caplog.at_level(logging.ERROR, logger="training"):
        assert train.main(small, new_run(dataset), SINGLE) == train.EXIT_CONFIG
    assert "training.model.vocab_size is 256, smaller than the vocabulary of training.data.source" in caplog.text
    assert "(512 ids)" in caplog.text


def test_a_damaged_shard_is_a_config_error_before_any_step(config, dataset, caplog):
    from training.data.storage import Storage

    storage = Storage(dataset)
    original = storage.read("train/00001.bin")
    assert original is not None
    storage.write_bytes("train/00001.bin", original[:-2])
    run_dir = new_run(dataset)
    try:
        with caplog.at_level(logging.ERROR, logger="training"):
            assert train.main(config, run_dir, SINGLE) == train.EXIT_CONFIG
    finally:
        storage.write_bytes("train/00001.bin", original)
    assert f"shard {dataset}/train/00001.bin has" in caplog.text
    assert RunDir(run_dir).read("train_config.json") is None  # stopped before anything was recorded


def test_a_run_recorded_before_vocab_size_existed_is_the_same_run(uninterrupted, config, dataset):
    recorded = json.loads(RunDir(uninterrupted).read("train_config.json"))
    del recorded["model"]["vocab_size"]
    older = RunDir(new_run(dataset))
    older.write("train_config.json", json.dumps(recorded).encode())
    checkpointing.check_run_config(older, config)  # no mismatch
    bigger = config.model_copy(update={"model": config.model.model_copy(update={"vocab_size": 1024})})
    with pytest.raises(checkpointing.RunConfigMismatch, match="different training.model"):
        checkpointing.check_run_config(older, bigger)

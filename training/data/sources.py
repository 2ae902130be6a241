"""Which reader a data source names, and the model vocabulary it implies.

``DataConfig.source`` is a prepared dataset (a directory or ``gs://`` prefix holding a
``manifest.json``, made by ``data prepare``), read by row as tokens
(:class:`training.data.tokens.TokenDataset`), or else text files read as bytes
(:class:`training.data.text.TextDataset`): :func:`open_dataset` chooses.
"""

from __future__ import annotations

from pathlib import Path

from training.config import TrainConfig, vocabulary_mismatch
from training.data import manifest
from training.data.base import DataError, Dataset
from training.data.files import list_source_files
from training.data.storage import Storage


def is_prepared_dataset(source: str) -> bool:
    """True if ``source`` (no wildcard) is a directory or prefix holding a dataset manifest."""

    if source == "stdlib" or any(ch in source for ch in "*?["):
        return False
    if "://" not in source and not Path(source).is_dir():
        return False
    return manifest.is_dataset(Storage(source))


def open_dataset(config: TrainConfig) -> Dataset:
    """The dataset of ``config`` (a TrainConfig): a prepared dataset when ``training.data.source``
    names one (:func:`is_prepared_dataset`), else the byte reader.

    Raises:
      DataError: the source cannot be read, is too small, or is a damaged dataset.
    """
    # The readers are imported here: they import grain, and with it jax, which a source check
    # (check_source, run by `multislice local up`) does without. The trainer imports both before
    # its start-up thread calls this (training.train says why).
    from training.data.text import TextDataset
    from training.data.tokens import TokenDataset

    data = config.data
    if is_prepared_dataset(data.source):
        return TokenDataset(data.source, config.sequence_length, config.global_batch_size, data.seed, config.steps)
    return TextDataset(data.source, config.sequence_length, data.eval_fraction, data.seed)


def check_source(source: str) -> None:
    """Raise DataError if ``source`` can be neither a prepared dataset nor a non-empty glob."""
    if not is_prepared_dataset(source):
        list_source_files(source)


def with_vocabulary(config: TrainConfig, vocab_size: int) -> TrainConfig:
    """``config`` (a TrainConfig) with ``model.vocab_size`` set from the data when it is None.

    Raises:
      DataError: the config's vocabulary is smaller than the data's (naming both), or the
        tensor mesh axis does not divide the vocabulary.
    """
    stated = config.model.vocab_size
    tensor = config.parallelism.mesh_shape["tensor"]
    mismatch = vocabulary_mismatch(stated, vocab_size, tensor)
    if mismatch == "smaller":
        raise DataError(
            f"training.model.vocab_size is {stated}, smaller than the vocabulary of training.data.source "
            f"{config.data.source!r} ({vocab_size} ids); set it to at least {vocab_size} or leave it out"
        )
    resolved = stated if stated is not None else vocab_size
    if mismatch == "indivisible":
        padded = -(-resolved // tensor) * tensor
        raise DataError(
            f"the vocabulary of {resolved} ids ({'training.model.vocab_size' if stated else 'from the data'}) is not "
            f"divisible by the tensor mesh axis size {tensor}; set training.model.vocab_size to {padded}"
        )
    return config.model_copy(update={"model": config.model.model_copy(update={"vocab_size": resolved})})

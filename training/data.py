"""Training text as bytes, with batches that are a pure function of the step.

Source (``DataConfig.source``):

* ``"stdlib"``: the ``*.py`` files of the running Python's standard library
  (``sysconfig.get_paths()['stdlib']``, ``site-packages`` excluded) — real text on any
  machine with Python. Different Python builds ship slightly different files, so two
  machines agree byte for byte only on the same Python build (every emulated VM shares one;
  every real VM installs the same pinned Python).
* a glob of files, local (``/data/*.txt``) or Cloud Storage (``gs://bucket/dir/*.txt``, read
  through etils.epath, which needs gcsfs on the VM);
* a prepared dataset (``gs://bucket/datasets/<name>`` or a local directory holding a
  ``manifest.json``, made by ``data prepare``: :mod:`training.prepare`), read by row as tokens
  (:class:`training.token_data.TokenDataset`); :func:`open_dataset` chooses.

Files are split into train and eval by a hash of their relative path (stable when files
are added or removed), then each split is a virtual concatenation of its files (sorted by
path, each followed by a newline). Example ``i`` is the window of ``sequence_length + 1``
bytes starting at ``i × sequence_length``.

Order: ``grain.MapDataset.range(n).shuffle(seed).repeat()`` — a random-access permutation,
reshuffled every epoch. Row ``r`` of the global batch of step ``s`` (0-based) is example
``order[s × global_batch + r]``: nothing depends on history, so a run resumed at any step
reads exactly the data an uninterrupted run would have read (no loader position to save or
lose at a preemption). Each host reads only its own rows
(``training.mesh.process_batch_rows``).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import hashlib
import logging
import os
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from etils import epath

from training.config import vocabulary_mismatch

if TYPE_CHECKING:
    from training.token_data import TokenDataset

log = logging.getLogger(__name__)

SEPARATOR = b"\n"
#: Byte-level vocabulary: one token per byte.
BYTE_VOCAB_SIZE = 256


class DataError(ValueError):
    """The configured data source cannot be read or is too small."""


@dataclasses.dataclass(frozen=True)
class SourceFile:
    path: str  # local path or gs:// URI
    relative: str  # stable name used for the train/eval split
    size: int  # bytes, separator excluded


def list_source_files(source: str) -> list[SourceFile]:
    """Files of a data source, sorted by relative path.

    Raises:
      DataError: the glob matches no non-empty file.
    """
    files: list[SourceFile] = []
    if source == "stdlib":
        files = _stdlib_files(Path(sysconfig.get_paths()["stdlib"]))
    elif "://" in source:  # epath's glob (no "**": each level is one listing request)
        bucket_path, glob = _split_glob(source)
        for path in sorted(epath.Path(bucket_path).glob(glob), key=str):
            stat = path.stat()
            if stat.length:
                files.append(SourceFile(str(path), str(path)[len(bucket_path) :].lstrip("/"), stat.length))
    else:
        base, glob = _split_glob(source)
        root = Path(base)
        for path in sorted(root.glob(glob)) if glob else [root]:
            if path.is_file() and path.stat().st_size:
                files.append(
                    SourceFile(str(path), path.relative_to(root).as_posix() if glob else path.name, path.stat().st_size)
                )
    if not files:
        raise DataError(f"training.data.source {source!r} matches no non-empty file")
    return sorted(files, key=lambda f: f.relative)


def _stdlib_files(root: Path) -> list[SourceFile]:
    """The ``*.py`` files under the standard library's directory ``root`` (symlinked
    directories not followed, as ``Path.rglob`` does), none under a ``site-packages`` or
    ``__pycache__`` directory. One ``os.walk`` that never enters those directories: every
    start of the trainer builds this list, and ``rglob`` plus a filter walked the installed
    packages too (0.37 s of CPU per process start on the development machine, now 0.02 s;
    docs/goodput.md, "Start-up")."""
    files: list[SourceFile] = []
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if "site-packages" not in d and "__pycache__" not in d]
        prefix = os.path.relpath(directory, root).replace(os.sep, "/")
        for name in names:
            if not name.endswith(".py") or "site-packages" in name or "__pycache__" in name:
                continue
            path = os.path.join(directory, name)
            size = os.stat(path).st_size
            if size:
                files.append(SourceFile(path, name if prefix == "." else f"{prefix}/{name}", size))
    return files


def _split_glob(source: str) -> tuple[str, str]:
    """Split ``dir/sub/*.txt`` into the longest wildcard-free directory and the pattern."""
    parts = source.split("/")
    for index, part in enumerate(parts):
        if any(ch in part for ch in "*?["):
            return "/".join(parts[:index]) or "/", "/".join(parts[index:])
    return source, ""


def is_eval_file(relative: str, eval_fraction: float) -> bool:
    """Deterministic split: the first 8 bytes of sha256(relative path) as a fraction."""
    digest = hashlib.sha256(relative.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < eval_fraction


class ByteCorpus:
    """A read-only concatenation of files (each followed by ``SEPARATOR``), read lazily."""

    def __init__(self, files: list[SourceFile]):
        self.files = files
        self.starts = [0]
        for f in files:
            self.starts.append(self.starts[-1] + f.size + len(SEPARATOR))
        self.size = self.starts[-1]

    # One cache of at most 64 files for all corpora; it keeps a corpus alive, which lives as long as the run anyway.
    @functools.lru_cache(maxsize=64)  # noqa: B019
    def _file_bytes(self, index: int) -> np.ndarray:
        path = self.files[index].path
        data = epath.Path(path).read_bytes()
        if len(data) != self.files[index].size:
            raise DataError(f"{path} changed size while training ({self.files[index].size} -> {len(data)} bytes)")
        return np.frombuffer(data + SEPARATOR, dtype=np.uint8)

    def read(self, offset: int, length: int) -> np.ndarray:
        """``length`` bytes from ``offset`` of the concatenation, as uint8."""
        out = np.empty(length, dtype=np.uint8)
        filled = 0
        index = bisect.bisect_right(self.starts, offset) - 1
        while filled < length:
            data = self._file_bytes(index)
            begin = offset + filled - self.starts[index]
            chunk = data[begin : begin + length - filled]
            out[filled : filled + len(chunk)] = chunk
            filled += len(chunk)
            index += 1
        return out


@dataclasses.dataclass
class Split:
    corpus: ByteCorpus
    num_examples: int


class TextDataset:
    """Train/eval examples of ``sequence_length + 1`` bytes; batches by step (``vocab_size`` 256).

    Args:
      source: ``"stdlib"`` or a glob (see module docstring).
      sequence_length: tokens per example input; examples carry one more byte (the target).
      eval_fraction: share of files held out.
      seed: example order seed.

    Raises:
      DataError: no files, or a split shorter than one example.
    """

    def __init__(self, source: str, sequence_length: int, eval_fraction: float, seed: int):
        files = list_source_files(source)
        train = [f for f in files if not is_eval_file(f.relative, eval_fraction)]
        held_out = [f for f in files if is_eval_file(f.relative, eval_fraction)]
        if not held_out and len(train) > 1:  # tiny corpora: still hold one file out
            held_out, train = train[-1:], train[:-1]
        self.sequence_length = sequence_length
        self.vocab_size = BYTE_VOCAB_SIZE
        self.train = self._split(train, "train")
        self.eval = self._split(held_out or train, "eval")
        import grain  # here: it imports jax, which `data prepare` (training.prepare) does without

        self.train_order = grain.MapDataset.range(self.train.num_examples).shuffle(seed=seed).repeat()
        log.info(
            "data %s: %d train files (%.1f MB, %d examples), %d eval files (%d examples)",
            source,
            len(train),
            self.train.corpus.size / 1e6,
            self.train.num_examples,
            len(held_out),
            self.eval.num_examples,
        )

    def _split(self, files: list[SourceFile], name: str) -> Split:
        corpus = ByteCorpus(files)
        count = (corpus.size - 1) // self.sequence_length
        if count < 1:
            raise DataError(
                f"the {name} split has {corpus.size} bytes, fewer than one sequence of "
                f"{self.sequence_length + 1}; add data or shorten training.sequence_length"
            )
        return Split(corpus, count)

    def _example(self, split: Split, index: int) -> np.ndarray:
        return split.corpus.read(index * self.sequence_length, self.sequence_length + 1)

    def _train_index(self, position: int) -> int:
        index = self.train_order[position]
        assert index is not None  # grain's None is a filtered-out element: a shuffled range has none
        return index

    def train_rows(self, step: int, global_batch_size: int, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of the global batch for 0-based ``step``: int32 ``[stop-start, S+1]``."""
        base = step * global_batch_size
        rows = [self._example(self.train, self._train_index(base + r)) for r in range(start, stop)]
        return np.stack(rows).astype(np.int32)

    def eval_rows(self, batch: int, global_batch_size: int, start: int, stop: int) -> np.ndarray:
        """Rows of eval batch ``batch``: consecutive held-out examples (no shuffling)."""
        base = batch * global_batch_size
        n = self.eval.num_examples
        rows = [self._example(self.eval, (base + r) % n) for r in range(start, stop)]
        return np.stack(rows).astype(np.int32)

    def close(self) -> None:
        """Nothing to release (files are read whole and cached); :class:`TokenDataset` has one too."""


def is_prepared_dataset(source: str) -> bool:
    """True if ``source`` (no wildcard) is a directory or prefix holding a dataset manifest."""
    from training import manifest
    from training.shard_io import Storage

    if source == "stdlib" or any(ch in source for ch in "*?["):
        return False
    if "://" not in source and not Path(source).is_dir():
        return False
    return manifest.is_dataset(Storage(source))


def open_dataset(config) -> TextDataset | TokenDataset:
    """The dataset of ``config`` (a TrainConfig): a prepared dataset when ``training.data.source``
    names one (:func:`is_prepared_dataset`), else the byte reader.

    Raises:
      DataError: the source cannot be read, is too small, or is a damaged dataset.
    """
    data = config.data
    if is_prepared_dataset(data.source):
        from training.token_data import TokenDataset

        return TokenDataset(data.source, config.sequence_length, config.global_batch_size, data.seed, config.steps)
    return TextDataset(data.source, config.sequence_length, data.eval_fraction, data.seed)


def check_source(source: str) -> None:
    """Raise DataError if ``source`` can be neither a prepared dataset nor a non-empty glob."""
    if not is_prepared_dataset(source):
        list_source_files(source)


def with_vocabulary(config, vocab_size: int):
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

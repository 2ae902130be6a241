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
  ``manifest.json``, made by ``data prepare``: :mod:`training.prepare.shards`) is read by row as
  tokens instead (:class:`training.data.tokens.TokenDataset`); :func:`training.data.sources.open_dataset`
  chooses.

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
import logging

# At the top, not where it is used: importing grain swaps builtins.__import__ for a moment
# (training.train says why that matters), so it happens when this module is imported.
import grain
import numpy as np
from etils import epath

from training.data.base import DataError
from training.data.files import SourceFile, is_eval_file, list_source_files

log = logging.getLogger(__name__)

SEPARATOR = b"\n"
#: Byte-level vocabulary: one token per byte.
BYTE_VOCAB_SIZE = 256


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

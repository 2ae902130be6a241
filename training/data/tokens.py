"""A prepared dataset (``data prepare``) read by row: batches that are a pure function of the step.

Each split is the concatenation of its shards (:mod:`training.data.manifest`). Example ``i`` is the
window of ``sequence_length + 1`` tokens starting at token ``i × sequence_length``, as
:class:`training.data.text.TextDataset` cuts bytes. Order: ``grain.MapDataset.range(n).shuffle(seed)
.repeat()``; row ``r`` of the global batch of step ``s`` is example ``order[s × global_batch +
r]``: nothing depends on history, so a resumed run reads exactly what an uninterrupted one would.

Reading: a process reads only its own rows ``[start, stop)`` (``training.mesh.process_batch_rows``),
each row with one ranged read per shard it spans (:meth:`training.data.storage.Storage.read_ranges`;
the rows of one step go out as one concurrent batch), never a whole shard.

Prefetch: :data:`PREFETCH_DEPTH` steps ahead on a thread pool of that many threads. When step
``s`` is asked for, steps ``s + 1 … s + depth`` are submitted, so the reads of the next steps
overlap the current step's compute. Depth 2: one step's reads may be slow (a Cloud Storage
request's tail latency) while the next is already read, and the host memory it costs is two
batches of this process's rows (``2 × rows × (sequence_length + 1) × 4`` bytes). What a step
returns does not depend on the prefetch: a read that failed raises at the step that needs it.

Before the first step, every shard is checked against the manifest
(:func:`training.data.manifest.verify_shards`): a truncated or replaced shard stops the run with its
name before any training.
"""

from __future__ import annotations

import bisect
import logging
from concurrent.futures import Future, ThreadPoolExecutor

import grain
import numpy as np

from training.data import manifest as manifest_lib
from training.data.base import DataError
from training.data.storage import Storage, StorageError

log = logging.getLogger(__name__)

#: Steps read ahead of the step being computed (module docstring).
PREFETCH_DEPTH = 2


class _Split:
    """One split of the dataset as a virtual concatenation of its shards."""

    def __init__(self, storage: Storage, shards: list[manifest_lib.Shard], dtype: str, sequence_length: int):
        self.storage = storage
        self.names = [s.name for s in shards if s.tokens]
        self.starts = [0]
        for shard in shards:
            if shard.tokens:
                self.starts.append(self.starts[-1] + shard.tokens)
        self.tokens = self.starts[-1]
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.sequence_length = sequence_length
        self.num_examples = max(0, (self.tokens - 1) // sequence_length)

    def ranges(self, example: int) -> list[tuple[str, int, int]]:
        """Byte ranges ``(shard, start, end)`` holding example ``example``."""
        begin = example * self.sequence_length
        end = begin + self.sequence_length + 1
        out = []
        index = bisect.bisect_right(self.starts, begin) - 1
        while begin < end:
            stop = min(end, self.starts[index + 1])
            offset = self.starts[index]
            itemsize = self.dtype.itemsize
            out.append((self.names[index], (begin - offset) * itemsize, (stop - offset) * itemsize))
            begin = stop
            index += 1
        return out

    def read(self, examples: list[int]) -> np.ndarray:
        """int32 ``[len(examples), sequence_length + 1]``."""
        spans = [self.ranges(e) for e in examples]
        chunks = iter(self.storage.read_ranges([r for span in spans for r in span]))
        rows = [b"".join(next(chunks) for _ in span) for span in spans]
        return np.frombuffer(b"".join(rows), dtype=self.dtype).reshape(len(examples), -1).astype(np.int32)


class TokenDataset:
    """Train/eval examples of a prepared dataset; batches by step (module docstring).

    Args:
      root: the dataset (local directory or ``gs://bucket/datasets/<name>``).
      sequence_length: tokens per example input; examples carry one more token (the target).
      global_batch_size: sequences per step (the train split must hold at least one batch).
      seed: example order seed.
      steps: the run's last step; nothing is prefetched beyond it.

    Attributes:
      vocab_size: the manifest's vocabulary.

    Raises:
      DataError: (from :func:`training.data.sources.open_dataset`) the manifest or a shard is bad, or the
        train split holds fewer tokens than one global batch.
    """

    def __init__(self, root: str, sequence_length: int, global_batch_size: int, seed: int, steps: int | None = None):
        self.storage = Storage(root)
        try:
            self.manifest = manifest_lib.load(self.storage)
            manifest_lib.verify_shards(self.storage, self.manifest)
        except (manifest_lib.ManifestError, StorageError) as err:
            raise DataError(f"training.data.source {root}: {err}") from None
        self.vocab_size = self.manifest.vocab_size
        self.sequence_length = sequence_length
        self.train = _Split(self.storage, self.manifest.splits["train"].shards, self.manifest.dtype, sequence_length)
        needed = global_batch_size * sequence_length + 1
        if self.train.num_examples < global_batch_size:
            raise DataError(
                f"training.data.source {root}: the train split has {self.train.tokens:,} tokens, fewer than one global "
                f"batch needs ({global_batch_size} sequences × sequence_length {sequence_length} + 1 = {needed:,}); "
                "prepare more text or lower training.global_batch_size or training.sequence_length"
            )
        eval_split = _Split(self.storage, self.manifest.splits["eval"].shards, self.manifest.dtype, sequence_length)
        self.eval = eval_split if eval_split.num_examples else self.train
        self.train_order = grain.MapDataset.range(self.train.num_examples).shuffle(seed=seed).repeat()
        self.steps = steps
        self._pool = ThreadPoolExecutor(max_workers=PREFETCH_DEPTH, thread_name_prefix="prefetch")
        self._pending: dict[tuple[int, int, int, int], Future] = {}
        tokenizer = self.manifest.tokenizer
        log.info(
            "data %s: prepared dataset, tokenizer %s (%d ids, %s), %d train tokens (%d examples), %d eval tokens",
            root,
            tokenizer.kind,
            self.vocab_size,
            self.manifest.dtype,
            self.train.tokens,
            self.train.num_examples,
            self.eval.tokens,
        )

    def _read_train(self, step: int, global_batch_size: int, start: int, stop: int) -> np.ndarray:
        base = step * global_batch_size
        examples = []
        for r in range(start, stop):
            index = self.train_order[base + r]
            assert index is not None  # grain's None is a filtered-out element: a shuffled range has none
            examples.append(index)
        return self.train.read(examples)

    def train_rows(self, step: int, global_batch_size: int, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of the global batch for 0-based ``step``: int32 ``[stop-start, S+1]``;
        submits the next :data:`PREFETCH_DEPTH` steps' reads."""
        key = (step, global_batch_size, start, stop)
        future = self._pending.pop(key, None)
        for old in [k for k in self._pending if k[0] <= step or k[1:] != key[1:]]:
            self._pending.pop(old).cancel()
        last = self.steps if self.steps is not None else step + PREFETCH_DEPTH + 1
        for ahead in range(step + 1, min(step + PREFETCH_DEPTH, last - 1) + 1):
            next_key = (ahead, global_batch_size, start, stop)
            if next_key not in self._pending:
                self._pending[next_key] = self._pool.submit(self._read_train, *next_key)
        if future is None:
            return self._read_train(step, global_batch_size, start, stop)
        return future.result()

    def eval_rows(self, batch: int, global_batch_size: int, start: int, stop: int) -> np.ndarray:
        """Rows of eval batch ``batch``: consecutive held-out examples (no shuffling)."""
        base = batch * global_batch_size
        n = self.eval.num_examples
        return self.eval.read([(base + r) % n for r in range(start, stop)])

    def close(self) -> None:
        """Stop prefetching (pending reads are dropped) and close local shard files."""
        for future in self._pending.values():
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True)
        self.storage.close()

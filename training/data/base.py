"""What every dataset reader shares: the error a source that cannot be read raises, and the
interface the training loop reads batches through (:class:`Dataset`), which the byte reader
(:class:`training.data.text.TextDataset`) and the token reader
(:class:`training.data.tokens.TokenDataset`) both implement. Which one a source names:
:mod:`training.data.sources`."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class DataError(ValueError):
    """The configured data source cannot be read or is too small."""


class Dataset(Protocol):
    """Train and eval batches of ``sequence_length + 1`` token ids, a pure function of the step.

    Attributes:
      vocab_size: token ids are in ``[0, vocab_size)``.
    """

    vocab_size: int

    def train_rows(self, step: int, global_batch_size: int, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of the global batch of 0-based ``step``: int32 ``[stop - start, S + 1]``."""
        ...

    def eval_rows(self, batch: int, global_batch_size: int, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of eval batch ``batch``: int32 ``[stop - start, S + 1]``."""
        ...

    def close(self) -> None:
        """Release threads and files; the dataset is not used after it."""
        ...

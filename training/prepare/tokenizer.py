"""The tokenizers ``data prepare`` can use: bytes, a Hugging Face tokenizer file, or a BPE
trained on the source.

* ``bytes``: one token per byte (ids 0–255), the trainer's embedded default; documents are
  separated by a newline byte, so a prepared byte dataset holds exactly the text
  :class:`training.data.text.ByteCorpus` reads.
* a tokenizer file: the JSON a Hugging Face ``tokenizers.Tokenizer`` saves
  (https://huggingface.co/docs/tokenizers/api/tokenizer#tokenizers.Tokenizer.from_file), local
  or ``gs://``; documents are separated by its end-of-text token when it has one of the usual
  names (:data:`SEPARATOR_NAMES`), else by the ids of ``"\\n"``.
* ``bpe``: a byte-level BPE of a stated vocabulary size trained on the source's train split
  with ``tokenizers``' ``BpeTrainer`` (GPT-2's scheme: byte-level pre-tokenizer and decoder,
  https://huggingface.co/docs/tokenizers/api/trainers#tokenizers.trainers.BpeTrainer), with
  ``<|endoftext|>`` as its separator.

Encoding goes through ``Tokenizer.encode_batch_fast`` (no character offsets), which runs the
batch on every core (Rust's rayon thread pool; ``RAYON_NUM_THREADS`` caps it) outside Python's
GIL, without the model's special tokens (``add_special_tokens=False``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable

import numpy as np

#: End-of-document token names looked up in a tokenizer file, in this order (GPT-2/Llama 3's,
#: SentencePiece's, Llama 3's end of text, Gemma's).
SEPARATOR_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
#: The separator token a trained BPE gets (GPT-2's).
BPE_SEPARATOR = "<|endoftext|>"
BYTE_VOCAB_SIZE = 256


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded, parsed or trained; the message says which and why."""


@dataclasses.dataclass
class Tokenizer:
    """A tokenizer for ``data prepare``.

    Attributes:
      kind: ``bytes``, ``file`` or ``bpe``.
      vocab_size: ids are in ``[0, vocab_size)`` (added tokens included).
      separator: ids appended after every document.
      json: the Hugging Face tokenizer JSON (None for bytes).
      origin: where it came from (a path, ``trained``, or None for bytes).
    """

    kind: str
    vocab_size: int
    separator: list[int]
    json: bytes | None = None
    origin: str | None = None
    _hf: object = None

    @property
    def sha256(self) -> str | None:
        return hashlib.sha256(self.json).hexdigest() if self.json is not None else None

    def encode(self, texts: list[bytes]) -> list[np.ndarray]:
        """Token ids of each text (UTF-8 bytes; invalid sequences become U+FFFD for a Hugging
        Face tokenizer), as uint32 arrays (uint8 for bytes)."""
        if self._hf is None:
            return [np.frombuffer(text, dtype=np.uint8) for text in texts]
        decoded = [text.decode("utf-8", errors="replace") for text in texts]
        encodings = self._hf.encode_batch_fast(decoded, add_special_tokens=False)  # type: ignore[attr-defined]
        return [np.asarray(e.ids, dtype=np.uint32) for e in encodings]


def byte_tokenizer() -> Tokenizer:
    return Tokenizer("bytes", BYTE_VOCAB_SIZE, [ord("\n")])


def from_json(data: bytes, origin: str, kind: str = "file") -> Tokenizer:
    """A tokenizer from Hugging Face tokenizer JSON.

    Raises:
      TokenizerError: the JSON does not parse as a tokenizer (naming ``origin``).
    """
    from tokenizers import Tokenizer as HfTokenizer

    try:
        hf = HfTokenizer.from_str(data.decode("utf-8"))
    except Exception as err:  # tokenizers raises a plain Exception with serde's message
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise TokenizerError(
            f"the tokenizer file {origin} does not parse as a Hugging Face tokenizers JSON file: {first}"
        ) from None
    vocab_size = hf.get_vocab_size(with_added_tokens=True)
    if vocab_size < 2:
        raise TokenizerError(f"the tokenizer file {origin} has a vocabulary of {vocab_size} tokens")
    separator = next((hf.token_to_id(name) for name in SEPARATOR_NAMES if hf.token_to_id(name) is not None), None)
    ids = [separator] if separator is not None else hf.encode("\n", add_special_tokens=False).ids
    return Tokenizer(kind, vocab_size, list(ids), data, origin, hf)


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE with ``vocab_size`` ids (``<|endoftext|>`` included) trained on ``texts``.

    Raises:
      TokenizerError: ``vocab_size`` is below the 256 byte symbols plus the separator.
    """
    from tokenizers import Tokenizer as HfTokenizer, decoders, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise TokenizerError(
            f"a byte-level BPE needs a vocabulary of at least {len(alphabet) + 1} (256 bytes and {BPE_SEPARATOR}); "
            f"got --vocab-size {vocab_size}"
        )
    hf = HfTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BPE_SEPARATOR], initial_alphabet=alphabet, show_progress=False
    )
    hf.train_from_iterator(texts, trainer)
    return from_json(hf.to_str().encode(), "trained", kind="bpe")

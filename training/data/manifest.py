"""A prepared dataset's manifest (``<root>/manifest.json``) and its checks.

Layout of a dataset root (local directory or ``gs://bucket/datasets/<name>``)::

    manifest.json           written last: its presence means every shard is complete
    tokenizer.json          the Hugging Face tokenizer (absent for the byte tokenizer)
    train/00000.bin ...     token shards: little-endian uint16 or uint32 tokens, no header
    eval/00000.bin ...
    prepare/                prepare's records: its plan and one record per finished shard (how a re-run resumes)

A shard is a flat array of token ids, the format of nanoGPT's ``train.bin``
(https://github.com/karpathy/nanoGPT/blob/master/data/openwebtext/prepare.py: ``np.memmap``
of uint16), so token ``i`` of a shard is the bytes ``[i × itemsize, (i + 1) × itemsize)``:
a reader fetches any window with one ranged read. Each split is the concatenation of its
shards in order; each source document (file) is followed by the tokenizer's separator.

The token dtype is uint16 when every id fits (vocabulary ≤ 65,536), else uint32
(:func:`token_dtype`), as nanoGPT does for GPT-2's 50,257 tokens.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pydantic
from pydantic import Field

from training.data.storage import Storage
from training.run_objects import json_record

MANIFEST = "manifest.json"
TOKENIZER_FILE = "tokenizer.json"
FORMAT = "multislice-tokens"
VERSION = 1
SPLITS = ("train", "eval")

#: Largest vocabulary of each token dtype: every id in [0, vocabulary) must fit.
DTYPE_LIMITS = {"uint16": 1 << 16, "uint32": 1 << 32}


class ManifestError(ValueError):
    """A dataset's manifest is missing, unreadable, or disagrees with its shards."""


def token_dtype(vocab_size: int, requested: str = "auto") -> str:
    """``uint16`` when the vocabulary fits (≤ 65,536 ids), else ``uint32``; or the requested one.

    Raises:
      ManifestError: the requested dtype cannot hold the vocabulary, or the vocabulary is
        larger than uint32 can hold.
    """
    if requested == "auto":
        requested = "uint16" if vocab_size <= DTYPE_LIMITS["uint16"] else "uint32"
    if requested not in DTYPE_LIMITS:
        raise ManifestError(f"token dtype {requested!r} is not one of auto, uint16, uint32")
    if vocab_size > DTYPE_LIMITS[requested]:
        raise ManifestError(
            f"the vocabulary has {vocab_size:,} tokens, more than {requested} holds ({DTYPE_LIMITS[requested]:,} ids); "
            + ("use --dtype uint32 (or auto)" if requested == "uint16" else "no token dtype holds it")
        )
    return requested


class Shard(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    name: str = Field(description="Object name under the dataset root, e.g. train/00000.bin.")
    tokens: int = Field(ge=0)
    bytes: int = Field(ge=0, description="tokens × itemsize.")
    sha256: str = Field(description="Hex sha256 of the shard's bytes.")
    md5: str = Field(description="Base64 MD5 of the shard's bytes (Cloud Storage's md5Hash).")
    documents: int = Field(ge=0)


class Split(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    tokens: int = Field(ge=0)
    documents: int = Field(ge=0)
    source_bytes: int = Field(ge=0)
    shards: list[Shard]


class TokenizerRecord(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    kind: Literal["bytes", "file", "bpe"]
    vocab_size: int = Field(ge=2)
    sha256: str | None = Field(description="Hex sha256 of tokenizer.json; None for bytes.")
    file: str | None = Field(description="tokenizer.json under the root; None for bytes.")
    origin: str | None = Field(default=None, description="Where the tokenizer came from (file path, or 'trained').")
    separator: list[int] = Field(description="Token ids appended after every document.")


class Manifest(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    format: Literal["multislice-tokens"] = FORMAT
    version: int = VERSION
    source: str
    tokenizer: TokenizerRecord
    dtype: Literal["uint16", "uint32"]
    eval_fraction: float
    splits: dict[str, Split]
    created: str

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def to_json(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()


def is_dataset(storage: Storage) -> bool:
    """True if ``storage`` holds a finished dataset (its manifest exists)."""
    return storage.exists(MANIFEST)


def load(storage: Storage) -> Manifest:
    """The manifest of the dataset at ``storage``.

    Raises:
      ManifestError: missing, not JSON, not a manifest of this format, or inconsistent (a
        vocabulary its dtype cannot hold, shard sizes that disagree with their token counts).
    """
    data = storage.read(MANIFEST)
    if data is None:
        raise ManifestError(f"{storage.uri(MANIFEST)} does not exist: {storage} is not a prepared dataset")
    return parse(data, storage.uri(MANIFEST))


def parse(data: bytes, where: str) -> Manifest:
    """The manifest in ``data`` (the bytes of ``manifest.json``; ``where`` names it in errors),
    with the checks :func:`load` makes: also what ``multislice plan`` and the Pulumi preview
    read a stack's dataset with, so they refuse what the trainer would.

    Raises:
      ManifestError: not JSON, not a manifest of this format, or inconsistent (a vocabulary
        its dtype cannot hold, shard sizes that disagree with their token counts).
    """
    try:
        manifest = Manifest.model_validate(json_record(data))
    except (ValueError, pydantic.ValidationError) as err:
        first = str(err).splitlines()[:3]
        raise ManifestError(f"{where} is not a dataset manifest: {' '.join(first)}") from None
    if manifest.version != VERSION:
        raise ManifestError(f"{where} has format version {manifest.version}; this trainer reads {VERSION}")
    if manifest.vocab_size > DTYPE_LIMITS[manifest.dtype]:
        raise ManifestError(
            f"{where}: a vocabulary of {manifest.vocab_size:,} tokens does not fit its dtype "
            f"{manifest.dtype} ({DTYPE_LIMITS[manifest.dtype]:,} ids)"
        )
    for split in manifest.splits.values():
        for shard in split.shards:
            if shard.bytes != shard.tokens * manifest.itemsize:
                raise ManifestError(
                    f"{where}: shard {shard.name} records {shard.bytes} bytes for {shard.tokens} "
                    f"{manifest.dtype} tokens"
                )
    return manifest


def verify_shards(storage: Storage, manifest: Manifest, *, full: bool | None = None) -> None:
    """Check every shard against the manifest before any step reads it.

    On Cloud Storage: the object's size and the MD5 the service computed of its bytes, from
    one metadata request per shard (nothing downloaded). Locally (``full`` defaults to True
    there): the size, and the sha256 of the whole file.

    Raises:
      ManifestError: a shard is missing, has another size (truncated), or other bytes
        (replaced), naming the shard and what differs.
    """
    full = not storage.remote if full is None else full
    for split in manifest.splits.values():
        for shard in split.shards:
            where = storage.uri(shard.name)
            info = storage.info(shard.name)
            if info is None:
                raise ManifestError(f"shard {where} is missing (the manifest lists it); prepare the dataset again")
            if info.size != shard.bytes:
                raise ManifestError(
                    f"shard {where} has {info.size:,} bytes, the manifest says {shard.bytes:,} (truncated or "
                    "replaced); prepare the dataset again"
                )
            if info.md5 is not None and info.md5 != shard.md5:
                raise ManifestError(
                    f"shard {where} does not match its checksum: md5 {info.md5}, the manifest says {shard.md5} "
                    "(replaced or damaged); prepare the dataset again"
                )
            if full and info.md5 is None and storage.sha256(shard.name) != shard.sha256:
                raise ManifestError(
                    f"shard {where} does not match its checksum (sha256 differs from the manifest's; replaced or "
                    "damaged); prepare the dataset again"
                )

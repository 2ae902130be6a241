"""``data prepare``: tokenize a text corpus once into token shards and a manifest.

    python -m training data prepare 'gs://bucket/text/*.txt' gs://bucket/datasets/web --tokenizer bpe --vocab-size 32000
    multislice data prepare stdlib /tmp/datasets/stdlib-bytes

Steps (:func:`prepare`):

1. **Plan.** The source's files (a glob, local or ``gs://``, or ``stdlib``:
   :func:`training.data.files.list_source_files`) are split into train and eval by a hash of their
   path (:func:`training.data.files.is_eval_file`, as the byte reader splits them). A file larger than
   a shard's worth of text is cut into pieces of ``shard_mb`` MB, each boundary moved to just
   after the next newline; pieces are grouped in order into shards of about ``shard_mb`` MB of
   text. The plan depends only on the source listing and the options, and is stored as
   ``prepare/plan.json``.
2. **Tokenizer** (:mod:`training.prepare.tokenizer`): bytes, a tokenizer file, or a BPE trained on the
   train split (at most ``bpe_train_mb`` MB of it), stored as ``tokenizer.json`` before any shard.
3. **Shards**, one after the other: a reader thread streams the shard's text in segments of
   :data:`training.prepare.text_stream.SEGMENT_BYTES` cut after a newline, batched by
   :data:`BATCH_BYTES` (a queue of :data:`READ_AHEAD` batches); each batch is encoded on every core
   (``encode_batch_fast``), written to a staging file and hashed (sha256, MD5). Memory is
   bounded by a few batches whatever the corpus size. A finished shard is made visible
   atomically (:mod:`training.data.storage`), then recorded in ``prepare/done/<shard>.json``.
4. **Manifest** (:mod:`training.data.manifest`), written last, from the shard records.

Idempotent and resumable: a dataset whose manifest exists is never rewritten; a re-run after an
interruption checks the stored plan against the new one (same source files and options, else
an error), keeps every shard whose record exists and whose object still has the recorded size
(and, on Cloud Storage, MD5), and writes only the others. A shard being written is never read
as complete: it has no record until its object is whole.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

from training.data import manifest as manifest_lib
from training.data.base import DataError
from training.data.files import SourceFile, is_eval_file, list_source_files
from training.data.manifest import MANIFEST, TOKENIZER_FILE, Manifest, ManifestError, Shard
from training.data.storage import Storage, StorageError, md5_base64
from training.prepare import arguments, text_stream, tokenizer as tokenizer_lib
from training.run_objects import MAX_OBJECT_BYTES, json_record

log = logging.getLogger(__name__)

#: Text per batch handed to the tokenizer at once (at least 256 KiB per core).
BATCH_BYTES = max(4 << 20, (os.cpu_count() or 1) * (256 << 10))
#: Batches read ahead of the encoder.
READ_AHEAD = 2
PLAN = "prepare/plan.json"


class PrepareError(ValueError):
    """The corpus, tokenizer, options or output cannot make a dataset; one line says why."""


@dataclasses.dataclass(frozen=True)
class PrepareSpec:
    """What to prepare. ``tokenizer``: ``bytes``, ``bpe`` (needs ``vocab_size``), or the path of
    a Hugging Face tokenizer JSON file (local or ``gs://``)."""

    source: str
    output: str
    tokenizer: str = "bytes"
    vocab_size: int | None = None
    dtype: str = "auto"
    eval_fraction: float = 0.05
    shard_mb: float = 64.0
    bpe_train_mb: float = 256.0

    @property
    def shard_bytes(self) -> int:
        return max(1, int(self.shard_mb * 1e6))


@dataclasses.dataclass
class PrepareResult:
    manifest: Manifest
    written: list[str]  # shards written by this run
    kept: list[str]  # shards an earlier, interrupted run had finished
    already_prepared: bool
    seconds: float
    tokens_written: int


@dataclasses.dataclass(frozen=True)
class Piece:
    file: int  # index into the plan's files
    start: int  # nominal byte range; the real edges move to after the next newline
    end: int
    last: bool  # the file's last piece: the document separator follows


def _pieces(files: list[SourceFile], indices: list[int], shard_bytes: int) -> list[list[Piece]]:
    """Shards of the files ``indices``, each a list of pieces of about ``shard_bytes``."""
    shards: list[list[Piece]] = []
    current: list[Piece] = []
    size = 0
    for index in indices:
        length = files[index].size
        for start in range(0, length, shard_bytes):
            end = min(length, start + shard_bytes)
            current.append(Piece(index, start, end, end == length))
            size += end - start
            if size >= shard_bytes:
                shards.append(current)
                current, size = [], 0
    if current:
        shards.append(current)
    return shards


def make_plan(spec: PrepareSpec, tokenizer_sha: str | None) -> dict:
    """The plan of ``spec`` (module docstring, step 1) as JSON-able data.

    Raises:
      PrepareError: the source matches no file.
    """
    try:
        files = list_source_files(spec.source)
    except DataError as err:
        raise PrepareError(str(err).replace("training.data.source", "the source")) from None
    train = [i for i, f in enumerate(files) if not is_eval_file(f.relative, spec.eval_fraction)]
    held_out = [i for i, f in enumerate(files) if is_eval_file(f.relative, spec.eval_fraction)]
    if not held_out and len(train) > 1:  # as training.data.text.TextDataset: tiny corpora still hold one file out
        held_out, train = train[-1:], train[:-1]
    splits = {}
    for split, indices in (("train", train), ("eval", held_out)):
        splits[split] = [
            {"name": f"{split}/{n:05d}.bin", "pieces": [dataclasses.astuple(p) for p in shard]}
            for n, shard in enumerate(_pieces(files, indices, spec.shard_bytes))
        ]
    plan = {
        "spec": {
            "source": spec.source,
            "tokenizer": spec.tokenizer,
            "vocab_size": spec.vocab_size,
            "dtype": spec.dtype,
            "eval_fraction": spec.eval_fraction,
            "shard_bytes": spec.shard_bytes,
            "bpe_train_bytes": int(spec.bpe_train_mb * 1e6) if spec.tokenizer == "bpe" else None,
        },
        "tokenizer_file_sha256": tokenizer_sha,
        "files": [[f.path, f.relative, f.size] for f in files],
        "splits": splits,
    }
    return json.loads(json.dumps(plan))  # as read back from plan.json (tuples become lists)


class _Progress:
    """A progress line at most every ``period_s`` seconds: tokens, text MB/s, shards done."""

    def __init__(self, report: Callable[[str], None], total_bytes: int, shards: int, period_s: float = 5.0):
        self.report, self.total_bytes, self.shards, self.period_s = report, total_bytes, shards, period_s
        self.start = self.last = time.monotonic()
        self.bytes = self.tokens = self.done = 0

    def add(self, text_bytes: int, tokens: int) -> None:
        self.bytes += text_bytes
        self.tokens += tokens
        now = time.monotonic()
        if now - self.last >= self.period_s:
            self.last = now
            self.show()

    def show(self) -> None:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = self.bytes / elapsed
        left = max(self.total_bytes - self.bytes, 0) / rate if rate else float("inf")
        self.report(
            f"{self.done}/{self.shards} shards, {self.tokens:,} tokens, {self.bytes / 1e6:,.1f} of "
            f"{self.total_bytes / 1e6:,.1f} MB of text ({rate / 1e6:.1f} MB/s, {self.tokens / elapsed:,.0f} tokens/s, "
            f"~{left:.0f} s left)"
        )


def _write_shard(
    storage: Storage,
    name: str,
    files: list,
    pieces: list,
    tokenizer: tokenizer_lib.Tokenizer,
    dtype: str,
    progress: _Progress,
) -> Shard:
    """Tokenize ``pieces`` into the shard ``name`` (staged, then committed atomically)."""
    import numpy as np

    staged = storage.local_staging(name)
    sha, md5 = hashlib.sha256(), hashlib.md5()
    tokens = documents = 0
    separator = np.asarray(tokenizer.separator, dtype=dtype)
    stop = threading.Event()
    try:
        with open(staged, "wb") as out:
            for texts, ends in text_stream.read_ahead(
                text_stream.batches(files, pieces, stop, BATCH_BYTES), READ_AHEAD, stop
            ):
                parts = []
                for ids, end in zip(tokenizer.encode(texts), ends, strict=True):
                    parts.append(ids)
                    if end:
                        parts.append(separator)
                        documents += 1
                chunk = np.concatenate(parts).astype(f"<{np.dtype(dtype).str[1:]}", copy=False).tobytes()
                out.write(chunk)
                sha.update(chunk)
                md5.update(chunk)
                tokens += len(chunk) // np.dtype(dtype).itemsize
                progress.add(sum(map(len, texts)), len(chunk) // np.dtype(dtype).itemsize)
            out.flush()
            os.fsync(out.fileno())
        storage.commit(staged, name)
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    itemsize = np.dtype(dtype).itemsize
    return Shard(
        name=name,
        tokens=tokens,
        bytes=tokens * itemsize,
        sha256=sha.hexdigest(),
        md5=md5_base64(md5.digest(), digest=True),
        documents=documents,
    )


def _done_name(shard: str) -> str:
    return f"prepare/done/{shard.replace('/', '-')}.json"


def _finished(storage: Storage, name: str) -> Shard | None:
    """The record of shard ``name`` if an earlier run finished it and its object is intact."""
    data = storage.read(_done_name(name))
    if data is None:
        return None
    try:
        shard = Shard.model_validate_json(data)
    except ValueError:
        return None
    info = storage.info(name)
    if info is None or info.size != shard.bytes or (info.md5 is not None and info.md5 != shard.md5):
        return None
    return shard


def _tokenizer(spec: PrepareSpec, storage: Storage, plan_files: list, train_shards: list) -> tokenizer_lib.Tokenizer:
    if spec.tokenizer == "bytes":
        return tokenizer_lib.byte_tokenizer()
    if spec.tokenizer == "bpe":
        stored = storage.read(TOKENIZER_FILE)
        if stored is not None:  # trained by the interrupted run: the shards it wrote used it
            return tokenizer_lib.from_json(stored, storage.uri(TOKENIZER_FILE), kind="bpe")
        assert spec.vocab_size is not None  # checked by prepare()
        budget = int(spec.bpe_train_mb * 1e6)

        def texts() -> Iterator[str]:
            seen = 0
            for index, start, end, _ in itertools.chain.from_iterable(s["pieces"] for s in train_shards):
                path, _, size = plan_files[index]
                for segment in text_stream.segments(path, start, end, size):
                    yield segment.decode("utf-8", errors="replace")
                    seen += len(segment)
                    if seen >= budget:
                        return

        trained = tokenizer_lib.train_bpe(texts(), spec.vocab_size)
        trained.origin = "trained"
        return trained
    try:
        with text_stream.open_binary(spec.tokenizer) as f:
            data = f.read(MAX_OBJECT_BYTES + 1)
    except (OSError, ValueError) as err:
        raise PrepareError(f"cannot read the tokenizer file {spec.tokenizer}: {err}") from None
    if len(data) > MAX_OBJECT_BYTES:  # stored as the dataset's tokenizer file, which is read up to this
        raise PrepareError(
            f"the tokenizer file {spec.tokenizer} is over {MAX_OBJECT_BYTES:,} bytes, the most read; "
            "a tokenizer's JSON is a few to tens of MB"
        )
    return tokenizer_lib.from_json(data, spec.tokenizer)


def check_arguments(spec: PrepareSpec) -> None:
    """Check every argument of ``spec`` without reading or writing anything: the command lines
    call it before they start anything (``multislice data prepare --emulated``: a storage server).

    Raises:
      PrepareError: one line naming the argument (:mod:`training.prepare.arguments`): a source,
        output or tokenizer of a scheme not read, megabytes past their bounds, ``--vocab-size``
        without ``--tokenizer bpe`` or missing with it, ``--eval-fraction`` outside (0, 0.5), a
        local tokenizer file that is not there, or a ``--dtype`` that is none or cannot hold the
        vocabulary.
    """
    problem = arguments.problem(spec.source, spec.output, spec.tokenizer, spec.shard_mb, spec.bpe_train_mb)
    if problem is not None:
        raise PrepareError(problem)
    if spec.tokenizer == "bpe" and not spec.vocab_size:
        raise PrepareError("--tokenizer bpe needs --vocab-size (the number of tokens to train)")
    if spec.tokenizer != "bpe" and spec.vocab_size is not None:
        raise PrepareError("--vocab-size applies only to --tokenizer bpe (a tokenizer file has its own)")
    if not 0 < spec.eval_fraction < 0.5:
        raise PrepareError(f"--eval-fraction must be in (0, 0.5); got {spec.eval_fraction}")
    local_file = spec.tokenizer not in ("bytes", "bpe") and "://" not in spec.tokenizer
    if local_file and not os.path.isfile(spec.tokenizer):
        raise PrepareError(f"cannot read the tokenizer file {spec.tokenizer} (--tokenizer): it is not a file")
    try:
        if spec.tokenizer == "bpe":
            manifest_lib.token_dtype(spec.vocab_size or 0, spec.dtype)  # before training it
        elif spec.dtype != "auto":
            manifest_lib.token_dtype(2, spec.dtype)
    except ManifestError as err:
        raise PrepareError(str(err)) from None


def prepare(spec: PrepareSpec, report: Callable[[str], None] = log.info) -> PrepareResult:
    """Prepare ``spec.source`` into ``spec.output`` (module docstring).

    Raises:
      PrepareError: bad options, a source matching nothing, an output holding another dataset
        or another unfinished prepare, a tokenizer that does not load
        (:class:`training.prepare.tokenizer.TokenizerError` is a subclass of ValueError and is
        re-raised as PrepareError), a vocabulary the token dtype cannot hold.
      StorageError: the output cannot be written.
    """
    began = time.monotonic()
    check_arguments(spec)
    storage = Storage(spec.output)
    if manifest_lib.is_dataset(storage):
        existing = manifest_lib.load(storage)
        if existing.source != spec.source:
            raise PrepareError(
                f"{spec.output} already holds a dataset prepared from {existing.source!r}; choose another output"
            )
        report(f"{spec.output} is already prepared ({existing.splits['train'].tokens:,} train tokens); nothing to do")
        return PrepareResult(existing, [], [], True, time.monotonic() - began, 0)

    try:
        given = None if spec.tokenizer in ("bytes", "bpe") else _tokenizer(spec, storage, [], [])
        plan = make_plan(spec, given.sha256 if given else None)
        stored_plan = storage.read(PLAN)
        try:  # json_record: 64 MiB, nesting bounded; anything else is a ValueError
            stored = None if stored_plan is None else json_record(stored_plan)
        except ValueError as err:
            raise PrepareError(
                f"{storage.uri(PLAN)} is not a plan a prepare wrote ({err}); delete {spec.output}"
            ) from None
        if stored_plan is not None and stored != plan:
            raise PrepareError(
                f"{spec.output} holds an unfinished prepare of another source listing or other options "
                f"({storage.uri(PLAN)}); re-run it with the same source and options, or delete {spec.output}"
            )
        if stored_plan is None:
            storage.write_bytes(PLAN, json.dumps(plan, indent=1).encode())
        files = plan["files"]
        tokenizer = given or _tokenizer(spec, storage, files, plan["splits"]["train"])
        dtype = manifest_lib.token_dtype(tokenizer.vocab_size, spec.dtype)
    except (tokenizer_lib.TokenizerError, ManifestError) as err:
        raise PrepareError(str(err)) from None
    if tokenizer.json is not None and storage.read(TOKENIZER_FILE) != tokenizer.json:
        storage.write_bytes(TOKENIZER_FILE, tokenizer.json)

    all_shards = [(split, shard) for split in manifest_lib.SPLITS for shard in plan["splits"][split]]
    total_bytes = sum(min(end, files[i][2]) - start for _, s in all_shards for i, start, end, _ in s["pieces"])
    progress = _Progress(report, total_bytes, len(all_shards))
    records: dict[str, Shard] = {}
    written, kept = [], []
    report(
        f"preparing {spec.source} into {spec.output}: {len(files)} files, {total_bytes / 1e6:,.1f} MB of text, "
        f"{len(all_shards)} shards, tokenizer {tokenizer.kind} ({tokenizer.vocab_size:,} ids, {dtype})"
    )
    for _, shard in all_shards:
        name = shard["name"]
        record = _finished(storage, name)
        if record is not None:
            kept.append(name)
            progress.add(sum(min(e, files[i][2]) - s for i, s, e, _ in shard["pieces"]), record.tokens)
        else:
            try:
                record = _write_shard(storage, name, files, shard["pieces"], tokenizer, dtype, progress)
            except text_stream.SourceChanged as err:
                raise PrepareError(f"{err}; run prepare again once the source is stable") from None
            storage.write_bytes(_done_name(name), record.model_dump_json().encode())
            written.append(name)
        records[name] = record
        progress.done += 1
    progress.show()

    splits = {}
    for split in manifest_lib.SPLITS:
        shards = [records[s["name"]] for s in plan["splits"][split]]
        splits[split] = manifest_lib.Split(
            tokens=sum(s.tokens for s in shards),
            documents=sum(s.documents for s in shards),
            source_bytes=sum(min(e, files[i][2]) - st for s in plan["splits"][split] for i, st, e, _ in s["pieces"]),
            shards=shards,
        )
    manifest = Manifest(
        source=spec.source,
        tokenizer=manifest_lib.TokenizerRecord(
            kind=tokenizer.kind,  # type: ignore[arg-type]  # one of the literals
            vocab_size=tokenizer.vocab_size,
            sha256=tokenizer.sha256,
            file=TOKENIZER_FILE if tokenizer.json is not None else None,
            origin=tokenizer.origin,
            separator=tokenizer.separator,
        ),
        dtype=dtype,  # type: ignore[arg-type]  # token_dtype returns one of the literals
        eval_fraction=spec.eval_fraction,
        splits=splits,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    storage.write_bytes(MANIFEST, manifest.to_json())
    report(
        f"prepared {spec.output}: {splits['train'].tokens:,} train and {splits['eval'].tokens:,} eval tokens in "
        f"{len(all_shards)} shards ({len(written)} written, {len(kept)} kept from an earlier run)"
    )
    return PrepareResult(manifest, written, kept, False, time.monotonic() - began, progress.tokens)


__all__ = ["PrepareError", "PrepareResult", "PrepareSpec", "StorageError", "prepare"]

"""What ``data prepare`` checks of its arguments before it reads or writes anything, for both
command lines (``multislice data prepare``, ``python -m training data prepare``): each problem is
one line naming the argument or option (:func:`problem`); a URI is shown without its password
(:func:`redacted`).

* ``--shard-mb``, ``--bpe-train-mb``: a finite number of megabytes in (0, :data:`MAX_MB`].
* ``SOURCE`` and a ``--tokenizer`` file: a local path or glob, or a ``gs://`` URI (``SOURCE``
  also ``stdlib``); ``OUTPUT``: a local directory or a ``gs://`` URI. Another scheme (``https://``)
  is refused, and so is a ``gs://`` URI that carries credentials (Cloud Storage is reached with
  this machine's: ``gcloud auth application-default login``).
* a local ``OUTPUT`` must be able to be a directory: neither it nor the nearest existing
  directory above it is a file (``/dev/null/x``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from training import redaction

#: The most megabytes ``--shard-mb`` and ``--bpe-train-mb`` take: a petabyte, far past any
#: corpus, and still an exact byte count (``training.prepare.shards.PrepareSpec.shard_bytes``).
MAX_MB = 1e9


def redacted(uri: str) -> str:
    """``uri`` as a message shows it (:func:`training.redaction.redacted`): ``https://user:***@host/path``."""
    return redaction.redacted(uri)


def _uri_problem(name: str, value: str, what: str) -> str | None:
    """Why the URI ``value`` of argument ``name`` cannot be read or written, or None (not a URI,
    or a plain ``gs://`` one)."""
    scheme, separator, rest = value.partition("://")
    if not separator:
        return None
    shown = redacted(value)
    if scheme != "gs":
        return f"{name} {shown!r}: {scheme}:// is not supported; {name} is {what}"
    if "@" in rest.partition("/")[0]:
        return (
            f"{name} {shown!r}: a gs:// URI carries no credentials (Cloud Storage is reached with this "
            "machine's: gcloud auth application-default login)"
        )
    return None


def _megabytes_problem(name: str, value: float) -> str | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 < value <= MAX_MB:
        return None
    return f"{name} {value}: must be a number of megabytes greater than 0 and at most {MAX_MB:,.0f} (a petabyte)"


def _directory_problem(output: str) -> str | None:
    """Why the local ``output`` cannot be a directory (it, or the nearest path above it that
    exists, is not a directory), or None. Creates nothing."""
    path = Path(output)
    existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), None)
    if existing is None or existing.is_dir():
        return None
    culprit = "" if existing == path else f"{existing} "
    return f"OUTPUT {output}: {culprit}is not a directory (a dataset is a directory of shards and a manifest)"


def problem(source: str, output: str, tokenizer: str, shard_mb: float, bpe_train_mb: float) -> str | None:
    """The first problem of ``data prepare``'s arguments, in one line, or None."""
    checks = [
        lambda: _megabytes_problem("--shard-mb", shard_mb),
        lambda: _megabytes_problem("--bpe-train-mb", bpe_train_mb),
        lambda: _uri_problem("SOURCE", source, "a local path or glob, a gs:// URI or 'stdlib'"),
        lambda: _uri_problem("OUTPUT", output, "a local directory or a gs:// URI (gs://bucket/datasets/NAME)"),
        lambda: _uri_problem("--tokenizer", tokenizer, "bytes, bpe, or a tokenizer file: a local path or a gs:// URI"),
        lambda: None if "://" in output else _directory_problem(output),
    ]
    return next((found for check in checks if (found := check()) is not None), None)

"""Training text and prepared datasets: files of the standard library as a corpus, and a
dataset ``data prepare`` makes of them."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from training.prepare import shards as prepare

STDLIB = Path(sysconfig.get_paths()["stdlib"])

#: The BPE's vocabulary: not a multiple of 4, so a tensor axis of 4 does not divide it.
VOCAB = 302


def corpus(tmp_path: Path, files: int = 12) -> str:
    """``files`` text files of the standard library's json, email and http packages."""
    sources = sorted(p for package in ("json", "email", "http") for p in (STDLIB / package).glob("*.py"))[:files]
    root = tmp_path / "text"
    root.mkdir()
    for path in sources:
        (root / f"{path.parent.name}-{path.stem}.txt").write_bytes(path.read_bytes())
    return str(root / "*.txt")


def prepared(output: str, text_dir: Path, vocab_size: int = VOCAB) -> str:
    """A dataset prepared by ``data prepare`` (a BPE of ``vocab_size`` tokens trained on six files
    of the standard library) at ``output``, local or gs://; returns ``output``."""
    text_dir.mkdir(parents=True, exist_ok=True)
    prepare.prepare(prepare.PrepareSpec(corpus(text_dir, files=6), output, tokenizer="bpe", vocab_size=vocab_size))
    return output

"""The options of ``data prepare``, shared by ``python -m training data prepare`` and
``multislice data prepare`` (infra/cli/data.py) so that both spell and document them alike."""

from __future__ import annotations

import typer

SOURCE = typer.Argument(
    ...,
    metavar="SOURCE",
    help="Text to tokenize: a glob of files, local or gs:// (quote it), or 'stdlib' (the Python standard library).",
)
OUTPUT = typer.Argument(
    ..., metavar="OUTPUT", help="Where the dataset goes: a local directory or gs://bucket/datasets/NAME."
)
TOKENIZER = typer.Option(
    "bytes",
    "--tokenizer",
    metavar="bytes|bpe|FILE",
    help="'bytes' (one token per byte), 'bpe' (a byte-level BPE trained on the source; needs --vocab-size), "
    "or a Hugging Face tokenizer JSON file (local or gs://).",
)
VOCAB_SIZE = typer.Option(None, "--vocab-size", min=257, help="Tokens of the BPE to train (with --tokenizer bpe).")
DTYPE = typer.Option(
    "auto", "--dtype", metavar="auto|uint16|uint32", help="Token dtype; auto: uint16 when the vocabulary fits."
)
EVAL_FRACTION = typer.Option(0.05, "--eval-fraction", help="Share of files held out for eval (split by path hash).")
SHARD_MB = typer.Option(64.0, "--shard-mb", min=0.001, help="Megabytes of text per shard.")
BPE_TRAIN_MB = typer.Option(256.0, "--bpe-train-mb", min=0.001, help="Megabytes of train text the BPE learns from.")

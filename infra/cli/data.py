"""``multislice data prepare``: tokenize a corpus once into a prepared dataset (training/prepare/shards.py).

    multislice data prepare 'gs://bucket/text/*.txt' gs://bucket/datasets/web --tokenizer bpe --vocab-size 32000
    multislice data prepare '/data/*.txt' gs://<stack bucket>/datasets/web --emulated --stack dev

The work is :func:`training.prepare.shards.prepare` (also ``python -m training data prepare`` on any
machine with the trainer's dependencies). A ``gs://`` output goes through gcsfs, the client
the trainer reads it with; with ``--emulated`` that is the stack's emulated Cloud Storage (the
one ``multislice local up`` serves, started for this command when no emulation runs), so
``training.data.source: gs://<bucket>/datasets/<name>`` trains on it in ``local up``.
Errors: one ``error:`` line; exit 2 for bad input (options, source, tokenizer, an output
holding another dataset), 1 when the output cannot be written, 130 for Ctrl-C (finished shards
are kept: the same command resumes). Every option and argument is checked before anything
starts (the numbers while the command line is read; the rest by
:func:`training.prepare.shards.check_arguments`), so a bad one never waits for ``--emulated``'s
storage server.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

from infra.cli.option_values import Number, parsed
from infra.cli.options import CONFIG_FILE_OPTION, STACK_OPTION, err_console, fail, load_config, say
from training.data import prepare_options as opts

#: The ``data`` command group.
app = typer.Typer(no_args_is_help=True, help="Prepare token datasets for training.data.source.")

# The numbers, read by the rules of every option (infra.cli.option_values) while the command line
# is: a vocabulary of the 256 bytes and a separator up to what uint32 ids hold
# (training.data.manifest.DTYPE_LIMITS), a megabyte count up to a petabyte
# (training.prepare.arguments.MAX_MB), an eval share in (0, 0.5).
VOCAB_SIZE = parsed(opts.VOCAB_SIZE, Number(257, 1 << 32, "tokens", whole=True, note="what uint32 ids hold"))
EVAL_FRACTION = parsed(opts.EVAL_FRACTION, Number(0, 0.5, open_low=True, open_high=True))
SHARD_MB = parsed(opts.SHARD_MB, Number(0.001, 1e9, "megabytes", note="a petabyte"))
BPE_TRAIN_MB = parsed(opts.BPE_TRAIN_MB, Number(0.001, 1e9, "megabytes", note="a petabyte"))


@app.command("prepare")
def prepare(
    source: str = opts.SOURCE,
    output: str = opts.OUTPUT,
    tokenizer: str = opts.TOKENIZER,
    vocab_size: int | None = VOCAB_SIZE,
    dtype: str = opts.DTYPE,
    eval_fraction: float = EVAL_FRACTION,
    shard_mb: float = SHARD_MB,
    bpe_train_mb: float = BPE_TRAIN_MB,
    emulated: bool = typer.Option(
        False,
        "--emulated",
        help="Write a gs:// OUTPUT into the stack's emulated Cloud Storage (multislice local up's), not Cloud Storage.",
    ),
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
) -> None:
    """Tokenize SOURCE once into token shards and a manifest at OUTPUT; a re-run after an
    interruption writes only the missing shards, and a finished dataset is never rewritten."""
    from training.prepare import shards as prepare_lib

    spec = prepare_lib.PrepareSpec(source, output, tokenizer, vocab_size, dtype, eval_fraction, shard_mb, bpe_train_mb)
    try:
        prepare_lib.check_arguments(spec)  # every argument, before --emulated starts a storage server
        with _storage(emulated, output, stack, config_file):
            prepare_lib.prepare(spec, report=say)
    except prepare_lib.PrepareError as err:
        raise fail(str(err)) from None
    except OSError as err:
        raise fail(str(err), 1) from None
    except KeyboardInterrupt:
        raise fail("interrupted; finished shards are kept: run the same command again to resume", 130) from None


@contextlib.contextmanager
def _storage(emulated: bool, output: str, stack: str, config_file: Path | None):
    """The storage ``output`` is written to: as configured, or (``--emulated``) the stack's emulated bucket."""
    if not emulated:
        yield
        return
    from infra.cli.local import local_paths
    from infra.emulated import state as local_state
    from infra.emulated.gcs import GcsServerError
    from infra.emulated.gcs_clients import bucket_served

    config = load_config(stack, config_file)
    bucket = config.bucket_name
    if not output.startswith(f"gs://{bucket}/"):
        raise fail(
            f"--emulated writes only the stack's bucket gs://{bucket} (the one multislice local up serves); "
            f"got {output!r}: use gs://{bucket}/datasets/NAME"
        )
    paths = local_paths(config)
    try:
        state = local_state.read_state(paths)
    except local_state.StateError as err:
        raise fail(str(err)) from None
    url = state.get("storage_url") if state and local_state.emulator_alive(state) else None
    try:
        with bucket_served(paths.gcs_root, paths.gcs_log, bucket, url) as served:
            err_console.print(
                f"writing to the emulated Cloud Storage of stack {config.stack!r} at {served}", markup=False
            )
            yield
    except GcsServerError as err:
        raise fail(f"the emulated Cloud Storage: {err}", 1) from None

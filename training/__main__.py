"""``python -m training``: the trainer's command line (what the startup script runs).

    python -m training run --config config.json --run-dir gs://bucket/runs/dev
    python -m training run --config config.json --run-dir /tmp/run --single-process
    python -m training bench shardings --ici-fsdp 4 [--dcn-data 2 --from-metadata] [--json]
    python -m training data prepare 'gs://bucket/text/*.txt' gs://bucket/datasets/web --tokenizer bpe --vocab-size 32000

``run`` reads the process identity from the TPU metadata server (``$GCE_METADATA_IP``)
unless ``--single-process`` is given, and exits with the codes of ``training.train``. It first
re-executes itself with glibc's huge-page tunable in ``GLIBC_TUNABLES`` (same PID;
``training.host_allocator``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

if __name__ == "__main__" and sys.argv[1:2] == ["run"]:
    # The trainer runs with glibc's huge-page tunable, which must be in the environment when
    # the process starts: re-execute now, before the imports below (training/host_allocator.py).
    from training import host_allocator

    host_allocator.reexec_with_tunable()

import typer  # noqa: E402

from training.bench.spec import BenchOptions, with_bench_options
from training.data import prepare_options as prepare_opts

app = typer.Typer(add_completion=False, no_args_is_help=True, help="The multislice JAX trainer.")


def _setup_logging(label: str) -> None:
    """Log lines with a UTC-offset time and ``label``, at ``MULTISLICE_LOG_LEVEL``; a level that is no
    level is one error line and exit 2 (``run`` refused it already: :func:`training.knobs.problem`)."""
    from training import knobs

    try:
        level = knobs.log_level()
    except knobs.KnobError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s %(levelname)s [{label}] %(name)s: %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S%z",  # with the UTC offset: `multislice local logs --since` reads it
        force=True,
    )
    for noisy in ("absl", "jax._src", "orbax", "etils", "fsspec", "gcsfs"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def run(
    config: Path = typer.Option(..., exists=True, dir_okay=False, help="TrainConfig as JSON."),
    run_dir: str = typer.Option(..., help="Run directory: local path or gs:// URI, shared by all processes."),
    single_process: bool = typer.Option(False, help="Run as the whole job, without TPU metadata."),
) -> None:
    """Train (or resume) until the configured number of steps; exit 0 when complete."""
    from training import cluster, knobs, train
    from training.config import load_train_config

    problem = knobs.problem()  # before anything starts: the timeouts, the port, the preemption grace
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(train.EXIT_CONFIG)
    try:
        train_config = load_train_config(config.read_bytes())
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(train.EXIT_CONFIG) from None
    if single_process:
        identity = cluster.ClusterIdentity.single_process()
    else:
        try:
            identity = cluster.current_identity()
        except cluster.MetadataError as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(train.EXIT_FAILED) from None
    _setup_logging(f"p{identity.process_id}")
    logging.getLogger("training").info("host allocator: GLIBC_TUNABLES=%s", os.environ.get("GLIBC_TUNABLES", ""))
    train.exit_process(train.main(train_config, run_dir, identity))  # no interpreter teardown: it only costs time


@app.command("completed-by")
def completed_by(run_dir: str = typer.Argument(..., help="The run directory (a path or gs:// URI).")) -> None:
    """Print the slice whose trainer wrote the run's completion marker; exit 1 without a marker.

    trainer.sh asks it after a trainer exited 0: that slice's worker 0 releases the capacity.
    """
    from training.checkpoint.completion import completed_by as writer_of
    from training.run_dir import RunDir

    writer = writer_of(RunDir(run_dir))
    if writer is None:
        raise typer.Exit(1)
    typer.echo(writer)


@app.command()
def version() -> None:
    """Print the versions of the trainer's key libraries."""
    import jax
    import optax
    import orbax.checkpoint

    typer.echo(f"jax {jax.__version__}  optax {optax.__version__}  orbax-checkpoint {orbax.checkpoint.__version__}")


bench_app = typer.Typer(no_args_is_help=True, help="Measure what a mesh achieves (training/bench/shardings.py).")
app.add_typer(bench_app, name="bench")


@bench_app.callback()
def bench() -> None:
    """Benchmarks that run unchanged on CPU, GPU and TPU."""


@bench_app.command("shardings")
@with_bench_options
def bench_shardings(
    options: BenchOptions,
    from_metadata: bool = typer.Option(False, help="Join the TPU job read from metadata (run on every worker)."),
) -> None:
    """The seed's MLP-stack shardings experiment: TFLOP/s per device and efficiency."""
    import json

    from training import knobs
    from training.bench import shardings as bench_lib

    try:
        spec = options.spec()
        if (problem := knobs.problem()) is not None:  # the timeouts and port of jax.distributed
            raise bench_lib.BenchConfigError(problem)
    except bench_lib.BenchConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    try:
        result = bench_lib.run(spec, from_metadata=from_metadata, report=lambda line: typer.echo(line, err=True))
    except bench_lib.BenchConfigError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except bench_lib.BenchError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("error: interrupted; every benchmark process was stopped", err=True)
        raise typer.Exit(130) from None
    if result.get("processes", 1) > 1:
        import jax

        if jax.process_index() != 0:
            return
    if options.json_output:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(bench_lib.summary(result))


data_app = typer.Typer(no_args_is_help=True, help="Prepare token datasets (training/prepare/shards.py).")
app.add_typer(data_app, name="data")


@data_app.command("prepare")
def data_prepare(
    source: str = prepare_opts.SOURCE,
    output: str = prepare_opts.OUTPUT,
    tokenizer: str = prepare_opts.TOKENIZER,
    vocab_size: int | None = prepare_opts.VOCAB_SIZE,
    dtype: str = prepare_opts.DTYPE,
    eval_fraction: float = prepare_opts.EVAL_FRACTION,
    shard_mb: float = prepare_opts.SHARD_MB,
    bpe_train_mb: float = prepare_opts.BPE_TRAIN_MB,
) -> None:
    """Tokenize SOURCE once into token shards and a manifest at OUTPUT (resumes an interrupted run)."""
    try:
        from training.prepare import shards as prepare
    except ImportError as err:  # the TPU VMs' bundle leaves data prepare out (infra/startup/bundle.py)
        typer.echo(
            f"error: data prepare is not part of this installation ({err}); run it on your machine: "
            "multislice data prepare SOURCE OUTPUT",
            err=True,
        )
        raise typer.Exit(2) from None

    _setup_logging("prepare")
    spec = prepare.PrepareSpec(source, output, tokenizer, vocab_size, dtype, eval_fraction, shard_mb, bpe_train_mb)
    try:
        prepare.prepare(spec, report=lambda line: typer.echo(line, err=True))
    except prepare.PrepareError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    except OSError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("error: interrupted; finished shards are kept: run the same command again to resume", err=True)
        raise typer.Exit(130) from None


if __name__ == "__main__":
    app()

"""``multislice bench shardings``: what a mesh achieves (training/bench/shardings.py; emulated slices:
:mod:`infra.local.bench_slices`)."""

from __future__ import annotations

import json

import typer

from infra.cli.options import console, err_console, fail
from training.bench.spec import BenchOptions, with_bench_options

#: The ``bench`` command group.
app = typer.Typer(no_args_is_help=True, help="Measure what a mesh achieves (training/bench/shardings.py).")


@app.command("shardings")
@with_bench_options
def bench_shardings(
    options: BenchOptions,
    timeout: float = typer.Option(600, "--timeout", min=1, help="Give up on emulated slices after this many seconds."),
) -> None:
    """The Multislice overview's MLP-stack experiment over a (dcn × ici) mesh: TFLOP/s per device and the
    efficiency against one large matmul measured in the same run. --dcn-* > 1 without TPU
    slices runs one emulated slice per local CPU process."""
    from infra.local import bench_slices
    from training.bench import shardings as bench

    try:
        spec = options.spec()
        result = bench_slices.run(
            spec, timeout_s=timeout, report=lambda line: err_console.print(line, markup=False, soft_wrap=True)
        )
    except bench.BenchConfigError as err:
        raise fail(str(err)) from None
    except bench.BenchError as err:
        raise fail(str(err), 1) from None
    except KeyboardInterrupt:
        raise fail("interrupted; every benchmark process was stopped", 130) from None
    except Exception as err:  # jax raises JaxRuntimeError (RESOURCE_EXHAUSTED) when arrays do not fit
        if "memory" not in str(err).lower() and "RESOURCE_EXHAUSTED" not in str(err):
            raise
        first = str(err).splitlines()[0]
        raise fail(f"out of memory: {first}; reduce --batch-size, --embedding-dimension or --layers", 1) from None
    if options.json_output:
        typer.echo(json.dumps(result, indent=2))
    else:
        console.print(bench.summary(result), markup=False, soft_wrap=True)

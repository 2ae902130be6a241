"""``multislice bench shardings``: what a mesh achieves (training/bench/shardings.py; emulated slices:
:mod:`infra.local.bench_slices`)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

import typer

from infra.cli import option_values as values
from infra.cli.options import console, err_console, fail
from training.bench import spec as bench_spec
from training.bench.spec import BenchOptions, with_bench_options

#: The ``bench`` command group.
app = typer.Typer(no_args_is_help=True, help="Measure what a mesh achieves (training/bench/shardings.py).")

#: The most each integer option of training/bench/spec.py takes (its ``MAX_*`` bounds), and what that is;
#: ``--ici-*`` and ``--dcn-*`` by axis (their products are checked by the spec itself).
_MOST = {
    "ici": (bench_spec.MAX_DEVICES_PER_SLICE, "the most devices a slice has here"),
    "dcn": (bench_spec.MAX_SLICES, "the most slices a benchmark emulates"),
    "batch_size": (bench_spec.MAX_BATCH_SIZE, "rows per device"),
    "embedding_dimension": (bench_spec.MAX_EMBEDDING_DIMENSION, ""),
    "layers": (bench_spec.MAX_LAYERS, ""),
    "steps": (bench_spec.MAX_STEPS, ""),
    "warmup": (bench_spec.MAX_STEPS, ""),
}


def _read_by_number_rules(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` (made by :func:`with_bench_options`), its integer options read by
    :class:`infra.cli.option_values.Number` with the spec's bounds while the command line is read."""
    signature = inspect.signature(command)
    parameters = []
    for parameter in signature.parameters.values():
        most = _MOST.get(parameter.name.split("_")[0] if parameter.name[:4] in ("ici_", "dcn_") else parameter.name)
        if most is not None:
            rule = values.Number(1, most[0], whole=True, note=most[1])
            parameter = parameter.replace(default=values.parsed(parameter.default, rule))
        parameters.append(parameter)
    command.__signature__ = signature.replace(parameters=parameters)  # pyright: ignore[reportFunctionMemberAccess]  typer reads it
    return command


@app.command("shardings")
@_read_by_number_rules
@with_bench_options
def bench_shardings(
    options: BenchOptions,
    timeout: float = typer.Option(
        600, "--timeout", parser=values.seconds(1), help="Give up on emulated slices after this many seconds."
    ),
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

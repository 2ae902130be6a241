"""training/bench/spec.py: the benchmark's figures and bad options, and the options of
``bench shardings``, declared once, reaching both command lines unchanged."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from infra.cli import app as multislice_app
from training.__main__ import app as training_app
from training.bench.spec import (
    JSON_OPTION,
    BenchConfigError,
    BenchOptions,
    BenchSpec,
    spec_from_options,
    spec_options,
    with_bench_options,
)

#: What README.md and both command lines document, in help order (written out, not derived).
FLAGS = (
    "--ici-data", "--ici-fsdp", "--ici-tensor", "--dcn-data", "--dcn-fsdp", "--dcn-tensor",
    "--batch-size", "--embedding-dimension", "--layers", "--steps", "--warmup", "--dtype",
)  # fmt: skip
DEFAULTS = (1, 1, 1, 1, 1, 1, 1024, 512, 4, 5, 2, "auto")


def test_spec_figures_follow_the_seed():
    spec = spec_from_options(ici_fsdp=4, dcn_data=2, batch_size=8, embedding_dimension=32, layers=3)
    assert spec.devices == 8 and spec.slices == 2 and spec.devices_per_slice == 4
    assert spec.parameters == 2 * 32 * 128 * 3  # 2 · D_FF · D_EMB · layers
    assert spec.global_batch == 8 * 8  # batch size per device × devices
    assert spec.flops_per_step == 6 * spec.parameters * spec.global_batch
    assert spec.resolved_dtype("cpu") == "float32" and spec.resolved_dtype("tpu") == "bfloat16"
    assert BenchSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"ici_fsdp": 0}, "--ici-fsdp"),
        ({"dcn_data": -2}, "--dcn-data"),
        ({"batch_size": 0}, "--batch-size"),
        ({"embedding_dimension": -1}, "--embedding-dimension"),
        ({"layers": 0}, "--layers"),
        ({"warmup": 0}, "--warmup"),
        ({"dtype": "float16"}, "--dtype"),
        ({"dcn_tensor": 2, "dcn_data": 1}, "--dcn-tensor"),
        ({"ici_fsdp": 3, "embedding_dimension": 64}, "--embedding-dimension"),
        ({"ici_tensor": 3, "embedding_dimension": 64}, "--embedding-dimension"),
    ],
)
def test_bad_options_name_the_option(options, names):
    with pytest.raises(BenchConfigError, match=names):
        spec_from_options(**options)


def test_options_are_the_spec_fields():
    options = spec_options()
    assert tuple(o.flag for o in options) == FLAGS
    assert tuple(o.default for o in options) == DEFAULTS
    assert tuple(o.name for o in options) == tuple(flag[2:].replace("-", "_") for flag in FLAGS)
    assert all(o.help.endswith((".", ")")) for o in options)
    assert spec_from_options() == BenchSpec()
    spec = spec_from_options(ici_tensor=2, dcn_fsdp=2, steps=7, dtype="float32")
    assert spec.ici == {"data": 1, "fsdp": 1, "tensor": 2} and spec.dcn == {"data": 1, "fsdp": 2, "tensor": 1}
    assert (spec.steps, spec.dtype, spec.layers) == (7, "float32", 4)
    with pytest.raises(TypeError, match=r"unknown options \['ici_pipeline'\]"):
        spec_from_options(ici_pipeline=2)


def _shared_params(app: typer.Typer) -> list[tuple]:
    command = typer.main.get_command(app).commands["bench"].commands["shardings"]
    return [(p.opts, p.default, p.help, p.bare_type()) for p in command.params if p.name != "help"]


def test_both_command_lines_take_the_same_options():
    """One declaration: the 12 spec options and --json reach `multislice bench shardings` and
    `python -m training bench shardings` with the same flags, defaults, types and help, and in
    the same places (spec options first, each command's own option, --json last)."""
    multislice = _shared_params(multislice_app)
    trainer = _shared_params(training_app)
    assert [p[0][0] for p in multislice] == [*FLAGS, "--timeout", "--json"]
    assert [p[0][0] for p in trainer] == [*FLAGS, "--from-metadata", "--json"]
    assert multislice[:12] == trainer[:12] and multislice[-1] == trainer[-1]
    assert [p[1] for p in multislice[:12]] == list(DEFAULTS)
    assert multislice[-1] == (["--json"], False, JSON_OPTION.help, "bool")


def test_a_decorated_command_gets_the_values_in_one_argument():
    seen = {}
    app = typer.Typer()

    @app.command()
    @with_bench_options
    def shardings(options: BenchOptions, label: str = typer.Option("x", "--label")) -> None:
        seen.update(options=options, label=label, spec=options.spec())

    @app.command()
    def other() -> None:  # a second command, so that typer keeps "shardings" as a subcommand
        pass

    result = CliRunner().invoke(app, ["shardings", "--ici-fsdp", "2", "--dtype", "bfloat16", "--label", "y", "--json"])
    assert result.exit_code == 0, result.output
    assert seen["label"] == "y" and seen["options"].json_output is True
    assert seen["options"].spec_options == {o.name: o.default for o in spec_options()} | {
        "ici_fsdp": 2,
        "dtype": "bfloat16",
    }
    assert seen["spec"] == BenchSpec(ici={"data": 1, "fsdp": 2, "tensor": 1}, dtype="bfloat16")
    result = CliRunner().invoke(app, ["shardings", "--layers", "many"])
    assert result.exit_code == 2 and "--layers" in result.output


def test_with_bench_options_needs_one_bench_options_parameter():
    def no_options(label: str = "x") -> None: ...

    def two(a: BenchOptions, b: BenchOptions) -> None: ...

    for command in (no_options, two):
        with pytest.raises(TypeError, match="exactly one parameter annotated BenchOptions"):
            with_bench_options(command)

"""infra.planner.render: what ``multislice plan`` prints for a stack."""

from __future__ import annotations

import dataclasses
import io
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from infra import planner
from infra.cli import app
from infra.config import load_stack
from infra.planner.render import print_plan
from tests.planner.stacks import STACKS, stack
from training.model.transformer import param_count


def rendered(p: planner.Plan) -> str:
    """What :func:`print_plan` writes to a 200-column console without colours."""
    out = io.StringIO()
    print_plan(p, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def row(text: str, *cells: str) -> bool:
    """Whether a table line holds ``cells`` in order, separated by the table's borders."""
    pattern = r"\W+".join(re.escape(cell) for cell in cells)
    return any(re.search(rf"(^|\W){pattern}(\W|$)", line) for line in text.splitlines())


def test_dev_stack_output_gives_size_mesh_batch_memory_and_dcn_check():
    config = load_stack("dev", STACKS)
    p = planner.plan(config)
    text = rendered(p)
    acc, train = config.accelerator, config.training
    assert (
        f"stack dev: {config.slices} × {acc.name} (v4) = {config.slices * acc.chips} chips on "
        f"{config.total_workers} TPU VMs ({acc.hosts} per slice, {acc.chips_per_host} chips each); "
        f"{param_count(train.model, train.vocab_size):,} parameters"
    ) in text
    par = train.parallelism
    for axis in ("data", "fsdp", "tensor"):
        dcn, ici = getattr(par.dcn, axis), getattr(par.ici, axis)
        assert row(text, axis, str(dcn), str(ici), str(dcn * ici)), axis
    tokens = train.global_batch_size * train.sequence_length
    assert (
        f"global batch: {train.global_batch_size} sequences × {train.sequence_length} tokens = {tokens:,} tokens per "
        f"step; {tokens // par.dcn.data:,} per DCN replica ({par.dcn.data} replicas)"
    ) in text
    assert row(text, "total (estimate)", f"{p.memory.total / 2**20:,.1f} MiB of 32.00 GiB HBM capacity")
    assert ": fits" in text and "OVER HBM" not in text
    assert (
        "hardware arithmetic intensity = 4 chips/host × 2.75e+14 FLOP/s ÷ 5e+10 bit/s per host = 22,000 FLOP/bit"
        in text
    )
    replica_tokens = tokens // 2
    assert (
        f"operational intensity 4 × {replica_tokens:,} / 32 = {4 * replica_tokens // 32:,} FLOP/bit: DCN-bound" in text
    )
    minimum = 4 * 275e12 / 50e9 * 32 / 4  # tokens per replica, 2 replicas
    assert (
        f"minimum batch {minimum:,.0f} tokens per replica ({2 * minimum:,.0f} global); with the Multislice "
        f"overview's 2× margin {2 * minimum:,.0f} tokens per replica ({4 * minimum:,.0f} global) (not met)"
    ) in text


def test_every_token_figure_of_the_dcn_check_says_per_replica_or_global():
    """A figure is never printed bare: each number of tokens in the DCN lines and the
    recommendations is followed by "tokens per replica", "per replica", "tokens global",
    "global" or "tokens per step" (the issue: one figure, 352,000, read both ways)."""
    p = planner.plan(load_stack("dev", STACKS))
    text = rendered(p)
    all_lines = text.splitlines()
    lines = all_lines[all_lines.index("recommendations:") + 1 : all_lines.index("sources:")]
    lines += [line for line in all_lines if "minimum batch" in line or "global batch:" in line]
    assert len(lines) >= 4
    for line in lines:
        for match in re.finditer(r"(\d{1,3}(?:,\d{3})+)(?! (sequences|FLOP))", line):
            after = line[match.end() :]
            assert re.match(r" (tokens )?(per replica|global|per step|per DCN replica)", after), (match.group(), line)


def test_every_recommendation_and_source_is_printed_whole():
    p = planner.plan(load_stack("prod", STACKS))
    lines = rendered(p).splitlines()
    assert [line for line in lines if line.startswith("  - ")] == [f"  - {r}" for r in p.recommendations]
    for key, source in p.sources.items():
        assert f"  {key}: {source}" in lines
    assert lines.index("recommendations:") < lines.index("sources:")


def test_text_from_the_plan_is_not_read_as_markup():
    p = dataclasses.replace(planner.plan(stack(slices=1)), recommendations=("keep [bold]this[/bold] literal",))
    assert "  - keep [bold]this[/bold] literal" in rendered(p).splitlines()


def test_single_slice_has_no_dcn_lines():
    text = rendered(planner.plan(stack(slices=1)))
    assert "no data parallelism over DCN: no gradient all-reduce crosses DCN" in text
    assert "(1 replica)" in text
    assert "operational intensity" not in text and "minimum batch" not in text


def test_compute_bound_stack_with_margin():
    text = rendered(planner.plan(stack(slices=2, training={"global_batch_size": 704})))
    assert "FLOP/bit: compute-bound" in text
    assert "2× margin 352,000 tokens per replica (704,000 global)" in text and "(not met)" not in text


def test_over_hbm_total_and_sizes_in_mib_and_gib():
    big = {"model": {"d_model": 1024, "n_layers": 24, "n_heads": 16}, "sequence_length": 4096, "global_batch_size": 64}
    p = planner.plan(stack(slices=2, training=big))
    text = rendered(p)
    total = p.memory.parameters + p.memory.gradients + p.memory.optimizer_state + p.memory.activations
    assert total >= 2**30
    assert f"{total / 2**30:,.2f} GiB of 32.00 GiB HBM capacity ({total / (32 * 2**30):.1%}): OVER HBM" in text
    small = planner.plan(stack(slices=1))
    assert small.memory.parameters < 2**30
    assert row(rendered(small), "parameters (float32)", f"{small.memory.parameters / 2**20:,.1f} MiB")


@pytest.mark.parametrize("name", ["dev", "staging"])
def test_cli_prints_the_rendering(name):
    """``multislice plan`` prints exactly what :func:`print_plan` renders (same width)."""
    result = CliRunner().invoke(app, ["plan", "--stack", name], env={"COLUMNS": "200"}, color=False)
    assert result.exit_code == 0, result.output
    assert result.output == rendered(planner.plan(load_stack(name, STACKS)))

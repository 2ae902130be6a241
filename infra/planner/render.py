"""The human-readable ``multislice plan``: an :class:`infra.planner.Plan` on a rich console."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from infra.planner import Plan
from infra.planner.compiled import AGREEMENT, CompiledComparison
from infra.planner.elastic import describe as describe_elastic

__all__ = ["print_compiled", "print_plan"]


def _size(n: float) -> str:
    """Bytes as GiB (2**30) with two decimals from 1 GiB on, else MiB (2**20) with one."""
    return f"{n / 2**30:,.2f} GiB" if n >= 2**30 else f"{n / 2**20:,.1f} MiB"


def print_plan(p: Plan, console: Console) -> None:
    """Print the plan ``p`` on ``console``: the job's size, the mesh table, the global batch,
    the memory table with its verdict against HBM, the DCN check with its figures, the
    recommendations and the sources. Text from the plan (recommendations, sources) is printed
    without rich markup."""
    dcn, mem = p.dcn, p.memory
    console.print(
        f"[bold]stack {p.stack}[/]: {p.slices} × {p.accelerator_type} ({p.generation}) = {p.chips} chips on "
        f"{p.hosts} TPU VMs ({p.hosts_per_slice} per slice, {p.chips_per_host} chips each); "
        f"{p.parameters:,} parameters"
    )
    if p.capacity is not None:
        console.print(p.capacity, markup=False, highlight=False, soft_wrap=True)
    if p.apis:
        console.print(f"Google APIs pulumi up enables: {', '.join(p.apis)}", markup=False, soft_wrap=True)
    if p.elastic is not None:
        console.print(describe_elastic(p.elastic), markup=False, soft_wrap=True)
    mesh = Table(title="mesh (size = dcn × ici)", title_justify="left")
    for column in ("axis", "dcn", "ici", "size"):
        mesh.add_column(column, justify="left" if column == "axis" else "right")
    for axis, sizes in p.mesh.items():
        mesh.add_row(axis, str(sizes["dcn"]), str(sizes["ici"]), str(sizes["size"]))
    console.print(mesh)
    console.print(
        f"global batch: {p.global_batch_size} sequences × {p.sequence_length} tokens = "
        f"{p.global_batch_tokens:,} tokens per step; {dcn.tokens_per_replica:,.0f} per DCN replica "
        f"({dcn.replicas} replica{'s' if dcn.replicas != 1 else ''})"
    )
    memory = Table(title="memory per chip (estimate)", title_justify="left", show_header=False)
    for name, value in (
        ("parameters (float32)", mem.parameters),
        ("gradients (float32)", mem.gradients),
        ("optimizer state (AdamW mu, nu)", mem.optimizer_state),
        ("activations", mem.activations),
    ):
        memory.add_row(name, _size(value))
    verdict = "[green]fits[/]" if mem.fits else "[bold red]OVER HBM[/]"
    memory.add_row(
        "total (estimate)", f"{_size(mem.total)} of {_size(mem.capacity)} HBM capacity ({mem.fraction:.1%}): {verdict}"
    )
    console.print(memory)
    console.print(
        f"DCN check (Multislice overview): hardware arithmetic intensity = {dcn.chips_per_host} chips/host × "
        f"{dcn.peak_flops_per_chip:.4g} FLOP/s ÷ {dcn.dcn_bits_per_second_per_host:.4g} bit/s per host = "
        f"{dcn.arithmetic_intensity:,.0f} FLOP/bit"
    )
    if dcn.applies:
        verdict = "[bold red]DCN-bound[/]" if dcn.dcn_bound else "[green]compute-bound[/]"
        console.print(
            f"  operational intensity 4 × {dcn.tokens_per_replica:,.0f} / {dcn.bits_per_parameter} = "
            f"{dcn.operational_intensity:,.0f} FLOP/bit: {verdict}\n"
            f"  minimum batch {dcn.min_tokens_per_replica:,.0f} tokens per replica "
            f"({dcn.min_global_batch_tokens:,.0f} global); with the Multislice overview's {dcn.safety_margin:g}× "
            f"margin {dcn.recommended_tokens_per_replica:,.0f} tokens per replica "
            f"({dcn.recommended_global_batch_tokens:,.0f} global)" + ("" if dcn.meets_margin else " (not met)")
        )
    else:
        console.print("  no data parallelism over DCN: no gradient all-reduce crosses DCN")
    console.print("recommendations:")
    for line in p.recommendations:
        console.print(f"  - {line}", soft_wrap=True, markup=False)
    console.print("sources:")
    for key, source in p.sources.items():
        console.print(f"  {key}: {source}", soft_wrap=True, markup=False)


def print_compiled(c: CompiledComparison, console: Console) -> None:
    """Print XLA's compiled memory per device beside the planner's estimate for the same config
    (``multislice plan --compile``)."""
    x = c.xla
    verdict = "agrees" if c.agrees else "DISAGREES"
    console.print(
        f"compiled (XLA, {x['platform']}, {x['devices']} virtual devices): {_size(int(x['total']))} per device = "
        f"arguments {_size(int(x['argument']))} + outputs {_size(int(x['output']))} − aliased "
        f"{_size(int(x['alias']))} + temporaries {_size(int(x['temp']))}\n"
        f"  planner estimate for the same step on {x['platform']}: {_size(c.estimate.total)} per chip, "
        f"{c.ratio:.2f} × XLA's ({verdict} within ±{AGREEMENT:.0%})",
        soft_wrap=True,
        markup=False,
    )

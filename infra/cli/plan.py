"""``multislice plan``: the mesh, per-chip memory and the DCN check before ``pulumi up``
(:mod:`infra.planner`); with ``--compile``, XLA's own figure beside the estimate
(:mod:`infra.planner.compiled`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from infra.cli.option_values import seconds
from infra.cli.options import (
    CONFIG_FILE_OPTION,
    STACK_OPTION,
    console,
    fail,
    load_config,
    print_warning,
    render_release,
)


def plan(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    json_output: bool = typer.Option(False, "--json", help="Print the plan as JSON (for machines)."),
    compile_step: bool = typer.Option(
        False,
        "--compile",
        help="Also compile the real train step ahead of time for the stack's mesh on virtual CPU devices "
        "(nothing is allocated; seconds to minutes) and print XLA's memory per device beside the estimate.",
    ),
    compile_timeout: float = typer.Option(
        600.0, "--compile-timeout", parser=seconds(1), metavar="SECONDS", help="Seconds the compile may take."
    ),
) -> None:
    """Before `pulumi up`: the mesh, per-chip memory against HBM, and the Multislice overview's DCN check."""
    from infra import planner
    from infra.planner.render import print_compiled, print_plan

    config = load_config(stack, config_file)
    render_release(config)  # a release that cannot be built is refused as `render` refuses it
    if config.workload is not None:
        # The plan models the bundled trainer (its model, batch and mesh); a command brings its own.
        message = (
            f"stack {config.stack} runs its own command (multislice:workload), not the bundled trainer: "
            "the model, memory and DCN checks of `plan` are the trainer's and do not apply"
        )
        if json_output:
            typer.echo(json.dumps({"stack": config.stack, "workload": "command", "plan": None, "message": message}))
        else:
            console.print(message)
        return
    from infra.config import StackConfigError
    from infra.config.dataset import check_dataset

    try:
        checked = check_dataset(config)  # the dataset's manifest: the vocabulary the VMs will train
    except StackConfigError as err:
        raise fail(str(err)) from None
    if checked.warning is not None:
        print_warning(checked.warning)
    vocab_source = None
    if checked.manifest is not None and config.training.model.vocab_size is None:
        vocab_source = f"{checked.manifest} (multislice:training.model.vocab_size unset: the model takes the data's)"
    config = checked.config
    try:
        result = planner.plan(config, vocab_source=vocab_source)
    except ValueError as err:
        raise fail(str(err)) from None
    comparison = None
    if compile_step:
        from infra.planner import compiled

        try:
            comparison = compiled.compare(
                config.training, config.accelerator.generation.hbm_bytes_per_chip, compile_timeout
            )
        except compiled.CompileError as err:
            raise fail(f"--compile: {err}") from None
    if json_output:
        document = result.to_json()
        if comparison is not None:
            document["compiled"] = comparison.to_json()
        typer.echo(json.dumps(document, indent=2))
        return
    print_plan(result, console)
    if comparison is not None:
        print_compiled(comparison, console)

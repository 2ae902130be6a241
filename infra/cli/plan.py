"""``multislice plan``: the mesh, per-chip memory and the DCN check before ``pulumi up``
(:mod:`infra.planner`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from infra.cli.options import CONFIG_FILE_OPTION, STACK_OPTION, console, fail, load_config


def plan(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    json_output: bool = typer.Option(False, "--json", help="Print the plan as JSON (for machines)."),
) -> None:
    """Before `pulumi up`: the mesh, per-chip memory against HBM, and the Multislice overview's DCN check."""
    from infra import planner
    from infra.planner.render import print_plan

    config = load_config(stack, config_file)
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
    try:
        result = planner.plan(config)
    except ValueError as err:
        raise fail(str(err)) from None
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        print_plan(result, console)

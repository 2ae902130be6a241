"""``multislice``: the command line. One module per command group; this one builds the app.

    multislice local up [--stack dev] [--kill 1@40] [--preempt 0@80] [--fresh] [--summary-json F]
    multislice local down [--stack dev]
    multislice local status [--stack dev]                           (local.py)
    multislice local logs [--stack dev] [--follow]                  (logs.py)
    multislice status --stack prod [--json] [--watch] [--plot F]    (status.py)
    multislice logs --stack prod [--since 10m] [--follow]           (logs.py)
    multislice render --stack prod [-o script.sh] [--config]        (render.py)
    multislice check --stack prod [--policy-config policy.json]     (check.py)
    multislice diff --stack prod --against origin/main              (diff.py)
    multislice plan --stack prod [--json]                           (plan.py)
    multislice bench shardings --ici-fsdp 4 [--dcn-data 2] [--json] (bench.py)
    multislice data prepare SOURCE OUTPUT [--tokenizer bpe --vocab-size N] [--emulated] (data.py)
    multislice exec --stack prod [--slice N] [--worker W] [--background] -- CMD...   (exec.py)
    multislice local exec --stack dev [same options] -- CMD...       (exec.py)
    multislice reset --stack prod [--yes] [--timeout 600]           (reset.py)
    multislice local reset --stack dev [--yes]                      (reset.py)

The console, ``fail``/``say`` and the ``--stack``/``--config-file`` options all commands share
are in :mod:`infra.cli.options`; the parsers every option's value is read by while the command
line is (numbers, paths, fault specs) in :mod:`infra.cli.option_values`. Command modules parse
options and print; the work is done by the packages they call (:mod:`infra.local`,
:mod:`infra.status`, :mod:`infra.logs`, :mod:`infra.planner`, :mod:`infra.startup`, ...).

Errors end with one ``error:`` line naming the cause and a non-zero exit: 2 for bad input
(stack file, options), 1 for a failed run, 130 for Ctrl-C (SIGINT), 143 for SIGTERM. A command
whose standard output is closed under it (``| head -1``) stops quietly with exit 0
(:class:`infra.cli.options.ClosedPipeGroup`); ``local up`` stops its VMs and says so (exit 1).

Commands that neither train nor evaluate the program import nothing heavy (no Pulumi, no jax,
orbax or tensorstore, no ``google.cloud`` client: tests/cli/test_light_imports.py, which names the
module that brought one in; benchmarks/cli_speed.py times them): each command imports what it needs
inside its function, after checking its options; ``check`` and ``diff`` import Pulumi to evaluate
the program, and nothing else heavy.
"""

from __future__ import annotations

import typer

from infra.cli import bench, check, data, diff, exec as exec_cli, local, logs, plan, render, reset, status
from infra.cli.options import ClosedPipeGroup

app = typer.Typer(
    cls=ClosedPipeGroup,
    add_completion=False,
    no_args_is_help=True,
    help="Converge and emulate Cloud TPU Multislice training environments.",
)

# The order of registration is the order of `multislice --help` (commands, then groups).
app.command("render")(render.render)
app.command("plan")(plan.plan)
app.add_typer(bench.app, name="bench")
app.add_typer(data.app, name="data")
app.add_typer(local.app, name="local")
app.command("check")(check.check)
app.command("diff")(diff.diff)
app.command("status")(status.status)
app.command("logs")(logs.logs)
app.command("exec")(exec_cli.exec_command)
app.command("reset")(reset.reset)
local.app.command("logs")(logs.local_logs)
local.app.command("exec")(exec_cli.local_exec)
local.app.command("reset")(reset.local_reset)

"""``multislice reset`` and ``multislice local reset``: reboot every VM of the queued resource.

    multislice reset --stack S [--yes] [--timeout 600]
    multislice local reset --stack S [--yes] [--timeout 120]

ResetQueuedResource, asked for confirmation unless ``--yes`` (without a terminal to ask in,
``--yes`` is required), followed with progress until every VM is back or ``--timeout``
passes. Exit 0 when it finished; 2 for bad input or a queued resource that is missing,
deleted or not ACTIVE (nothing sent); 1 when not confirmed, refused, or not finished in time.
The work is done by :mod:`infra.remote.reset` and :mod:`infra.remote.emulated_reset`
(docs/exec-and-reset.md). A ``multislice:backend: compute-engine`` stack has no reset: both
commands refuse it with one line saying what to do instead, exit 2, nothing sent
(:func:`infra.remote.compute_ssh.reset_refusal`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import typer

from infra.cli.options import CONFIG_FILE_OPTION, STACK_OPTION, console, fail, load_config, say, state_root

YES_OPTION = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation.")


def _confirm(yes: bool) -> Callable[[str], bool]:
    def confirm(question: str) -> bool:
        if yes:
            console.print(question.rstrip("?") + ": yes (--yes)", markup=False, soft_wrap=True)
            return True
        if not sys.stdin.isatty():
            raise fail(f"{question.rstrip('?')}: no terminal to confirm in; add --yes")
        return typer.confirm(question, default=False)

    return confirm


def reset(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    yes: bool = YES_OPTION,
    timeout: float = typer.Option(
        600, "--timeout", min=1, metavar="SECONDS", help="Stop waiting after this many seconds (the reset goes on)."
    ),
) -> None:
    """Reset a deployed stack's queued resource (ResetQueuedResource): reboot every VM; a
    checkpointing workload resumes from its newest checkpoint."""
    from infra.remote import reset as resetting
    from infra.remote.selection import RemoteError

    config = load_config(stack, config_file)
    if config.backend == "compute-engine":
        from infra.remote.compute_ssh import reset_refusal

        raise fail(reset_refusal(config.stack))
    try:
        client = resetting.client_for_stack(config)
        result = resetting.reset(config, client, confirm=_confirm(yes), say=say, timeout_s=timeout)
    except RemoteError as err:
        raise fail(str(err), err.exit_code) from None
    console.print(
        f"reset: every VM of {config.queued_resource_id} rebooted in {result.seconds:.0f} s "
        f"({', '.join(f'{n} {s}' for n, s in result.nodes.items())}); each runs its startup script again",
        markup=False,
        soft_wrap=True,
    )


def local_reset(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    yes: bool = YES_OPTION,
    timeout: float = typer.Option(
        120, "--timeout", min=1, metavar="SECONDS", help="Stop waiting after this many seconds."
    ),
) -> None:
    """Reset the emulated queued resource of a running `local up`: restart every emulated VM;
    training resumes from its newest checkpoint."""
    from infra.local.state import LocalPaths
    from infra.remote import emulated_reset
    from infra.remote.selection import RemoteError

    config = load_config(stack, config_file)
    if config.backend == "compute-engine":
        raise fail(
            f"stack {config.stack} uses multislice:backend: compute-engine, which has no reset "
            "(docs/compute-engine.md, section 5), so its emulation has none either; nothing was sent. "
            f"To start every emulated VM again, `multislice local down --stack {config.stack}` then "
            f"`multislice local up --stack {config.stack}`"
        )
    try:
        seconds = emulated_reset.reset(
            config,
            LocalPaths(state_root() / config.stack),
            confirm=_confirm(yes),
            say=say,
            timeout_s=timeout,
        )
    except RemoteError as err:
        raise fail(str(err), err.exit_code) from None
    console.print(
        f"reset: every emulated VM of stack {config.stack} restarted in {seconds:.1f} s; "
        "training resumes from its newest checkpoint (multislice local status)",
        markup=False,
        soft_wrap=True,
    )

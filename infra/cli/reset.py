"""``multislice reset`` and ``multislice local reset``: reboot every VM of the queued resource.

    multislice reset --stack S [--yes] [--timeout 600]
    multislice local reset --stack S [--yes] [--timeout 120]

ResetQueuedResource, asked for confirmation unless ``--yes`` (without a terminal to ask in,
``--yes`` is required), followed with progress until every VM is back or ``--timeout``
passes. Exit 0 when it finished; 2 for bad input or a queued resource that is missing,
deleted or not ACTIVE (nothing sent); 1 when not confirmed, refused, or not finished in time.
The work is done by :mod:`infra.backends.queued_resource.reset` and
:mod:`infra.backends.queued_resource.emulated_reset` (docs/exec-and-reset.md); on
``multislice:backend: gke`` by :mod:`infra.backends.gke.reset`, which suspends the run's JobSet and
resumes it (docs/gke.md section 10). A backend without a reset (``multislice:backend:
compute-engine``; the gke emulation's ``local reset``) refuses with one line saying what to do
instead, exit 2, nothing sent
(:meth:`infra.backends.interface.Backend.reset_refusal`, ``local_reset_refusal``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import typer

from infra import invocation
from infra.cli.option_values import seconds
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
        600,
        "--timeout",
        parser=seconds(1),
        metavar="SECONDS",
        help="Stop waiting after this many seconds (the reset goes on).",
    ),
) -> None:
    """Restart a deployed stack's workers: ResetQueuedResource reboots every VM (queued resource),
    or the JobSet is suspended and resumed (gke); a checkpointing workload resumes from its newest
    checkpoint."""
    from infra.backends.operations import backend_of
    from infra.remote.selection import RemoteError

    config = load_config(stack, config_file)
    backend = backend_of(config)
    refusal = backend.reset_refusal(config)
    if refusal is not None:
        raise fail(refusal)
    try:
        done = backend.reset(config, confirm=_confirm(yes), say=say, timeout_s=timeout)
    except RemoteError as err:
        raise fail(str(err), err.exit_code) from None
    console.print(done, markup=False, soft_wrap=True)


def local_reset(
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    yes: bool = YES_OPTION,
    timeout: float = typer.Option(
        120, "--timeout", parser=seconds(1), metavar="SECONDS", help="Stop waiting after this many seconds."
    ),
) -> None:
    """Reset the emulated capacity of a running `local up`: restart every emulated VM (Pod on gke);
    training resumes from its newest checkpoint."""
    from infra.backends.operations import backend_of
    from infra.emulated.state import LocalPaths
    from infra.remote.selection import RemoteError

    config = load_config(stack, config_file)
    backend = backend_of(config)
    refusal = backend.local_reset_refusal(config)
    if refusal is not None:
        raise fail(refusal)
    try:
        seconds = backend.local_reset(
            config,
            LocalPaths(state_root() / config.stack),
            confirm=_confirm(yes),
            say=say,
            timeout_s=timeout,
        )
    except RemoteError as err:
        raise fail(str(err), err.exit_code) from None
    console.print(
        f"reset: the emulated {backend.spec.worker_noun} of stack {config.stack} restarted in {seconds:.1f} s; "
        f"training resumes from its newest checkpoint ({invocation.command('local status', config.stack)})",
        markup=False,
        soft_wrap=True,
    )

"""``multislice exec`` and ``multislice local exec``: a command on every worker at once.

    multislice exec --stack S [--slice N] [--worker W] [--background] [--log-dir D] -- CMD...
    multislice local exec --stack S [same options] -- CMD...

Each output line is printed as it comes, prefixed ``[slice s worker w]`` (a worker's traceback whose
exception says the TPU is already in use, as every JAX command's does while a run holds the chips, as
that one line: :mod:`infra.remote.tpu_in_use`); each worker's full
output is kept in ``<log dir>/slice-S-worker-W.log`` (default ``./multislice-exec/<stack>/<UTC
time>/`` for a deployed stack, ``<local state>/<stack>/exec/<UTC time>/`` for the emulation).
Exit 0 when every worker's command exited 0; else 1, naming each failed worker and its exit
status. Bad input (no command, a slice or worker the stack lacks, a stack not deployed or not
running, SSH not enabled, no gcloud or OpenSSH client, gcloud without credentials, broken SSH
key files) is one ``error:`` line, exit 2, and nothing runs. The work is done by
:mod:`infra.remote` (docs/exec-and-reset.md): on Cloud TPU :mod:`infra.remote.gcloud`, on the
compute-engine backend :mod:`infra.backends.compute_engine.instance_groups` (the VMs, each slice's group listed)
and :mod:`infra.backends.compute_engine.ssh` (``gcloud compute ssh``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from infra.cli.option_values import PATH, SLICE, WORKER
from infra.cli.options import CONFIG_FILE_OPTION, STACK_OPTION, err_console, fail, load_config, state_root

SLICE_OPTION = typer.Option(
    None, "--slice", parser=SLICE, metavar="N", help="Only the workers of slice N (default: all)."
)
WORKER_OPTION = typer.Option(
    None, "--worker", parser=WORKER, metavar="W", help="Only worker W of each selected slice (default: all)."
)
BACKGROUND_OPTION = typer.Option(
    False,
    "--background",
    help="Start the command detached (nohup, output to ~/multislice-exec/<time>.log on each worker) and return.",
)
LOG_DIR_OPTION = typer.Option(
    None,
    "--log-dir",
    metavar="DIR",
    parser=PATH,
    help="Keep each worker's output here (default: a new timestamped directory).",
)
COMMAND_ARGUMENT = typer.Argument(
    ..., metavar="-- CMD...", help="The command, after --; its words are joined into one shell line, as ssh does."
)


def _line(command: list[str], background: bool) -> str:
    from infra.remote.command import EmptyCommand, background_log, command_line, in_background

    try:
        line = command_line(command)
    except EmptyCommand as err:
        raise fail(str(err)) from None
    return in_background(line, background_log()) if background else line


def _log_dir(log_dir: Path | None, default_parent: Path) -> Path:
    from infra.remote.fanout import new_log_dir

    try:
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
            return log_dir
        return new_log_dir(default_parent)
    except OSError as err:
        raise fail(f"--log-dir {log_dir or default_parent}: {err.strerror or err}") from None


def _run(targets, log_dir: Path, what: str, describe=None) -> None:
    """Run the targets, print their lines, and end as the module docstring says; ``describe``
    words a failed worker's ending (default: its exit status)."""
    from infra.remote.fanout import describe_code, run_all
    from infra.remote.tpu_in_use import TracebackFold

    describe = describe or (lambda outcome: describe_code(outcome.code))

    err_console.print(
        f"running on {len(targets)} worker(s) of {what} at once; each worker's output: {log_dir}",
        markup=False,
        soft_wrap=True,
    )

    def emit(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    def notice(message: str) -> None:
        err_console.print(message, markup=False, soft_wrap=True)

    fold = TracebackFold(emit)  # a worker's "TPU already in use" traceback: one line
    try:
        try:
            run = run_all(targets, log_dir, fold, notice)
        finally:
            fold.flush()
    except KeyboardInterrupt:
        raise fail(f"interrupted: every worker's command was stopped; output so far: {log_dir}", 130) from None
    except OSError as err:
        raise fail(f"cannot run the command: {err.strerror or err}", 1) from None
    if run.failed:
        named = ", ".join(f"{o.target.name} ({describe(o)})" for o in run.failed)
        raise fail(f"{len(run.failed)} of {len(run.outcomes)} worker(s) failed: {named}; their output: {log_dir}", 1)
    err_console.print(
        f"all {len(run.outcomes)} worker(s) exited 0 in {run.seconds:.1f} s; output: {log_dir}",
        markup=False,
        soft_wrap=True,
    )


def exec_command(
    command: list[str] = COMMAND_ARGUMENT,
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    slice_id: int | None = SLICE_OPTION,
    worker: int | None = WORKER_OPTION,
    background: bool = BACKGROUND_OPTION,
    log_dir: Path | None = LOG_DIR_OPTION,
) -> None:
    """Run a command on every worker of a deployed stack at once (gcloud ssh through IAP, no batches;
    on the compute-engine backend `gcloud compute ssh` to each VM of the slices' instance groups)."""
    from infra.backends.operations import backend_of
    from infra.remote import gcloud
    from infra.remote.selection import RemoteError, select_workers

    config = load_config(stack, config_file)
    line = _line(command, background)
    try:
        workers = select_workers(config, slice_id, worker)
        backend = backend_of(config)
        created = None
        if not backend.exec_needs_ssh:  # kubectl exec: no SSH, no gcloud
            plan = backend.exec_plan("", config, workers, line)
        else:
            if not config.network.iap_ssh and not config.network.reuses_network:
                raise RemoteError(
                    f"stack {config.stack} admits no SSH: set multislice:network.iapSsh: true in its stack file and "
                    f"run `pulumi up --stack {config.stack}` (a firewall rule for IAP's range, TCP 22 only), then exec"
                )
            executable = gcloud.gcloud_executable()
            keygen = gcloud.require_ssh_tools()
            plan = backend.exec_plan(executable, config, workers, line)
            created = gcloud.ensure_ssh_key(keygen)
        targets = plan.targets()
    except RemoteError as err:
        raise fail(str(err), err.exit_code) from None
    if created is not None:
        err_console.print(
            f"made gcloud's SSH key {created} (ssh-keygen -t rsa, no passphrase, as gcloud --quiet makes it); "
            f"{plan.key_note}",
            markup=False,
            soft_wrap=True,
        )
    _run(
        targets,
        _log_dir(log_dir, Path("multislice-exec") / config.stack),
        f"stack {config.stack}",
        gcloud.describe,
    )


def local_exec(
    command: list[str] = COMMAND_ARGUMENT,
    stack: str = STACK_OPTION,
    config_file: Path | None = CONFIG_FILE_OPTION,
    slice_id: int | None = SLICE_OPTION,
    worker: int | None = WORKER_OPTION,
    background: bool = BACKGROUND_OPTION,
    log_dir: Path | None = LOG_DIR_OPTION,
) -> None:
    """Run a command in every emulated VM of a running `local up` at once (its directory and environment)."""
    from infra.emulated.state import LocalPaths
    from infra.remote import emulated
    from infra.remote.selection import RemoteError, select_workers

    config = load_config(stack, config_file)
    line = _line(command, background)
    paths = LocalPaths(state_root() / config.stack)
    try:
        targets = emulated.targets(config, paths, select_workers(config, slice_id, worker), line)
    except RemoteError as err:
        raise fail(str(err), err.exit_code) from None
    _run(targets, _log_dir(log_dir, paths.root / "exec"), f"stack {config.stack}'s local run")

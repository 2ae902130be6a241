"""How a command the tool prints reads, so that it runs as printed in the user's shell.

A hint (``resume with: … local up --stack dev``, ``see: … plan --config-file ~/Pulumi.x.yaml``)
starts with the invocation that reached this process, not a bare ``multislice`` that the user's
shell may not find:

* under ``uv run`` (uv sets ``UV_RUN_RECURSION_DEPTH`` and ``UV``, the path of its own executable,
  in the command's environment: https://docs.astral.sh/uv/reference/environment/; and, where the
  parent process can be read, that uv is this process's parent), ``<uv> run
  --frozen multislice``, where ``<uv>`` is ``uv`` when that name finds the same executable on the
  user's ``PATH`` (without the project environment's ``bin`` that ``uv run`` put first), else
  its path (relative to the working directory when below it: ``.venv-uv/bin/uv``), and with
  ``--project <checkout>`` when the working directory is outside the checkout (``uv run`` finds
  the project from the working directory up);
* ``multislice`` when that name on ``PATH`` is the script that runs, else the script's path as
  it was typed (``.venv/bin/multislice``);
* ``<python> -m infra.cli`` when run that way;
* else (an embedding program, the tests' in-process runner) ``multislice``.

The stack part is :func:`infra.stack_naming.stack_args`: ``--stack NAME`` or ``--config-file
PATH``, as this process read the stack.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

#: The console script's name (pyproject.toml, ``[project.scripts]``).
SCRIPT = "multislice"
#: The checkout this package runs from (``infra/invocation.py`` → the repository root).
CHECKOUT = Path(__file__).resolve().parent.parent


def _same_file(a: str | None, b: str) -> bool:
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _as_typed(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (``.venv-uv/bin/uv``), else absolute."""
    absolute = Path(path).absolute()
    try:
        return shlex.quote(str(absolute.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(absolute))


def parent_executable() -> str | None:
    """The executable of this process's parent (Linux's ``/proc/<ppid>/exe``), or None where it
    cannot be read (another system, a parent that already exited)."""
    try:
        return os.readlink(f"/proc/{os.getppid()}/exe")
    except OSError:
        return None


def _under_uv_run(environ: os._Environ[str] | dict[str, str], parent: str | None) -> str | None:
    if not environ.get("UV_RUN_RECURSION_DEPTH"):
        return None
    uv = environ.get("UV") or "uv"
    # uv run starts the command as its child; the variables pass on to every process below it (a
    # test suite under `uv run pytest` that starts `python -m infra.cli`), so where the parent can
    # be read it must be that uv.
    if parent is not None and not _same_file(parent, shutil.which(uv, path=environ.get("PATH")) or uv):
        return None
    # The user's PATH: uv run put the project's environment first, and it may hold a uv of its own.
    venv_bin = os.path.join(environ.get("VIRTUAL_ENV", ""), "bin")
    users_path = os.pathsep.join(
        p for p in environ.get("PATH", "").split(os.pathsep) if not (environ.get("VIRTUAL_ENV") and p == venv_bin)
    )
    shown = "uv" if uv == "uv" or _same_file(shutil.which("uv", path=users_path), uv) else _as_typed(uv)
    project = ""
    if Path.cwd().resolve() != CHECKOUT and CHECKOUT not in Path.cwd().resolve().parents:
        project = f" --project {shlex.quote(str(CHECKOUT))}"
    return f"{shown} run --frozen{project} {SCRIPT}"


def invocation(
    argv0: str | None = None,
    environ: os._Environ[str] | dict[str, str] | None = None,
    parent: str | None = "",
) -> str:
    """The words that run this CLI again from the user's shell (see the module docstring), shell-quoted.

    Args:
      argv0: the program as started (default ``sys.argv[0]``).
      environ: the environment (default ``os.environ``).
      parent: the parent process's executable (default :func:`parent_executable`; None: unknown).
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    environ = os.environ if environ is None else environ
    parent = parent_executable() if parent == "" else parent
    name = Path(argv0).name
    as_module = name == "__main__.py" and Path(argv0).parent.name == "cli"
    if name != SCRIPT and not as_module:
        return SCRIPT  # not this CLI's process: a test runner, the Pulumi engine's program
    if (uv := _under_uv_run(environ, parent)) is not None:
        return uv
    if as_module:
        return f"{shlex.quote(sys.executable)} -m infra.cli"
    if _same_file(shutil.which(SCRIPT, path=environ.get("PATH")), argv0):
        return SCRIPT
    return shlex.quote(argv0) if os.sep in argv0 else _as_typed(argv0)


def command(words: str, stack: str | None = None, after: str = "") -> str:
    """A command line to print: :func:`invocation`, ``words`` (a subcommand and its options, already
    quoted), the stack as this process read it (:func:`infra.stack_naming.stack_args`), then
    ``after`` (more options, quoted).

    >>> command("local status", "dev")  # doctest: +SKIP
    'uv run --frozen multislice local status --stack dev'
    """
    from infra.stack_naming import stack_args

    parts = [invocation(), words, "" if stack is None else stack_args(stack), after]
    return " ".join(part for part in parts if part)

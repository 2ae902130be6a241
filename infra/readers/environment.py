"""The environment variables the tool reads for itself, read in one place.

* ``MULTISLICE_STACKS_DIR``: the folder of the stack files (default: ``stacks/`` of the project,
  :func:`infra.config.loading.default_stacks_dir`); one that names a file (or anything else that
  is not a directory) is refused, never taken for a folder without stacks;
* ``MULTISLICE_STATE_DIR``: where local emulations keep their state (default:
  ``<project>/.multislice/local``, :func:`infra.cli.options.state_root`);
* ``MULTISLICE_LOG_LEVEL``: the level of the trainer's log lines (``python -m training``; default
  ``INFO``): one of :data:`LOG_LEVELS`, anything else refused.

An unset or empty variable leaves the default. A refused value raises :class:`VariableError`,
one line naming the variable; every ``multislice`` command reads these first
(:func:`check_all`), before its options are used. The emulated VMs' and the trainer's variables
are the VM contract's (:mod:`infra.vm_contract`).
"""

from __future__ import annotations

import os
from pathlib import Path

STACKS_DIR_ENV = "MULTISLICE_STACKS_DIR"
STATE_DIR_ENV = "MULTISLICE_STATE_DIR"
LOG_LEVEL_ENV = "MULTISLICE_LOG_LEVEL"

#: The levels ``MULTISLICE_LOG_LEVEL`` takes: the names Python's ``logging`` reads, as written there.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class VariableError(ValueError):
    """An environment variable set to something it cannot mean; the message (one line) names it
    and says what it takes."""


def stacks_dir() -> Path | None:
    """``$MULTISLICE_STACKS_DIR`` as a path, or None when it is unset or empty.

    Raises:
      VariableError: it names a file (or a FIFO, a device: anything that is not a directory), or a
        path under one. A path that does not exist is returned: the stack it lacks is named then.
    """
    path = _directory(STACKS_DIR_ENV)
    if path is None:
        return None
    try:
        existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), None)
    except (OSError, ValueError):  # a name past the system's limits: the stack read says why
        return path
    if existing is None or existing.is_dir():
        return path
    kind = _kind(existing)
    where = "" if existing == path else f": {existing} is {kind}"
    raise VariableError(
        f"{STACKS_DIR_ENV}={_shown(os.environ[STACKS_DIR_ENV])} names {'a path under ' + kind if where else kind}, "
        f"not a directory{where}; point it at the folder of the Pulumi.<stack>.yaml files, or unset it for the "
        "project's stacks/"
    )


def state_dir() -> Path | None:
    """``$MULTISLICE_STATE_DIR`` as a path, or None when it is unset or empty."""
    return _directory(STATE_DIR_ENV)


def log_level() -> str | None:
    """``$MULTISLICE_LOG_LEVEL``, one of :data:`LOG_LEVELS`, or None when it is unset or empty.

    Raises:
      VariableError: any other value (a level in other case, a number, a typo), naming the levels.
    """
    value = os.environ.get(LOG_LEVEL_ENV)
    if not value:
        return None
    if value in LOG_LEVELS:
        return value
    hint = f" (did you mean {value.strip().upper()}?)" if value.strip().upper() in LOG_LEVELS else ""
    raise VariableError(
        f"{LOG_LEVEL_ENV}={_shown(value)} is not a log level{hint}; allowed: {', '.join(LOG_LEVELS)} (unset: INFO)"
    )


def check_all() -> None:
    """Read every variable of this module once (what each ``multislice`` command does first).

    Raises:
      VariableError: the first one that is refused.
    """
    stacks_dir()
    state_dir()
    log_level()


def _directory(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def _kind(path: Path) -> str:
    """What ``path``, which exists and is not a directory, is: ``a file``, ``a FIFO``, …"""
    from infra.readers.files import special_kind

    try:
        mode = path.stat().st_mode
    except OSError:  # a dangling link
        return "a broken symbolic link"
    return special_kind(mode) or "a file"


def _shown(value: str) -> str:
    """A variable's value as a message quotes it: its repr, cut short past 300 characters."""
    return repr(value) if len(value) <= 300 else f"{value[:200]!r}… ({len(value):,} characters)"

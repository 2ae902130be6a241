"""The environment variables that move the tool's own directories, read in one place.

* ``MULTISLICE_STACKS_DIR``: the folder of the stack files (default: ``stacks/`` of the project,
  :func:`infra.config.loading.default_stacks_dir`);
* ``MULTISLICE_STATE_DIR``: where local emulations keep their state (default:
  ``<project>/.multislice/local``, :func:`infra.cli.options.state_root`).

An unset or empty variable leaves the default. The emulated VMs' and the trainer's variables are the
VM contract's (:mod:`infra.vm_contract`).
"""

from __future__ import annotations

import os
from pathlib import Path

STACKS_DIR_ENV = "MULTISLICE_STACKS_DIR"
STATE_DIR_ENV = "MULTISLICE_STATE_DIR"


def stacks_dir() -> Path | None:
    """``$MULTISLICE_STACKS_DIR`` as a path, or None when it is unset or empty."""
    return _directory(STACKS_DIR_ENV)


def state_dir() -> Path | None:
    """``$MULTISLICE_STATE_DIR`` as a path, or None when it is unset or empty."""
    return _directory(STATE_DIR_ENV)


def _directory(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None

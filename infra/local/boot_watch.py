"""Which emulated VMs never reached the trainer: a VM that does not boot is named (slice and
worker) within ``--boot-timeout`` seconds of its boot, well before the stall timeout.

A VM has reached the trainer once, since its latest boot, its console log shows its
systemd starting the trainer's unit (``Started multislice-trainer.service.``), or once the
run's events log shows a trainer ``start`` written after that boot (every process of the
job took part in it: ``jax.distributed`` waits for all of them).

The default bound is :data:`DEFAULT_BOOT_TIMEOUT_S`, or ``$MULTISLICE_BOOT_TIMEOUT`` (seconds).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable
from pathlib import Path

from infra.vm_contract import TRAINER_UNIT

#: Environment variable: the default of ``local up --boot-timeout`` (seconds).
BOOT_TIMEOUT_ENV = "MULTISLICE_BOOT_TIMEOUT"
#: Seconds from a VM's boot to its trainer's start before it is reported as not booting
#: (a boot of the rendered script takes seconds here; the stall timeout is 600 s).
DEFAULT_BOOT_TIMEOUT_S = 120.0
_MARKER = f"systemd[1]: Started {TRAINER_UNIT}.".encode()


class BootTimeoutError(ValueError):
    """``$MULTISLICE_BOOT_TIMEOUT`` set to something that is not a positive number of seconds."""


def default_boot_timeout() -> float:
    """``$MULTISLICE_BOOT_TIMEOUT`` when set, else :data:`DEFAULT_BOOT_TIMEOUT_S`.

    Raises:
      BootTimeoutError: the variable is set but not a positive finite number (never ignored).
    """
    raw = os.environ.get(BOOT_TIMEOUT_ENV, "")
    if not raw.strip():
        return DEFAULT_BOOT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise BootTimeoutError(
            f"{BOOT_TIMEOUT_ENV}={raw[:40]!r} is not a positive number of seconds; unset it for the default "
            f"{DEFAULT_BOOT_TIMEOUT_S:g}"
        )
    return value


class BootWatch:
    """The VMs of the latest boot that have not reached the trainer yet."""

    def __init__(self) -> None:
        self.booted_at = time.monotonic()
        #: name -> (console log, offset of this boot's output, bytes already searched)
        self._pending: dict[str, tuple[Path, int]] = {}

    def booted(self, vms: Iterable) -> None:
        """Every VM of ``vms`` (``name``, ``log_path``) was just booted."""
        self.booted_at = time.monotonic()
        self._pending = {vm.name: (vm.log_path, _size(vm.log_path)) for vm in vms}

    def trainer_started(self) -> None:
        """A trainer ``start`` event of the current attempt was read: every VM is in it."""
        self._pending.clear()

    def not_booted(self, timeout_s: float, now: float | None = None) -> list[str]:
        """Names of the VMs that have not reached the trainer ``timeout_s`` seconds after
        their boot ([] before then, or when all did)."""
        for name, (log, offset) in list(self._pending.items()):
            if _has_marker(log, offset):
                del self._pending[name]
        now = time.monotonic() if now is None else now
        if now - self.booted_at < timeout_s:
            return []
        return list(self._pending)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _has_marker(log: Path, offset: int) -> bool:
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            return _MARKER in f.read()
    except OSError:
        return False

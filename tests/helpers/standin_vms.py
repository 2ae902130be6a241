"""Emulated VMs that boot a stand-in for the startup script (no trainer): infra.local.emulated_stack's
lifecycle, quickly (tests/local/test_emulator.py, tests/local/test_gke_emulator.py)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import psutil

from infra.config import load_stack_file
from infra.emulated.state import LocalPaths
from infra.local.emulated_stack import EmulatedStack, Options

# Stands in for the startup script: says where it booted, keeps running like a trainer, and
# on SIGTERM (shutdown, preemption notice) writes a line and exits.
SCRIPT = """#!/bin/bash
trap 'echo "got SIGTERM"; exit 0' TERM
sleep 600 &
echo "up on $MULTISLICE_HOME"
wait
"""


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_until_up(resource) -> None:
    """Until every VM's current boot has set its SIGTERM handler (60 s at most)."""
    deadline = time.monotonic() + 60
    for vm in resource.vms:
        while "up on" not in boot_log(vm.log_path, vm.boots):
            assert time.monotonic() < deadline, vm.log_path.read_text()
            time.sleep(0.02)


def boot_log(log: Path, boot: int) -> str:
    """The part of a VM's console log written by boot number ``boot``."""
    text = log.read_text()
    start = text.index(f"===== boot {boot} of ")
    end = text.find("===== boot ", start + 1)
    return text[start : end if end >= 0 else None]


@contextlib.contextmanager
def booted(stack: Path, tmp_path: Path, script: str = SCRIPT):
    """The stack's emulation with ``script`` (the stand-in), booted (its report lines in ``.lines``)."""
    lines: list[str] = []
    resource = EmulatedStack(load_stack_file(stack), LocalPaths(tmp_path / "emu"), script, report=lines.append)
    resource.lines = lines
    try:
        resource.open_storage()
        resource.create()
        resource.boot_all(Options(reboot_grace_s=120, preempt_grace_s=120))
        wait_until_up(resource)
        yield resource
    finally:
        resource.shutdown()

"""``multislice local reset`` (infra.backends.queued_resource.emulated_reset) against the emulator itself
(``EmulatedStack.up``) with a stand-in startup script and no trainer: the reset goes
through the emulated TPU API, every VM is restarted and boots again (its disk kept, unlike a
repair), and the waiting side sees each VM come back (seconds: the emulator's Cloud Storage
and its run summary). The trainer's resume after a reset is
asserted in tests/local/test_reset_emulation.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from infra.backends.queued_resource import emulated_reset
from infra.config import load_stack_file
from infra.emulated import state as state_lib
from infra.emulated.state import LocalPaths
from infra.local.emulated_stack import EmulatedStack, Options
from infra.remote.selection import RemoteError

STACK = Path(__file__).parents[2] / "stacks" / "Pulumi.emu.yaml"

#: Counts its boots on the VM's disk; runs until reset on the first; on the second, runs until
#: the test has seen the reset end (``reset-done`` on the VM's disk; at most 120 s), then exits
#: 0. (Exiting at once could end the run before the waiting side saw the VM back.)
SCRIPT = """#!/bin/bash
boots=$(( $(cat "$MULTISLICE_HOME/boots" 2>/dev/null || echo 0) + 1 ))
echo "$boots" > "$MULTISLICE_HOME/boots"
[ "$boots" = 1 ] && exec sleep 600
for _ in $(seq 1200); do [ -e "$MULTISLICE_HOME/reset-done" ] && exit 0; sleep 0.1; done
exit 0
"""


@pytest.mark.timeout(300)
def test_a_reset_restarts_every_vm_and_waits_until_each_booted_again(tmp_path):
    config = load_stack_file(STACK)
    paths = LocalPaths(tmp_path / "emu")
    lines: list[str] = []
    said: list[str] = []
    outcome: dict = {}

    def reset_once_booted():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = state_lib.read_state(paths) or {}
            booted = all(paths.vm_home(s, 0).joinpath("boots").exists() for s in range(2))  # the script ran
            if state.get("tpu_api_url") and booted:
                break
            time.sleep(0.05)
        try:
            outcome["seconds"] = emulated_reset.reset(
                config, paths, confirm=lambda question: said.append(question) or True, say=said.append, timeout_s=150
            )
        except RemoteError as err:
            outcome["error"] = err
        for s in range(2):  # the VMs' second boots may end now
            paths.vm_home(s, 0).joinpath("reset-done").touch()

    resetter = threading.Thread(target=reset_once_booted)
    resetter.start()
    resource = EmulatedStack(config, paths, SCRIPT, report=lines.append)
    with resource.running():
        resource.up(Options(poll_s=0.05, stall_timeout_s=120, timeout_s=240))
    resetter.join(timeout=180)  # generous: the VMs reboot slowly on a loaded 2-core machine
    assert "error" not in outcome, outcome
    assert "reset: restarting every VM of the queued resource (ResetQueuedResource)" in lines
    assert resource.capacity.api is not None and resource.capacity.api.resets == 1
    for s in range(2):
        assert paths.vm_home(s, 0).joinpath("boots").read_text() == "2\n"  # rebooted, disk kept
        assert f"slice {s} worker 0: booted again" in said
    assert said[0].startswith("Reset stack emu's emulated queued resource: restart its 2 VM(s)")
    assert state_lib.find_processes(resource.emulation_id) == []


def test_a_stack_with_no_local_run_cannot_be_reset(tmp_path):
    with pytest.raises(RemoteError, match=r"stack emu has no local run: start one with `multislice local up"):
        emulated_reset.reset(
            load_stack_file(STACK), LocalPaths(tmp_path / "emu"), confirm=lambda q: True, say=print, timeout_s=1
        )

"""A VM that never reaches the trainer is named (slice and worker) within --boot-timeout of
its boot, well before the stall timeout: in unit tests of infra.local.boot_watch, and through
the emulator's own loop with VMs whose startup script never starts the trainer (no JAX)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from infra.config import load_stack_file
from infra.emulated.state import LocalPaths
from infra.emulated.vm import EmulatedVM
from infra.local import boot_watch
from infra.local.boot_watch import BootWatch
from infra.local.emulated_stack import EmulatedStack, EmulationError, Options

STACK = Path(__file__).parents[1] / "stacks" / "Pulumi.emu.yaml"
MARKER = "systemd[1]: Started multislice-trainer.service."


class Vm:
    def __init__(self, name: str, log_path: Path):
        self.name, self.log_path = name, log_path


def test_a_vm_is_booted_once_its_log_shows_the_trainer_unit_start_after_its_boot(tmp_path):
    a, b = Vm("slice 0 worker 0", tmp_path / "a.log"), Vm("slice 1 worker 0", tmp_path / "b.log")
    b.log_path.write_text(f"{MARKER}\n")  # an earlier boot's start does not count
    watch = BootWatch()
    watch.booted([a, b])
    a.log_path.write_text(f"boot: ...\n{MARKER}\n")
    assert watch.not_booted(60) == []  # not yet due
    assert watch.not_booted(60, now=time.monotonic() + 61) == ["slice 1 worker 0"]
    watch.trainer_started()  # a trainer start of this attempt: every VM is in it
    assert watch.not_booted(60, now=time.monotonic() + 61) == []


def test_the_default_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(boot_watch.BOOT_TIMEOUT_ENV, raising=False)
    assert Options().boot_timeout_s == boot_watch.DEFAULT_BOOT_TIMEOUT_S < Options().stall_timeout_s / 4
    monkeypatch.setenv(boot_watch.BOOT_TIMEOUT_ENV, "7.5")
    assert Options().boot_timeout_s == 7.5
    # A value that is not a positive number is refused, naming the variable, never ignored.
    for bad in ("soon", "0", "-3", "nan", "inf"):
        monkeypatch.setenv(boot_watch.BOOT_TIMEOUT_ENV, bad)
        with pytest.raises(boot_watch.BootTimeoutError, match=f"MULTISLICE_BOOT_TIMEOUT='{bad}' is not a positive"):
            Options()


@pytest.mark.timeout(120)
def test_a_vm_that_reaches_the_trainer_as_it_boots_is_not_named(tmp_path, monkeypatch):
    """Slice 0's console shows the trainer unit's start the moment its boot returns, before slice
    1 is booted (as a loaded machine can order them): slice 0 has booted, only slice 1 is named."""
    real_boot = EmulatedVM.boot

    def boot(vm: EmulatedVM, env: dict[str, str]):
        group = real_boot(vm, env)
        if vm.name == "slice 0 worker 0":
            with vm.log_path.open("a") as log:
                log.write(f"{MARKER}\n")
        return group

    monkeypatch.setattr(EmulatedVM, "boot", boot)
    resource = EmulatedStack(
        load_stack_file(STACK), LocalPaths(tmp_path / "emu"), "#!/bin/bash\nexec sleep 600\n", report=lambda line: None
    )
    with resource.running(), pytest.raises(EmulationError) as raised:
        resource.up(Options(poll_s=0.05, boot_timeout_s=2, stall_timeout_s=600, timeout_s=60))
    assert str(raised.value).startswith("slice 1 worker 0: not booting (no trainer 2 s after its boot; --boot-timeout)")
    assert all(not vm.group.alive() for vm in resource.vms)


@pytest.mark.timeout(120)
def test_a_vm_whose_trainer_never_starts_is_named_within_the_boot_timeout(tmp_path):
    # Slice 0's startup script starts its trainer (as far as the console shows); slice 1's hangs.
    # The bound is far above an echo's start-up: only slice 1's hang reaches it. (Slice 0 named too,
    # with the trainer's start in its log, was the watch armed after the boots: the test above.)
    script = f"""#!/bin/bash
case "$MULTISLICE_HOME" in
  *slice-0-worker-0) echo "{MARKER}" ;;
esac
exec sleep 600
"""
    config = load_stack_file(STACK)
    resource = EmulatedStack(config, LocalPaths(tmp_path / "emu"), script, report=lambda line: None)
    options = Options(poll_s=0.05, boot_timeout_s=12, stall_timeout_s=600, timeout_s=60)
    with resource.running():
        started = time.monotonic()
        with pytest.raises(EmulationError) as raised:
            resource.up(options)
        took = time.monotonic() - started
    print(f"named the VM that did not boot {took:.2f} s after local up booted it (bound 12 s)")
    message = str(raised.value)
    assert message.startswith("slice 1 worker 0: not booting (no trainer 12 s after its boot; --boot-timeout)")
    assert "slice 0 worker 0" not in message.splitlines()[0]
    assert all(not vm.group.alive() for vm in resource.vms)

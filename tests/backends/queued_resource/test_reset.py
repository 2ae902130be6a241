"""``multislice reset`` with the real google-cloud-tpu client against the loopback TPU API fake
(tests/fakes/tpu_api.py, whose reset restarts the nodes): confirmation, progress per node, the
result; a missing (deleted on completion, or never deployed) or not ACTIVE queued resource is
refused with nothing sent; a reset that outlasts --timeout is reported as unfinished."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.cloud import tpu_v2
from typer.testing import CliRunner

from infra.cli import app
from tests.fakes.queued_resource import clear_ambient_credentials
from tests.fakes.tpu_api import FakeTpuApi

STACK = Path(__file__).parents[2] / "stacks" / "Pulumi.emu.yaml"  # 2 × v4-8, deleteOnComplete on (spot)
PARENT = "projects/multislice-tests/locations/us-central2-b"
NAME = f"{PARENT}/queuedResources/multislice-emu"
NODES = [f"{PARENT}/nodes/multislice-emu-{i}" for i in range(2)]


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch, tmp_path):
    clear_ambient_credentials(monkeypatch, tmp_path)


def seed(fake: FakeTpuApi) -> None:
    node = tpu_v2.Node(accelerator_type="v4-8", runtime_version="tpu-ubuntu2204-base")
    spec = tpu_v2.QueuedResource.Tpu.NodeSpec(
        parent=PARENT,
        node=node,
        multislice_params=tpu_v2.QueuedResource.Tpu.NodeSpec.MultisliceParams(
            node_count=2, node_id_prefix="multislice-emu"
        ),
    )
    fake.add_active(tpu_v2.QueuedResource(name=NAME, tpu=tpu_v2.QueuedResource.Tpu(node_spec=[spec])))


def reset(fake: FakeTpuApi, *args: str, config: Path = STACK):
    return CliRunner().invoke(
        app,
        ["reset", "--config-file", str(config), *args],
        env={"MULTISLICE_TPU_API_ENDPOINT": fake.endpoint, "COLUMNS": "250"},
        color=False,
    )


def test_the_reset_restarts_every_node_and_waits_until_all_are_ready():
    with FakeTpuApi(op_polls=2) as fake:
        seed(fake)
        result = reset(fake, "--yes")
        assert result.exit_code == 0, result.output
        assert fake.resets(NAME) == 1 and fake.node_restarts == {node: 1 for node in NODES}
        assert all(fake.node(node).state == tpu_v2.Node.State.READY for node in NODES)
        out = " ".join(result.stdout.split())
        assert "reboot its 2 VM(s) (2 slice(s) × 1 worker(s)), stopping what they run: yes (--yes)" in out
        assert "multislice-emu-0: RESTARTING" in out and "multislice-emu-0: READY" in out
        assert out.index("multislice-emu-1: RESTARTING") < out.index("multislice-emu-1: READY")
        assert "reset: every VM of multislice-emu rebooted in" in out
        assert "(multislice-emu-0 READY, multislice-emu-1 READY)" in out
        rpcs = fake.rpcs(include_reads=False)
        assert rpcs == ["ResetQueuedResource"]  # and no delete, no update


def test_without_a_terminal_or_yes_nothing_is_reset():
    with FakeTpuApi() as fake:
        seed(fake)
        result = reset(fake)
        assert result.exit_code == 2
        assert "no terminal to confirm in; add --yes" in " ".join(result.stderr.split())
        assert fake.resets(NAME) == 0


def test_a_queued_resource_deleted_on_completion_or_never_deployed_is_named():
    with FakeTpuApi() as fake:
        result = reset(fake, "--yes")
        assert result.exit_code == 2
        error = " ".join(result.stderr.split())
        assert error.startswith(
            f"error: stack emu: queued resource multislice-emu not found in {PARENT}, nothing to reset"
        )
        assert "deleteOnComplete worker 0 of slice 0 deletes it once the run completes" in error
        assert len(result.stderr.strip().splitlines()) == 1
        assert fake.rpcs(include_reads=False) == []


def test_a_queued_resource_that_is_not_active_is_refused():
    with FakeTpuApi() as fake:
        seed(fake)
        fake.set_state(NAME, "SUSPENDED")
        result = reset(fake, "--yes")
        assert result.exit_code == 2
        assert "is SUSPENDED: only an ACTIVE queued resource has VMs to reset" in " ".join(result.stderr.split())
        assert fake.resets(NAME) == 0


def test_a_reset_that_outlasts_the_timeout_is_reported_unfinished():
    with FakeTpuApi(op_polls=1000) as fake:
        seed(fake)
        result = reset(fake, "--yes", "--timeout", "1")
        assert result.exit_code == 1
        error = " ".join(result.stderr.split())
        assert "the reset of multislice-emu has not finished after 1 s" in error
        assert "multislice-emu-0 RESTARTING" in error and "operation running" in error

"""``multislice status`` for a deployed stack: the queued resource and its slices from the
loopback Cloud TPU API fake, the run from the session's emulated Cloud Storage, and the one-line
errors (never deployed, no credentials, no run yet)."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app, status as status_cli
from infra.config import load_stack_file
from tests.fakes.queued_resource import no_ambient_credentials, props_for, provider_for, qr_name  # noqa: F401 (fixture)
from tests.fakes.synthetic_run import Fault, SyntheticRun, upload
from tests.fakes.tpu_api import FakeTpuApi
from tests.helpers.emulation import STACK

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"}, color=False)


@pytest.fixture
def stack(tmp_path, bucket) -> str:
    """The emu stack (2 slices) with its checkpoint bucket on the emulated Cloud Storage."""
    document = yaml.safe_load(STACK.read_text())
    document["config"]["multislice:bucket"] = {"name": bucket}
    path = tmp_path / "Pulumi.emu.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


@pytest.fixture
def fake(monkeypatch):
    with FakeTpuApi() as server:
        monkeypatch.setenv("MULTISLICE_TPU_API_ENDPOINT", server.endpoint)
        yield server


def deploy(fake: FakeTpuApi, stack: str) -> dict:
    """Create the stack's queued resource in the fake (as `pulumi up` would); its props."""
    props = props_for(load_stack_file(stack))
    provider_for(fake).create(props)
    return props


def in_progress() -> SyntheticRun:
    return SyntheticRun(
        total_steps=24,
        steps_done=18,
        log_every=2,
        checkpoint_every=6,
        faults=[Fault("failure", 9), Fault("preemption", 14)],
        goodput={"goodput": 0.75, "badput": {"boot": 120.0}},
    )


def test_a_deployed_stack_as_json(fake, stack):
    props = deploy(fake, stack)
    # The fake answers as the service does: one nodeSpec entry per slice (docs/cloud-tpu.md).
    entries = fake.queued_resources[qr_name(props)].qr.tpu.node_spec
    assert [s.node_id for s in entries] == ["multislice-emu-0", "multislice-emu-1"]
    config = load_stack_file(stack)
    run = in_progress()
    upload(config.run_dir, run.objects())
    result = invoke("status", "--config-file", stack, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["stack"], data["emulated"]) == ("emu", False)
    assert data["queued_resource"]["id"] == "multislice-emu"
    assert data["queued_resource"]["state"] == "ACTIVE"
    assert [(s["slice"], s["node"], s["state"], s["health"]) for s in data["queued_resource"]["slices"]] == [
        (0, "multislice-emu-0", "READY", "HEALTHY"),
        (1, "multislice-emu-1", "READY", "HEALTHY"),
    ]
    assert data["run"]["run_dir"] == config.run_dir
    assert (data["run"]["step"], data["run"]["total_steps"], data["run"]["loss"]) == (18, 24, run.metrics[-1]["loss"])
    assert (data["run"]["restarts"], data["run"]["preemptions"], data["run"]["goodput"]) == (2, 1, 0.75)
    assert data["run"]["last_checkpoint_step"] == 18 and data["run"]["complete"] is False
    assert {c.rpc for c in fake.calls} >= {"GetQueuedResource", "ListNodes"}


def test_a_deployed_stack_as_a_table(fake, stack):
    deploy(fake, stack)
    upload(load_stack_file(stack).run_dir, in_progress().objects())
    result = invoke("status", "--config-file", stack)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.splitlines()[0] == "stack emu: queued resource multislice-emu is ACTIVE"
    for text in (
        "multislice-emu-0  READY  HEALTHY",
        "18/24  75%",
        "step 18 at",
        "2 (1 after a preemption)",
        "failure, resumed from the checkpoint of step 6",
        "preemption at step 14",
        "goodput",
        "0.750",
        "boot 120.0 s",
    ):
        assert text in out, text
    assert "COMPLETE" not in out


def test_a_preempted_queued_resource_and_its_slices(fake, stack):
    props = deploy(fake, stack)
    upload(load_stack_file(stack).run_dir, in_progress().objects())
    fake.preempt(qr_name(props))
    data = json.loads(invoke("status", "--config-file", stack, "--json").stdout)
    # the fake's first read after a preemption: SUSPENDING, nodes PREEMPTED; the next: SUSPENDED, nodes deleted
    assert data["queued_resource"]["state"] in ("SUSPENDING", "SUSPENDED")
    again = json.loads(invoke("status", "--config-file", stack, "--json").stdout)
    assert again["queued_resource"]["state"] == "SUSPENDED"
    assert [s["state"] for s in again["queued_resource"]["slices"]] == ["MISSING", "MISSING"]


def test_a_stack_that_was_never_deployed(fake, stack):
    result = invoke("status", "--config-file", stack)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert (
        "error: stack emu: queued resource 'multislice-emu' "
        "not found in projects/multislice-tests/locations/us-central2-b" in result.stderr
    )
    assert "never deployed" in result.stderr


def test_a_queued_resource_gone_after_its_run_completed_is_deleted(fake, stack):
    # deleteOnComplete: worker 0 of slice 0 deleted it once the run wrote COMPLETE. As the
    # provider treats it (converged), the status shows the finished run, not an error.
    props = deploy(fake, stack)
    config = load_stack_file(stack)
    upload(config.run_dir, SyntheticRun(total_steps=24, steps_done=24, log_every=2, checkpoint_every=6).objects())
    fake.queued_resources.pop(qr_name(props))
    fake.nodes.clear()
    result = invoke("status", "--config-file", stack)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""  # no error line for the queued resource that was not found
    assert result.stdout.splitlines()[0] == "stack emu: queued resource multislice-emu is DELETED"
    assert "gone after its run completed at step 24" in result.stdout and "COMPLETE at" in result.stdout
    data = json.loads(invoke("status", "--config-file", stack, "--json").stdout)
    assert (data["queued_resource"]["state"], data["queued_resource"]["slices"]) == ("DELETED", [])
    assert data["run"]["complete"] is True


def test_a_queued_resource_gone_before_its_run_completed_is_an_error(fake, stack):
    props = deploy(fake, stack)
    upload(load_stack_file(stack).run_dir, in_progress().objects())
    fake.queued_resources.pop(qr_name(props))
    result = invoke("status", "--config-file", stack)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert "queued resource 'multislice-emu' not found" in result.stderr and "was deleted" in result.stderr


def test_missing_credentials(stack):
    # no MULTISLICE_TPU_API_ENDPOINT: Google's API, which needs credentials (none here)
    result = invoke("status", "--config-file", stack)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: no Google Cloud credentials found")


def test_a_run_directory_that_does_not_exist_yet_is_a_run_starting(fake, stack):
    # The queued resource is ACTIVE, its VMs have not written the run directory: they are booting.
    # That is no problem: a line saying so, exit 0 (an error exits non-zero only for a real one).
    deploy(fake, stack)
    result = invoke("status", "--config-file", stack)
    assert result.exit_code == 0, result.output
    run_dir = load_stack_file(stack).run_dir
    assert "stack emu: queued resource multislice-emu is ACTIVE" in result.stdout
    # Under the headline, the capacity mode and what it costs, as plan says it.
    assert "\ncapacity: spot (Spot VMs: Cloud TPU can preempt them at any time;" in result.stdout
    assert f"the run is starting: its VMs have not written {run_dir} yet" in result.stdout
    assert result.stderr == ""


def test_plot_writes_a_png(fake, stack, tmp_path):
    deploy(fake, stack)
    upload(load_stack_file(stack).run_dir, in_progress().objects())
    path = tmp_path / "plots" / "run.png"
    result = invoke("status", "--config-file", stack, "--json", "--plot", str(path))
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # --json stays parseable: "wrote ..." goes to stderr
    assert f"wrote {path}" in result.stderr
    assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 10_000


def test_watch_refreshes_until_complete(fake, stack, monkeypatch):
    deploy(fake, stack)
    run_dir = load_stack_file(stack).run_dir
    upload(run_dir, in_progress().objects())
    sleeps = []

    def sleep(seconds):  # between two reads: the run finishes
        sleeps.append(seconds)
        done = SyntheticRun(total_steps=24, steps_done=24, log_every=2, checkpoint_every=6)
        upload(run_dir, done.objects())

    monkeypatch.setattr(status_cli.time, "sleep", sleep)
    result = invoke("status", "--config-file", stack, "--watch", "--interval", "3")
    assert result.exit_code == 0, result.output
    assert sleeps == [3.0]  # two readings, then it stopped: the run is complete
    assert "24/24" in result.stdout and "COMPLETE at" in result.stdout  # (without a terminal: the last view only)


def test_watch_as_json_prints_one_line_per_reading(fake, stack, monkeypatch):
    deploy(fake, stack)
    run_dir = load_stack_file(stack).run_dir
    upload(run_dir, in_progress().objects())
    monkeypatch.setattr(
        status_cli.time,
        "sleep",
        lambda _s: upload(
            run_dir, SyntheticRun(total_steps=24, steps_done=24, log_every=2, checkpoint_every=6).objects()
        ),
    )
    result = invoke("status", "--config-file", stack, "--watch", "--json")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(d["run"]["step"], d["run"]["complete"]) for d in lines] == [(18, False), (24, True)]

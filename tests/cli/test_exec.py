"""``multislice exec`` against a stand-in ``gcloud`` on PATH (tests/fakes/gcloud_cli.py): the
describe, then one ``gcloud alpha compute tpus tpu-vm ssh`` per worker, all at once (the first
worker of each node a moment before the node's others), with the argument lists Cloud TPU needs;
output prefixed per worker, logs kept, failures named with their exit statuses; the SSH key made
once and put on each node once on a first use; a command not run again when gcloud retries a
dropped connection; bad input refused with one line and nothing run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra.cli import app
from infra.remote.gcloud import GCLOUD_ENV
from tests.fakes import gcloud_cli

ROOT = Path(__file__).resolve().parents[2]
ACTIVE = {"exit": 0, "stdout": {"name": "x", "state": {"state": "ACTIVE"}}}


def stack_file(tmp_path: Path, *, accelerator: str = "v4-16", iap_ssh: bool = True) -> Path:
    """The tests' emu stack as 2 slices of ``accelerator`` (v4-16: 2 workers each)."""
    data = yaml.safe_load((ROOT / "tests" / "stacks" / "Pulumi.emu.yaml").read_text())
    config = data["config"]
    config["multislice:acceleratorType"] = accelerator
    config["multislice:training"]["parallelism"]["ici"]["fsdp"] = 8 if accelerator == "v4-16" else 4
    config["multislice:training"]["global_batch_size"] = 16
    if iap_ssh:
        config["multislice:network"] = {"iapSsh": True}
    path = tmp_path / "Pulumi.emu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_exec(
    tmp_path: Path,
    plan: dict,
    *args: str,
    stack: Path | None = None,
    env: dict[str, str | None] | None = None,
    tools: tuple[str, ...] = ("ssh", "scp", "ssh-keygen"),
    logs: str = "logs",
):
    installed = gcloud_cli.install(tmp_path / "gcloud", plan, tools)
    stack = stack or stack_file(tmp_path)
    return CliRunner().invoke(
        app,
        ["exec", "--config-file", str(stack), "--log-dir", str(tmp_path / logs), *args],
        env={**installed, "COLUMNS": "250", GCLOUD_ENV: None, **(env or {})},
        color=False,
    )


def ssh_calls(tmp_path: Path) -> list[dict]:
    return [c for c in gcloud_cli.calls(tmp_path / "gcloud") if c["argv"][0] == "alpha"]


#: The guard line :func:`infra.remote.command.run_once` puts before the command.
GUARD = re.compile(
    r"^--command=if \[ -e multislice-exec/\.started/(\d{8}T\d{6}Z-[0-9a-f]{8})-slice-(\d)-worker-(\d) \]; then "
    r"echo '.+' >&2; exit 75; fi; .+$"
)


def remote_line(argv: list[str]) -> str:
    """The command line an ssh argument list runs, after the guard (which must be there, naming
    the worker of the argument list)."""
    guard, line = argv[-1].split("\n", 1)
    match = GUARD.match(guard)
    assert match, guard
    assert f"--worker={match.group(3)}" in argv and argv[5].endswith(f"-{match.group(2)}")
    return line


def run_of(argv: list[str]) -> str:
    """The run id of an ssh argument list's guard."""
    match = GUARD.match(argv[-1].split("\n", 1)[0])
    assert match
    return match.group(1)


def key_pair(tmp_path: Path) -> tuple[Path, Path]:
    key = tmp_path / "gcloud" / "home" / ".ssh" / "google_compute_engine"
    return key, key.with_name(key.name + ".pub")


def node_of(call: dict) -> str:
    return call["argv"][5]


def worker_of(call: dict) -> int:
    return int(next(a for a in call["argv"] if a.startswith("--worker=")).split("=")[1])


def test_every_worker_gets_its_ssh_at_once_with_the_arguments_cloud_tpu_needs(tmp_path):
    result = run_exec(tmp_path, {"describe": ACTIVE}, "--", "python3", "shardings.py", "--dcn_data_parallelism", "2")
    assert result.exit_code == 0, result.output
    calls = gcloud_cli.calls(tmp_path / "gcloud")
    assert calls[0]["argv"] == [
        "compute",
        "tpus",
        "queued-resources",
        "describe",
        "multislice-emu",
        "--zone=us-central2-b",
        "--project=multislice-tests",
        "--format=json",
    ]
    ssh = sorted((c["argv"] for c in calls[1:]), key=lambda argv: (argv[5], argv[8]))
    assert [argv[:-1] for argv in ssh] == [
        [
            "alpha",
            "compute",
            "tpus",
            "tpu-vm",
            "ssh",
            node,
            "--zone=us-central2-b",
            "--project=multislice-tests",
            f"--worker={worker}",
            "--tunnel-through-iap",
            "--quiet",
        ]
        for node in ("multislice-emu-0", "multislice-emu-1")
        for worker in (0, 1)
    ]
    assert [remote_line(argv) for argv in ssh] == ["python3 shardings.py --dcn_data_parallelism 2"] * 4
    assert len({run_of(argv) for argv in ssh}) == 1  # one exec: one run id, a marker per worker
    lines = result.stdout.splitlines()
    for s in range(2):
        for w in range(2):
            assert f"[slice {s} worker {w}] hello from multislice-emu-{s} worker {w}" in lines
            log = tmp_path / "logs" / f"slice-{s}-worker-{w}.log"
            assert log.read_text() == (
                f"SSH: Attempting to connect to worker {w}...\nhello from multislice-emu-{s} worker {w}\n"
            )
    assert "all 4 worker(s) exited 0" in result.stderr and str(tmp_path / "logs") in result.stderr


def test_a_failing_and_a_slow_worker_interleaved_are_named_with_their_statuses(tmp_path):
    # Worker 0 of each slice prints in turn, each line once the other's previous line was shown (the
    # fan-out logs a line after showing it); the slow worker prints once all 4 have connected.
    logs = str(tmp_path / "logs")

    def after(worker: str, line: str, text: str) -> dict:
        return {"text": text, "after": [f"slice-{worker}-worker-0.log", line]}

    plan = {
        "describe": ACTIVE,
        "ssh": {
            "multislice-emu-0/0": {"lines": ["a1", after("1", "b1", "a2"), after("1", "b2", "a3")], "log_dir": logs},
            "multislice-emu-1/0": {
                "lines": [after("0", "a1", "b1"), after("0", "a2", "b2"), after("0", "a3", "b3")],
                "log_dir": logs,
                "exit": 3,
            },
            "multislice-emu-0/1": {"lines": ["slow"], "after_connections": 4},
            "multislice-emu-1/1": {"lines": ["Connection closed by remote host"], "exit": 255},
        },
    }
    result = run_exec(tmp_path, plan, "--", "train")
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    mine = [line for line in lines if "worker 0] a" in line or "worker 0] b" in line]
    assert mine == [
        "[slice 0 worker 0] a1",
        "[slice 1 worker 0] b1",
        "[slice 0 worker 0] a2",
        "[slice 1 worker 0] b2",
        "[slice 0 worker 0] a3",
        "[slice 1 worker 0] b3",
    ]
    assert lines.count("[slice 0 worker 1] slow") == 1
    error = " ".join(result.stderr.split())
    assert "error: 2 of 4 worker(s) failed: slice 1 worker 0 (exit 3), slice 1 worker 1 (exit 255)" in error
    # All at once: every ssh started before the slow one ended (it waited for all four to connect,
    # which one at a time could not give); gcloud tried the one whose ssh exits 255 ten times.
    calls = ssh_calls(tmp_path)
    slow_end = next(c["end"] for c in calls if "multislice-emu-0" in c["argv"] and "--worker=1" in c["argv"])
    assert len(calls) == 4 and all(c["start"] < slow_end for c in calls)
    assert next(c["attempts"] for c in calls if node_of(c) == "multislice-emu-1" and worker_of(c) == 1) == 10


def test_background_wraps_the_command_with_nohup_and_a_log_on_the_worker(tmp_path):
    result = run_exec(tmp_path, {"describe": ACTIVE}, "--slice", "1", "--worker", "0", "--background", "--", "train")
    assert result.exit_code == 0, result.output
    (call,) = ssh_calls(tmp_path)
    assert call["argv"][5] == "multislice-emu-1" and "--worker=0" in call["argv"]
    command = remote_line(call["argv"])
    assert command.startswith("mkdir -p multislice-exec && { nohup bash -c train > multislice-exec/")
    assert "2>&1 < /dev/null &" in command


def test_a_stack_that_is_not_deployed_is_named_with_what_to_run_first(tmp_path):
    plan = {
        "describe": {
            "exit": 1,
            "stderr": "ERROR: (gcloud.compute.tpus.queued-resources.describe) NOT_FOUND: Resource "
            "'projects/multislice-tests/locations/us-central2-b/queuedResources/multislice-emu' was not found",
        }
    }
    result = run_exec(tmp_path, plan, "--", "hostname")
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr.split())
    assert error.startswith("error: stack emu is not deployed: queued resource multislice-emu not found in")
    assert "run `pulumi up --stack emu` first" in error and len(result.stderr.strip().splitlines()) == 1
    assert ssh_calls(tmp_path) == [] and not (tmp_path / "logs").exists()


def test_a_queued_resource_that_is_not_active_is_refused(tmp_path):
    name = "projects/multislice-tests/locations/us-central2-b/queuedResources/multislice-emu"
    plan = {"describe": {"exit": 0, "stdout": {"name": name, "state": {"state": "SUSPENDED"}}}}
    result = run_exec(tmp_path, plan, "--", "hostname")
    assert result.exit_code == 2 and "is SUSPENDED, not ACTIVE" in result.stderr
    assert ssh_calls(tmp_path) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slice", "2", "--", "hostname"], "--slice 2: stack emu has 2 slice(s), 0-1"),
        (["--worker", "2", "--", "hostname"], "--worker 2: each slice of stack emu (v4-16) has 2 worker(s), 0-1"),
        (["--", " "], "no command: write it after --"),
    ],
)
def test_a_slice_or_worker_the_stack_lacks_or_no_command_is_refused_before_gcloud_runs(tmp_path, args, message):
    result = run_exec(tmp_path, {"describe": ACTIVE}, *args)
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.stderr.split())
    assert gcloud_cli.calls(tmp_path / "gcloud") == []


def test_a_stack_without_iap_ssh_is_refused(tmp_path):
    result = run_exec(tmp_path, {"describe": ACTIVE}, "--", "hostname", stack=stack_file(tmp_path, iap_ssh=False))
    assert result.exit_code == 2
    assert "admits no SSH: set multislice:network.iapSsh: true" in " ".join(result.stderr.split())
    assert gcloud_cli.calls(tmp_path / "gcloud") == []


def test_the_plan_of_the_stand_in_is_json(tmp_path):
    # The stand-in itself: an unknown command is refused as gcloud refuses it.
    env = gcloud_cli.install(tmp_path, {})
    import subprocess

    out = subprocess.run(["gcloud", "compute", "ssh"], env={**env}, capture_output=True, text=True)
    assert out.returncode == 2 and "Invalid choice" in out.stderr
    assert json.loads((tmp_path / "gcloud-plan.json").read_text()) == {}


def test_a_first_exec_makes_the_key_once_and_one_worker_per_node_puts_it_on_the_node(tmp_path):
    # A fresh workstation: no ~/.ssh. The stand-in ssh-keygen takes 1 s between the private and
    # the public key, and each UpdateNode 1 s: were the four gclouds started at once, they would
    # race to make the pair (an "Overwrite (y/n)?" nobody answers, or a half pair called broken)
    # and push the key twice per node.
    plan = {"describe": ACTIVE, "keygen_s": 1.0, "update_node_s": 1.0}
    key, public = key_pair(tmp_path)
    result = run_exec(tmp_path, plan, "--", "hostname")
    assert result.exit_code == 0, result.output
    # The key was made once, before any ssh, as gcloud --quiet makes it.
    assert gcloud_cli.keygen_calls(tmp_path / "gcloud") == [f"-N  -t rsa -f {key}"]
    assert public.read_text().startswith("ssh-rsa AAAAstandin")
    assert (key.parent.stat().st_mode & 0o777) == 0o700
    assert "made gcloud's SSH key" in " ".join(result.stderr.split())
    calls = ssh_calls(tmp_path)
    assert len(calls) == 4 and not any("keygen" in c for c in calls)
    for node in ("multislice-emu-0", "multislice-emu-1"):
        first, second = sorted((c for c in calls if node_of(c) == node), key=worker_of)
        # One UpdateNode per node, by its worker 0; worker 1 started once that had ended.
        assert "update_node" in first and "update_node" not in second
        assert second["start"] >= first["update_node"][1]
    # Worker 0 of both nodes at once: neither waited for the other's UpdateNode.
    leaders = [c for c in calls if worker_of(c) == 0]
    assert all(c["start"] < min(other["update_node"][1] for other in leaders) for c in leaders)

    # The next exec finds the key, and the key on both nodes: no ssh-keygen, no UpdateNode.
    again = run_exec(tmp_path, plan, "--", "hostname", logs="logs-2")
    assert again.exit_code == 0, again.output
    assert len(gcloud_cli.keygen_calls(tmp_path / "gcloud")) == 1
    assert "made gcloud's SSH key" not in again.stderr
    assert len(ssh_calls(tmp_path)) == 8 and not any("update_node" in c for c in ssh_calls(tmp_path)[4:])


def test_half_a_key_pair_is_refused_before_any_ssh(tmp_path):
    key, public = key_pair(tmp_path)
    key.parent.mkdir(parents=True)
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    result = run_exec(tmp_path, {"describe": ACTIVE}, "--", "hostname")
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr.split())
    assert f"error: gcloud's SSH key files are broken ({key} exists, {public} is missing)" in error
    assert ssh_calls(tmp_path) == [] and gcloud_cli.keygen_calls(tmp_path / "gcloud") == []
    assert len(result.stderr.strip().splitlines()) == 1 and not public.exists()


def test_a_dropped_connection_does_not_run_the_command_again(tmp_path):
    # slice 0 worker 1's connection drops after its command ran; gcloud retries the whole ssh
    # (the stand-in as gcloud 528's AttemptRunWithRetries does). The guard refuses the retry.
    run = {"run": True}
    plan = {"describe": ACTIVE, "ssh": {"multislice-emu-0/1": {"run": True, "drops": 1}}}
    plan["ssh"] |= {f"multislice-emu-{s}/{w}": run for s, w in ((0, 0), (1, 0), (1, 1))}
    result = run_exec(tmp_path, plan, "--", "echo ran >> ran.txt; echo done")
    assert result.exit_code == 1, result.output
    vms = tmp_path / "gcloud" / "vms"
    for s in range(2):
        for w in range(2):
            assert (vms / f"multislice-emu-{s}-{w}" / "ran.txt").read_text() == "ran\n"  # once each
    error = " ".join(result.stderr.split())
    assert (
        "error: 1 of 4 worker(s) failed: slice 0 worker 1 (exit 75: ssh failed after the command started (a dropped "
        "connection, or the command's own 255); not run again)" in error
    )
    lines = result.stdout.splitlines()
    assert "[slice 0 worker 1] multislice exec: this command already started on this worker" in " ".join(lines)
    assert (
        next(c["attempts"] for c in ssh_calls(tmp_path) if node_of(c) == "multislice-emu-0" and worker_of(c) == 1) == 2
    )


def test_a_retry_before_the_command_started_runs_it_once(tmp_path):
    # The retries gcloud makes for: the key not yet on the VM, so ssh cannot log in (255).
    plan = {"describe": ACTIVE, "ssh": {"multislice-emu-1/0": {"run": True, "unreachable": 2}}}
    result = run_exec(tmp_path, plan, "--slice", "1", "--worker", "0", "--", "echo ran >> ran.txt")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "gcloud" / "vms" / "multislice-emu-1-0" / "ran.txt").read_text() == "ran\n"
    assert ssh_calls(tmp_path)[0]["attempts"] == 3


def test_without_gcloud_nothing_runs(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_exec(tmp_path, {"describe": ACTIVE}, "--", "hostname", env={"PATH": str(empty)})
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr.split())
    assert error.startswith("error: 'gcloud' was not found on PATH: install the Google Cloud CLI")
    assert gcloud_cli.calls(tmp_path / "gcloud") == [] and not (tmp_path / "logs").exists()


def test_without_ssh_keygen_nothing_runs(tmp_path):
    # PATH: the stand-ins' directory alone, without ssh-keygen.
    bin_dir = tmp_path / "gcloud" / "bin"
    result = run_exec(
        tmp_path, {"describe": ACTIVE}, "--", "hostname", env={"PATH": str(bin_dir)}, tools=("ssh", "scp")
    )
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr.split())
    assert error.startswith(
        "error: ssh-keygen not found on PATH: gcloud's TPU ssh needs OpenSSH's ssh, scp and ssh-keygen"
    )
    assert len(result.stderr.strip().splitlines()) == 1
    assert gcloud_cli.calls(tmp_path / "gcloud") == [] and not (tmp_path / "gcloud" / "home" / ".ssh").exists()


@pytest.mark.parametrize(
    ("stderr", "reason"),
    [
        (
            # gcloud 528's NoActiveAccountException (core/credentials/exceptions.py), as printed.
            "ERROR: (gcloud.compute.tpus.queued-resources.describe) You do not currently have an active account "
            "selected.\nPlease run:\n\n  $ gcloud auth login\n\nto obtain new credentials.\n\nIf you have already "
            "logged in with a different account, run:\n\n  $ gcloud config set account ACCOUNT\n\nto select an "
            "already authenticated account to use.",
            "You do not currently have an active account selected",
        ),
        (
            "ERROR: (gcloud.compute.tpus.queued-resources.describe) There was a problem refreshing your current auth "
            "tokens: ('invalid_grant: Bad Request', {'error': 'invalid_grant'})\nPlease run:\n\n  $ gcloud auth login",
            "There was a problem refreshing your current auth tokens",
        ),
    ],
)
def test_without_credentials_the_error_says_gcloud_auth_login(tmp_path, stderr, reason):
    result = run_exec(tmp_path, {"describe": {"exit": 1, "stderr": stderr}}, "--", "hostname")
    assert result.exit_code == 2, result.output
    error = " ".join(result.stderr.split())
    assert error.startswith(f"error: gcloud has no usable credentials ({reason}")
    assert "run `gcloud auth login`" in error and "nothing was run" in error
    assert len(result.stderr.strip().splitlines()) == 1
    assert ssh_calls(tmp_path) == [] and gcloud_cli.keygen_calls(tmp_path / "gcloud") == []

"""``multislice exec`` and ``multislice reset`` on a ``multislice:backend: compute-engine`` stack,
against the stand-in ``gcloud`` (tests/fakes/gcloud_cli.py): each slice's instance group listed,
then one ``gcloud compute ssh <instance>`` per worker with the argument list gcloud 528's GA
``compute ssh`` takes (worker W = the W-th name of its group, sorted), the first worker before
the others, the command behind the run-once guard; a stack whose groups are missing or not up
refused before any ssh; ``reset`` refused with one line; no Cloud TPU call at all."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.remote.gcloud import GCLOUD_ENV
from tests.fakes import gcloud_cli
from tests.helpers.compute_engine_stack import GROUPS, NAMES, listed, stack_file


def plan(**extra) -> dict:
    return {"groups": {group: listed(group) for group in GROUPS}, **extra}


def run(tmp_path: Path, the_plan: dict, *args: str, command: str = "exec"):
    installed = gcloud_cli.install(tmp_path / "gcloud", the_plan)
    log_dir = ["--log-dir", str(tmp_path / "logs")] if command == "exec" and "--log-dir" not in args else []
    return CliRunner().invoke(
        app,
        [command, "--config-file", str(stack_file(tmp_path)), *log_dir, *args],
        env={**installed, "COLUMNS": "250", GCLOUD_ENV: None},
        color=False,
    )


def ssh_calls(tmp_path: Path) -> list[dict]:
    return [c for c in gcloud_cli.calls(tmp_path / "gcloud") if c["argv"][:2] == ["compute", "ssh"]]


GUARD = re.compile(
    r"^--command=if \[ -e multislice-exec/\.started/\d{8}T\d{6}Z-[0-9a-f]{8}-slice-(\d)-worker-(\d) \]; then "
    r"echo '.+' >&2; exit 75; fi; .+$"
)


def test_each_vm_of_each_group_gets_gcloud_compute_ssh_through_iap(tmp_path):
    result = run(tmp_path, plan(), "--log-dir", str(tmp_path / "logs"), "--", "hostname", "-f")
    assert result.exit_code == 0, result.output
    calls = gcloud_cli.calls(tmp_path / "gcloud")
    lists = [c["argv"] for c in calls if c["argv"][:2] != ["compute", "ssh"]]
    assert sorted(lists) == [
        [
            "compute",
            "instance-groups",
            "managed",
            "list-instances",
            group,
            "--zone=us-east5-a",
            "--project=multislice-tests",
            "--format=json",
        ]
        for group in GROUPS
    ]
    assert not any("tpus" in c["argv"] for c in calls)
    by_instance = {c["argv"][2]: c["argv"] for c in ssh_calls(tmp_path)}
    # worker W = the W-th name of the group sorted (the VM's own TPU_WORKER_ID, infra/startup).
    expected = {
        "multislice-ceops-0-b2kx": (0, 0),
        "multislice-ceops-0-zq7w": (0, 1),
        "multislice-ceops-1-c9aa": (1, 0),
        "multislice-ceops-1-m4dd": (1, 1),
    }
    assert set(by_instance) == set(expected)
    for instance, argv in by_instance.items():
        assert argv[:-1] == [
            "compute",
            "ssh",
            instance,
            "--zone=us-east5-a",
            "--project=multislice-tests",
            "--tunnel-through-iap",
            "--quiet",
        ]
        guard, *rest = argv[-1].split("\n")
        match = GUARD.match(guard)
        assert match and (int(match[1]), int(match[2])) == expected[instance], guard
        assert rest[-1] == "hostname -f"
    for instance, (s, w) in expected.items():
        assert f"[slice {s} worker {w}] hello from {instance}" in result.stdout
    assert (tmp_path / "logs" / "slice-1-worker-0.log").read_text() == "hello from multislice-ceops-1-c9aa\n"


def test_the_first_worker_connects_and_puts_the_key_in_the_project_before_the_others_start(tmp_path):
    result = run(
        tmp_path,
        plan(update_project_s=0.6, ssh={name: {"run": True} for names in NAMES.values() for name in names}),
        "--log-dir",
        str(tmp_path / "logs"),
        "--",
        "echo ran $((1+1))",
    )
    assert result.exit_code == 0, result.output
    calls = ssh_calls(tmp_path)
    leader = next(c for c in calls if c["argv"][2] == "multislice-ceops-0-b2kx")
    others = [c for c in calls if c is not leader]
    assert len(others) == 3
    # the key made once (by us, before any gcloud), added to the project's metadata once, by the leader.
    assert len(gcloud_cli.keygen_calls(tmp_path / "gcloud")) == 1
    assert [c.get("update_project") is not None for c in calls].count(True) == 1
    assert "update_project" in leader
    assert all(other["start"] >= leader["update_project"][1] for other in others)
    keys = (tmp_path / "gcloud" / "project.ssh-keys").read_text().splitlines()
    assert len(keys) == 1
    assert "[slice 0 worker 0] multislice exec: connected to multislice-ceops-0-b2kx" in result.stdout
    assert result.stdout.count("connected to") == 1
    assert result.stdout.count("] ran 2\n") == 4


def test_a_command_is_not_run_twice_on_a_vm(tmp_path):
    the_plan = plan(ssh={name: {"run": True} for names in NAMES.values() for name in names})
    installed = gcloud_cli.install(tmp_path / "gcloud", the_plan)
    # one run id for two sends of the same worker's line: the second is refused by the guard.
    from infra.backends.compute_engine import ssh as compute_ssh
    from infra.config import load_stack_file
    from infra.remote.fanout import run_all
    from infra.remote.selection import select_workers

    config = load_stack_file(stack_file(tmp_path))
    workers = select_workers(config, 0, 0)
    instances = {0: sorted(NAMES[GROUPS[0]])}
    import os

    old = dict(os.environ)
    os.environ.update(installed)
    try:
        gcloud = str(tmp_path / "gcloud" / "bin" / "gcloud")
        first = run_all(
            compute_ssh.targets(gcloud, config, workers, instances, "echo once", "r1"), tmp_path / "a", print
        )
        again = run_all(
            compute_ssh.targets(gcloud, config, workers, instances, "echo once", "r1"), tmp_path / "b", print
        )
    finally:
        os.environ.clear()
        os.environ.update(old)
    assert [o.code for o in first.outcomes] == [0]
    assert [o.code for o in again.outcomes] == [75]
    assert "already started on this worker" in (tmp_path / "b" / "slice-0-worker-0.log").read_text()


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({GROUPS[0]: listed(GROUPS[0])}, "stack ceops is not deployed: instance group multislice-ceops-1 (slice 1)"),
        (
            {GROUPS[0]: listed(GROUPS[0]), GROUPS[1]: listed(GROUPS[1], "STAGING", "CREATING")},
            "instance group multislice-ceops-1 (slice 1) has 0 of 2 VMs running",
        ),
        (
            {GROUPS[0]: listed(GROUPS[0]), GROUPS[1]: listed(GROUPS[1])[:1]},
            "instance group multislice-ceops-1 (slice 1) has 1 of 2 VMs running",
        ),
    ],
)
def test_a_slice_whose_group_is_missing_or_not_up_is_refused_before_any_ssh(tmp_path, groups, message):
    result = run(tmp_path, {"groups": groups}, "--", "true")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert ssh_calls(tmp_path) == []


def test_only_the_selected_slice_is_listed_and_reached(tmp_path):
    result = run(tmp_path, {"groups": {GROUPS[1]: listed(GROUPS[1])}}, "--slice", "1", "--worker", "1", "--", "true")
    assert result.exit_code == 0, result.output
    assert [c["argv"][2] for c in ssh_calls(tmp_path)] == ["multislice-ceops-1-m4dd"]
    assert "connected to" not in result.stdout  # a single worker waits for no one


def test_gcloud_without_credentials_is_named(tmp_path):
    the_plan = {
        "groups": {
            group: {
                "exit": 1,
                "stderr": "ERROR: (gcloud.compute.instance-groups.managed.list-instances) You do not currently "
                "have an active account selected.\nPlease run:\n\n  $ gcloud auth login",
            }
            for group in GROUPS
        }
    }
    result = run(tmp_path, the_plan, "--", "true")
    assert result.exit_code == 2
    assert "gcloud auth login" in result.output
    assert ssh_calls(tmp_path) == []


def test_reset_is_refused_with_what_to_do_instead(tmp_path):
    result = run(tmp_path, plan(), "--yes", command="reset")
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1
    assert lines[0].startswith("error: stack ceops uses multislice:backend: compute-engine, which has no reset")
    assert "sudo systemctl restart multislice-trainer.service" in lines[0]
    assert "reaches running VMs through their release watch" in lines[0]  # a restart does not switch releases
    assert gcloud_cli.calls(tmp_path / "gcloud") == []


def test_local_reset_is_refused_too(tmp_path):
    installed = gcloud_cli.install(tmp_path / "gcloud", plan())
    result = CliRunner().invoke(
        app,
        ["local", "reset", "--config-file", str(stack_file(tmp_path)), "--yes"],
        env={**installed, "COLUMNS": "250", "MULTISLICE_STATE_DIR": str(tmp_path / "state")},
        color=False,
    )
    assert result.exit_code == 2, result.output
    assert "compute-engine, which has no reset" in result.output
    assert f"multislice local down --config-file {stack_file(tmp_path)}` then" in " ".join(result.output.split())

"""``multislice logs`` (Cloud Logging, against a loopback fake of its REST API) and
``multislice local logs`` (the emulated VMs' console logs, written here in tmp dirs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.config import load_stack
from infra.logs import cloud
from infra.logs.filter import TRAINER_LOG, trainer_filter
from infra.logs.lines import SinceError, parse_since
from infra.logs.local import ConsoleTail
from tests.fakes.logging_api import FakeLoggingApi, compile_filter

ROOT = Path(__file__).resolve().parents[2]
DEV = load_stack("dev")  # 2 slices of v4-8: 1 worker each
STAGING = load_stack("staging")
T0 = datetime(2026, 11, 30, 17, 0, tzinfo=UTC)


def stamp(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250", **(env or {})}, color=False)


@pytest.fixture
def fake():
    server = FakeLoggingApi()
    yield server
    server.stop()


@pytest.fixture
def creds_env(tmp_path):
    """A service-account key file (never used against Google: the fake takes anything)."""
    key = {
        "type": "service_account",
        "client_email": "ci@p.iam.gserviceaccount.com",
        "private_key": "unused",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key))
    return path


def entry(config, slice_id: int, worker: int, text: str, at: datetime, run: str | None = None, log: str = TRAINER_LOG):
    return dict(
        logName=f"projects/{config.project}/logs/{log}",
        resource={
            "type": "tpu_worker",
            "labels": {
                "project_id": config.project,
                "zone": config.zone,
                "node_id": config.node_ids[slice_id],
                "worker_id": str(worker),
            },
        },
        labels={"slice": str(slice_id), "worker": str(worker), "run": run or config.effective_run_name},
        textPayload=text,
        timestamp=stamp(at),
    )


# --- --since ---------------------------------------------------------------------------------


def test_since_durations_and_rfc3339_times():
    assert parse_since("90s", T0) == T0 - timedelta(seconds=90)
    assert parse_since("10m", T0) == T0 - timedelta(minutes=10)
    assert parse_since("2h", T0) == T0 - timedelta(hours=2)
    assert parse_since("1d", T0) == T0 - timedelta(days=1)
    assert parse_since("2026-11-30T18:30:00+01:00") == datetime(2026, 11, 30, 17, 30, tzinfo=UTC)
    assert parse_since("2026-11-30T17:30:00Z") == datetime(2026, 11, 30, 17, 30, tzinfo=UTC)
    for bad in ("yesterday", "10", "10 minutes", "2026-11-30", "2026-11-30T17:30:00"):
        with pytest.raises(SinceError):
            parse_since(bad, T0)


# --- the filter --------------------------------------------------------------------------------


def test_trainer_filter_narrows_the_exported_one():
    base = (
        'resource.type="tpu_worker" AND resource.labels.project_id="acme-ml-dev" AND '
        'resource.labels.zone="us-central2-b" AND resource.labels.node_id=("multislice-dev-0" OR "multislice-dev-1")'
    )
    assert trainer_filter(DEV) == (
        base + ' AND logName="projects/acme-ml-dev/logs/multislice-trainer" AND labels.run="dev"'
    )
    narrowed = trainer_filter(DEV, slice_id=1, worker=0, since=T0)
    assert 'resource.labels.node_id=("multislice-dev-1")' in narrowed and "multislice-dev-0" not in narrowed
    assert narrowed.endswith(' AND resource.labels.worker_id="0" AND timestamp>="2026-11-30T17:00:00.000000Z"')


def test_the_program_exports_the_same_filter_code():
    import infra.__main__ as program
    from infra.logs import filter as log_filter

    assert program.logging_filter is log_filter.logging_filter
    assert trainer_filter(DEV).startswith(program.logging_filter(DEV) + " AND ")


# --- deployed: Cloud Logging -------------------------------------------------------------------


def test_logs_prints_each_workers_lines_oldest_first_with_the_filter_it_sends(fake, creds_env):
    fake.add(
        **entry(
            DEV, 1, 0, "2026-11-30T17:00:05+0000 INFO [p1] training: step 10/120 loss 3.6", T0 + timedelta(seconds=5)
        )
    )
    fake.add(**entry(DEV, 0, 0, "trainer: starting", T0))
    fake.add(**entry(DEV, 0, 0, "older run", T0, run="other-run"))
    fake.add(**entry(DEV, 0, 0, "libtpu line", T0, log="tpu-runtime"))
    env = {cloud.ENDPOINT_ENV: fake.url, "GOOGLE_APPLICATION_CREDENTIALS": str(creds_env)}
    result = invoke("logs", "--stack", "dev", env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "[slice 0 worker 0] trainer: starting",
        "[slice 1 worker 0] 2026-11-30T17:00:05+0000 INFO [p1] training: step 10/120 loss 3.6",
    ]
    (request,) = fake.lists
    assert request["filter"] == trainer_filter(DEV) and request["orderBy"] == "timestamp asc"
    assert request["resourceNames"] == ["projects/acme-ml-dev"]


def test_slice_worker_and_since_narrow_the_request(fake, creds_env):
    fake.add(**entry(DEV, 1, 0, "early", T0))
    fake.add(**entry(DEV, 1, 0, "late", T0 + timedelta(minutes=10)))
    fake.add(**entry(DEV, 0, 0, "other slice", T0 + timedelta(minutes=10)))
    env = {cloud.ENDPOINT_ENV: fake.url, "GOOGLE_APPLICATION_CREDENTIALS": str(creds_env)}
    result = invoke(
        "logs", "--stack", "dev", "--slice", "1", "--worker", "0", "--since", "2026-11-30T17:05:00Z", env=env
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[slice 1 worker 0] late"]
    sent = fake.lists[0]["filter"]
    assert sent == trainer_filter(DEV, slice_id=1, worker=0, since=datetime(2026, 11, 30, 17, 5, tzinfo=UTC))
    assert 'resource.labels.worker_id="0"' in sent and 'timestamp>="2026-11-30T17:05:00.000000Z"' in sent


def test_follow_polls_with_a_timestamp_cursor_and_prints_each_line_once(fake):
    fake.add(**entry(DEV, 0, 0, "first", T0))
    client = cloud.client_for(DEV.project, None, fake.url)
    tail = cloud.CloudTail(client, DEV)
    assert [line.text for line in tail.poll()] == ["first"]
    assert "timestamp" not in fake.lists[0]["filter"]
    fake.add(**entry(DEV, 1, 0, "second", T0 + timedelta(seconds=30)))
    fake.add(**entry(DEV, 0, 0, "late arrival, written before the newest seen", T0 - timedelta(seconds=5)))
    assert [line.text for line in tail.poll()] == ["late arrival, written before the newest seen", "second"]
    assert f'timestamp>="{stamp(T0 - cloud.LOOKBACK)}"' in fake.lists[1]["filter"]
    assert tail.poll() == []  # nothing new: nothing printed twice
    assert f'timestamp>="{stamp(T0 + timedelta(seconds=30) - cloud.LOOKBACK)}"' in fake.lists[2]["filter"]


def test_follow_through_the_command_stops_after_the_test_hooks_polls(fake, monkeypatch):
    monkeypatch.setattr(cloud, "POLL_SECONDS", 0.01)
    fake.add(**entry(DEV, 0, 0, "only line", T0))
    result = invoke("logs", "--stack", "dev", "--follow", "--polls", "3", env={cloud.ENDPOINT_ENV: fake.url})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["[slice 0 worker 0] only line"]
    assert len(fake.lists) == 3


def test_a_stack_never_deployed_is_one_line_and_exit_1(fake):
    result = invoke("logs", "--stack", "dev", env={cloud.ENDPOINT_ENV: fake.url})
    assert result.exit_code == 1
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: stack dev has no log entries in project acme-ml-dev") and "never deployed" in line
    assert (
        fake.lists[-1]["filter"].startswith('resource.type="tpu_worker"') and "logName" not in fake.lists[-1]["filter"]
    )


def test_a_deployed_stack_without_matching_lines_says_so_and_exits_0(fake):
    fake.add(**entry(DEV, 0, 0, "libtpu line", T0, log="tpu-runtime"))
    result = invoke("logs", "--stack", "dev", "--since", "1m", env={cloud.ENDPOINT_ENV: fake.url})
    assert result.exit_code == 0 and result.stdout == ""
    assert "no trainer lines of run dev match since 1m" in result.stderr


def test_a_refused_call_is_one_line(fake):
    fake.fail_next(403, "PERMISSION_DENIED", "Permission 'logging.logEntries.list' denied on project acme-ml-dev")
    result = invoke("logs", "--stack", "dev", env={cloud.ENDPOINT_ENV: fake.url})
    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert (
        line.startswith("error: Cloud Logging refused to list entries in project acme-ml-dev")
        and "roles/logging.viewer" in line
    )


def test_missing_credentials_are_one_line_before_any_call(tmp_path, fake):
    env = {
        name: ""
        for name in (
            "GOOGLE_APPLICATION_CREDENTIALS",
            "GOOGLE_CREDENTIALS",
            "GOOGLE_CLOUD_KEYFILE_JSON",
            "GCLOUD_KEYFILE_JSON",
            "GOOGLE_OAUTH_ACCESS_TOKEN",
            "GCE_METADATA_HOST",
            "GCE_METADATA_IP",
        )
    }
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    result = invoke("logs", "--stack", "dev", env=env)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert (
        line.startswith("error: no Google Cloud credentials found") and "gcloud auth application-default login" in line
    )
    assert fake.lists == []


@pytest.mark.parametrize("command", [("logs",), ("local", "logs")])
def test_slice_or_worker_out_of_range_is_one_line(command):
    result = invoke(*command, "--stack", "dev", "--slice", "2")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == ["error: --slice 2: stack dev has 2 slice(s), 0-1 (multislice:slices)"]
    hosts = STAGING.workers_per_slice
    result = invoke(*command, "--stack", "staging", "--worker", str(hosts))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: --worker {hosts}: each slice of stack staging ({STAGING.accelerator_type}) has {hosts} worker(s), "
        f"0-{hosts - 1} (multislice:acceleratorType)"
    ]


@pytest.mark.parametrize("command", [("logs",), ("local", "logs")])
def test_a_bad_since_is_one_line(command):
    result = invoke(*command, "--stack", "dev", "--since", "yesterday")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        "error: --since 'yesterday' is neither a duration (30s, 10m, 2h, 1d) "
        "nor an RFC 3339 time (2026-11-30T17:00:00Z)"
    ]


# --- local: the emulated VMs' console logs ------------------------------------------------------


def write_console(logs_dir: Path, slice_id: int, worker: int, text: str) -> Path:
    logs_dir.mkdir(parents=True, exist_ok=True)
    path = logs_dir / f"slice-{slice_id}-worker-{worker}.log"
    with open(path, "a") as handle:
        handle.write(text)
    return path


def boot(slice_id: int, at: datetime, n: int = 1) -> str:
    return f"===== boot {n} of slice {slice_id} worker 0 at {at:%Y-%m-%dT%H:%M:%SZ} =====\n"


def test_local_logs_merges_the_vms_console_logs_by_time(tmp_path):
    logs = tmp_path / "dev" / "logs"
    write_console(
        logs,
        0,
        0,
        boot(0, T0) + "[slice 0 worker 0] boot: stack dev\n"
        "[slice 0 worker 0] 2026-11-30T17:00:20+0000 INFO [p0] training: step 10/120\n"
        "[slice 0 worker 0] [Gloo] Rank 0 is connected\n",
    )
    write_console(
        logs,
        1,
        0,
        boot(1, T0 + timedelta(seconds=10)) + "systemd[1]: Started multislice-trainer.service.\n"
        "[slice 1 worker 0] 2026-11-30T18:00:30+0100 INFO [p1] training: step 10/120\n",
    )
    (logs / "fake-gcs-server.log").write_text("not a VM\n")
    # --libraries: a line without a time of its own (gloo's) keeps the time of the line before it
    result = invoke("local", "logs", "--stack", "dev", "--libraries", env={"MULTISLICE_STATE_DIR": str(tmp_path)})
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "[slice 0 worker 0] " + boot(0, T0).strip(),
        "[slice 0 worker 0] boot: stack dev",
        "[slice 1 worker 0] " + boot(1, T0 + timedelta(seconds=10)).strip(),
        "[slice 1 worker 0] systemd[1]: Started multislice-trainer.service.",
        "[slice 0 worker 0] 2026-11-30T17:00:20+0000 INFO [p0] training: step 10/120",
        "[slice 0 worker 0] [Gloo] Rank 0 is connected",
        "[slice 1 worker 0] 2026-11-30T18:00:30+0100 INFO [p1] training: step 10/120",
    ]
    only = invoke(
        "local",
        "logs",
        "--stack",
        "dev",
        "--slice",
        "1",
        "--since",
        "2026-11-30T17:00:25Z",
        env={"MULTISLICE_STATE_DIR": str(tmp_path)},
    )
    assert only.stdout.splitlines() == ["[slice 1 worker 0] 2026-11-30T18:00:30+0100 INFO [p1] training: step 10/120"]


def test_local_logs_reads_where_the_emulator_writes(tmp_path):
    from infra.emulated.state import LocalPaths

    write_console(LocalPaths(tmp_path / "dev").logs_dir, 0, 0, boot(0, T0) + "[slice 0 worker 0] hello\n")
    result = invoke("local", "logs", "--stack", "dev", env={"MULTISLICE_STATE_DIR": str(tmp_path)})
    assert result.stdout.splitlines()[-1] == "[slice 0 worker 0] hello"


def test_local_follow_prints_appended_lines_once_and_rereads_a_recreated_log(tmp_path):
    logs = tmp_path / "logs"
    path = write_console(logs, 0, 0, boot(0, T0) + "[slice 0 worker 0] one\n[slice 0 worker 0] par")
    tail = ConsoleTail(logs)
    assert [line.text for line in tail.poll()][1:] == ["one"]  # a partial line waits for its end
    write_console(logs, 0, 0, "tial\n")
    write_console(logs, 1, 0, boot(1, T0) + "[slice 1 worker 0] a new VM\n")
    assert [line.render() for line in tail.poll()] == [
        "[slice 0 worker 0] partial",
        "[slice 1 worker 0] " + boot(1, T0).strip(),
        "[slice 1 worker 0] a new VM",
    ]
    assert tail.poll() == []
    path.unlink()  # local up --fresh
    write_console(logs, 0, 0, boot(0, T0, 1) + "[slice 0 worker 0] fresh\n")
    assert [line.text for line in tail.poll()][1:] == ["fresh"]


def test_local_follow_through_the_command_stops_after_the_test_hooks_polls(tmp_path):
    write_console(tmp_path / "dev" / "logs", 0, 0, boot(0, T0) + "[slice 0 worker 0] line\n")
    result = invoke(
        "local", "logs", "--stack", "dev", "--follow", "--polls", "2", env={"MULTISLICE_STATE_DIR": str(tmp_path)}
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == "[slice 0 worker 0] line"


def test_a_fifo_in_place_of_a_console_log_is_one_line_not_a_wait(tmp_path):
    logs = tmp_path / "dev" / "logs"
    logs.mkdir(parents=True)
    os.mkfifo(logs / "slice-0-worker-0.log")  # opening it for reading would wait for a writer
    result = invoke("local", "logs", "--stack", "dev", env={"MULTISLICE_STATE_DIR": str(tmp_path)})
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: cannot read the console log {logs / 'slice-0-worker-0.log'}: a FIFO, not a regular file"
    ]


def test_a_console_log_longer_than_a_poll_reads_is_shown_from_its_newest_lines(tmp_path, monkeypatch):
    from infra.logs import local

    monkeypatch.setattr(local, "MAX_POLL_BYTES", 100)
    logs = tmp_path / "logs"
    old = "".join(f"[slice 0 worker 0] old line {n}\n" for n in range(50))  # 1,450 bytes
    write_console(logs, 0, 0, boot(0, T0) + old + "[slice 0 worker 0] newest line\n")
    tail = ConsoleTail(logs)
    lines = [line.text for line in tail.poll()]
    assert lines[0].startswith("(") and lines[0].endswith(
        "earlier bytes of slice-0-worker-0.log not shown: over 100 unread at once)"
    )
    assert lines[-1] == "newest line" and 2 <= len(lines) <= 5  # 100 bytes: the last few lines, whole
    write_console(logs, 0, 0, "[slice 0 worker 0] appended\n")
    assert [line.text for line in tail.poll()] == ["appended"]  # what is appended next, as before


def test_a_stack_never_run_locally_is_one_line(tmp_path):
    result = invoke("local", "logs", "--stack", "dev", env={"MULTISLICE_STATE_DIR": str(tmp_path)})
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        f"error: stack dev was never run locally: no console logs in {tmp_path / 'dev' / 'logs'} "
        "(start it with: multislice local up --stack dev)"
    ]


# --- the fake's filter language is the one sent ---------------------------------------------------


def test_the_fakes_filter_rejects_what_it_does_not_understand():
    matches = compile_filter(trainer_filter(DEV, slice_id=0, since=T0))
    assert matches(entry(DEV, 0, 0, "x", T0)) and not matches(entry(DEV, 1, 0, "x", T0))
    assert not matches(entry(DEV, 0, 0, "x", T0 - timedelta(seconds=1)))
    with pytest.raises(ValueError):
        compile_filter('textPayload:"step"')


# --- imports -----------------------------------------------------------------------------------


def test_the_commands_import_nothing_heavy():
    """Registering and parsing `logs` imports no jax, orbax or Google client library; the
    Cloud Logging client is imported inside the command."""
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from infra.cli import app\n"
        "r = CliRunner().invoke(app, ['local', 'logs', '--stack', 'dev', '--slice', '9'])\n"
        "assert r.exit_code == 2, r.output\n"
        "heavy = [m for m in ('jax', 'orbax', 'google.cloud.logging_v2', 'google.cloud.tpu_v2', 'grpc', 'etils')"
        " if m in sys.modules]\n"
        "print(heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_local_logs_leaves_out_library_notices_unless_asked(tmp_path):
    logs = tmp_path / "dev" / "logs"
    trainer = "[slice 0 worker 0] 2026-11-30T17:00:20+0000 INFO [p0] training: step 10/120"
    write_console(
        logs,
        0,
        0,
        boot(0, T0) + "[slice 0 worker 0] boot: stack dev\n"
        "[slice 0 worker 0] [Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks "
        "is : 1\n"
        "[slice 0 worker 0] [Gloo] Rank [Gloo] Rank 23 is connected to  is connected to 33 peer ranks. Expected\n"
        "[slice 0 worker 0]  peer ranks. Expected number of connected peer ranks is : 3\n"
        "[slice 0 worker 0] [Gloo] Rank 1 is connected to 7 peer ranks. Expected number of connected peer ranks "
        "is : [Gloo] Rank 2 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\n"
        "[slice 0 worker 0] 7\n"
        f"{trainer}\n"
        "[slice 0 worker 0] 7\n"
        f"{trainer} eval[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n"
        "[slice 0 worker 0] I1201 16:04:32.368821   28624 google_auth_provider.cc:136] Using "
        "GOOGLE_AUTH_TOKEN_FOR_TESTING\n"
        "[slice 0 worker 0] E1201 16:04:33.000001   28624 gcs_key_value_store.cc:10] request failed\n"
        "[slice 0 worker 0] Traceback (most recent call last):\n",
    )
    env = {"MULTISLICE_STATE_DIR": str(tmp_path)}
    everything = invoke("local", "logs", "--stack", "dev", "--libraries", env=env).stdout.splitlines()
    quiet = invoke("local", "logs", "--stack", "dev", env=env).stdout.splitlines()
    assert quiet == invoke("local", "logs", "--stack", "dev", "--no-libraries", env=env).stdout.splitlines()
    assert len(everything) == 13
    assert quiet == [
        "[slice 0 worker 0] " + boot(0, T0).strip(),
        "[slice 0 worker 0] boot: stack dev",
        trainer,
        "[slice 0 worker 0] 7",  # a number after a trainer's line is the trainer's
        f"{trainer} eval",  # a trainer's line that gloo wrote into: the trainer's part
        "[slice 0 worker 0] E1201 16:04:33.000001   28624 gcs_key_value_store.cc:10] request failed",
        "[slice 0 worker 0] Traceback (most recent call last):",
    ]


def test_logs_leaves_out_library_notices_unless_asked(fake, creds_env):
    fake.add(**entry(DEV, 0, 0, "trainer: starting", T0))
    fake.add(**entry(DEV, 0, 0, "[Gloo] Rank 0 is connected to 1 peer ranks.", T0 + timedelta(seconds=1)))
    fake.add(**entry(DEV, 0, 0, "I1201 16:04:32.368821   28624 auth.cc:136] Using X", T0 + timedelta(seconds=2)))
    fake.add(**entry(DEV, 0, 0, "W1201 16:04:33.000000   28624 x.cc:1] a warning", T0 + timedelta(seconds=3)))
    env = {cloud.ENDPOINT_ENV: fake.url, "GOOGLE_APPLICATION_CREDENTIALS": str(creds_env)}
    assert len(invoke("logs", "--stack", "dev", "--libraries", env=env).stdout.splitlines()) == 4
    result = invoke("logs", "--stack", "dev", env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "[slice 0 worker 0] trainer: starting",
        "[slice 0 worker 0] W1201 16:04:33.000000   28624 x.cc:1] a warning",
    ]

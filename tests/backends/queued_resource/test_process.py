"""The dynamic provider's own process (``python -m pulumi.dynamic``, driven through gRPC as the
engine drives it: tests/fakes/provider_process.py): Check and Diff of an unchanged queued
resource open no connection and import no Google API client; only the methods that call the
TPU API import it. And the process starts where the Pulumi CLI starts it: in the program
directory, with Pulumi.yaml's runtime options as ``PULUMI_RUNTIME_*``, through the launcher
that picks the virtualenv (tests/fakes/pulumi_cli.py, which cites the CLI's source lines)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from pulumi.dynamic.dynamic import serialize_provider

from infra.queued_resource import QueuedResourceProvider
from tests.fakes import pulumi_cli
from tests.fakes.provider_process import ProviderProcess
from tests.fakes.queued_resource import active, dev, fake, props  # noqa: F401 (fixtures)


def provider_process(**env: str) -> ProviderProcess:
    # The provider the program pickles: no endpoint, so an API call would go to the real TPU API.
    # Credentials as an operator has them (an access token, read offline by check); without
    # any, check reports the missing credentials instead (tests/backends/queued_resource/test_provider.py).
    env = {"GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.offline-test-token", **env}
    return ProviderProcess(serialize_provider(QueuedResourceProvider()), env=env)


def test_check_and_diff_of_an_unchanged_resource_stay_offline(active, props):
    _, id_, outs = active  # the state a real create recorded (against the loopback fake)
    inputs = {key: outs[key] for key in props}
    with provider_process() as process:
        assert process.check(inputs, dict(props)) == []
        assert process.diff(id_, outs, dict(props)) == ("DIFF_NONE", [])
        record = process.stop()
    assert record == {"network": [], "client_modules": []}


def test_a_replacing_diff_stays_offline_too(active, props):
    _, id_, outs = active
    with provider_process() as process:
        changes, replaces = process.diff(id_, outs, {**props, "slices": 4})
        record = process.stop()
    assert changes == "DIFF_SOME" and "slices" in replaces
    assert record == {"network": [], "client_modules": []}


def test_a_refresh_does_import_the_client_and_is_refused_the_network(active, props):
    # The watcher sees what it must: read calls the TPU API, so the client gets imported and
    # its connection attempts are refused (and recorded) by the audit hook.
    _, id_, outs = active
    with provider_process(
        MULTISLICE_TPU_RETRY_DEADLINE_SECONDS="1", MULTISLICE_TPU_RETRY_INITIAL_SECONDS="0.1"
    ) as process:
        error = process.read(id_, outs)
        record = process.stop()
    assert error
    assert "google.cloud.tpu_v2" in record["client_modules"]
    assert "google.api_core" in record["client_modules"]
    assert record["network"]  # the connection to the TPU API


# As the Pulumi CLI starts it (tests/fakes/pulumi_cli.py restates the CLI's sources) -----------

ROOT = Path(__file__).resolve().parents[3]
PROJECT = pulumi_cli.project_file(ROOT)
SHIPPED = pulumi_cli.shipped_launcher()
LAUNCHERS = [
    pytest.param(None, id="restated"),
    pytest.param(
        SHIPPED,
        id="shipped",
        marks=pytest.mark.skipif(
            SHIPPED is None,
            reason=f"no {pulumi_cli.LAUNCHER} here: it ships with the Pulumi CLI "
            "(or set MULTISLICE_PULUMI_PYTHON_LAUNCHER to the script)",
        ),
    ),
]


def test_the_program_the_provider_and_the_policy_pack_share_one_virtualenv():
    # Where each looks, by the rules of the CLI's sources: the provider's launcher in the
    # program directory (its working directory), the uv toolchain beside uv.lock, the policy
    # pack's `virtualenv` option relative to the pack's directory.
    program = pulumi_cli.program_directory(ROOT, PROJECT.get("main"))
    env = pulumi_cli.provider_environment(PROJECT, {})
    assert env["PULUMI_RUNTIME_TOOLCHAIN"] == "uv" and "PULUMI_RUNTIME_VIRTUALENV" not in env
    provider = Path(pulumi_cli.launcher_virtualenv(program, env) or "")
    pack = ROOT / "infra" / "policy"
    policy = pack / yaml.safe_load((pack / "PulumiPolicy.yaml").read_text())["runtime"]["options"]["virtualenv"]
    assert provider.resolve() == pulumi_cli.uv_toolchain_virtualenv(program).resolve() == ROOT / ".venv"
    assert pulumi_cli.uv_toolchain_virtualenv(ROOT).resolve() == policy.resolve() == ROOT / ".venv"
    assert (program / "__main__.py").is_file()  # what the language host runs in that directory


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_with_main_in_infra_the_launcher_would_find_no_virtualenv(launcher):
    # The layout this replaces: `main: infra/` starts the provider in infra/, and the launcher
    # looks for infra/.venv (pulumi/pulumi#7061), which the uv toolchain never creates.
    missing = f'"{ROOT}/infra/.venv" doesn\'t exist.'
    if launcher is None:
        with pytest.raises(pulumi_cli.LauncherExit, match=re.escape(missing)):
            pulumi_cli.start_provider(ROOT, ambient=os.environ, main="infra/")
        return
    started = pulumi_cli.start_provider(ROOT, ambient=os.environ, main="infra/", launcher=launcher)
    stdout, stderr = started.communicate(timeout=30)
    assert started.returncode == 1 and stdout == b"" and missing in stderr.decode()


@pytest.mark.skipif(
    not (ROOT / ".venv" / "bin" / "python").is_file(),
    reason="no .venv in the checkout: the README's set-up and the CLI's uv toolchain create it (uv run / uv sync)",
)
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_provider_started_as_the_pulumi_cli_starts_it_answers(active, props, launcher):
    # Working directory, PULUMI_RUNTIME_* environment and launcher as the CLI has them; then
    # the engine's first call (GetPluginInfo) and a Check, which unpickles the provider from
    # infra.queued_resource in that process. Credentials as an operator has them.
    _, _, outs = active
    inputs = {key: outs[key] for key in props}
    ambient = {**os.environ, "GOOGLE_OAUTH_ACCESS_TOKEN": "ya29.offline-test-token"}
    started = pulumi_cli.start_provider(ROOT, ambient=ambient, launcher=launcher)
    with ProviderProcess(serialize_provider(QueuedResourceProvider()), process=started) as process:
        assert process.plugin_info()
        assert process.check(inputs, dict(props)) == []
        process.stop()


def test_the_watched_process_ends_at_the_end_of_its_input_even_when_its_record_cannot_be_written():
    with provider_process() as process:
        assert process.plugin_info()
        process._report.mkdir()  # writing the record now fails (IsADirectoryError)
        assert process._proc.stdin is not None
        process._proc.stdin.close()
        assert process._proc.wait(timeout=60) == 0  # it left anyway (os._exit in the watcher's finally)

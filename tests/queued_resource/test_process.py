"""The dynamic provider's own process (``python -m pulumi.dynamic``, driven through gRPC as the
engine drives it: tests/fakes/provider_process.py): Check and Diff of an unchanged queued
resource open no connection and import no Google API client; only the methods that call the
TPU API import it."""

from __future__ import annotations

from pulumi.dynamic.dynamic import serialize_provider

from infra.queued_resource import QueuedResourceProvider
from tests.fakes.provider_process import ProviderProcess
from tests.fakes.queued_resource import active, dev, fake, props  # noqa: F401 (fixtures)


def provider_process(**env: str) -> ProviderProcess:
    # The provider the program pickles: no endpoint, so an API call would go to the real TPU API.
    # Credentials as an operator has them (an access token, read offline by check); without
    # any, check reports the missing credentials instead (tests/queued_resource/test_provider.py).
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

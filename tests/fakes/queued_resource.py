"""What the queued-resource tests share: the dev stack's props (with a stand-in for the rendered
startup script), the loopback TPU API fake (:mod:`tests.fakes.tpu_api`), and a provider aimed
at it with millisecond poll intervals and retry delays.

Test modules import the fixtures they use by name, e.g.
``from tests.fakes.queued_resource import dev, fake, props``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import pytest
from google.cloud import tpu_v2

from infra import credentials
from infra.backends.queued_resource.program import queued_resource_inputs
from infra.config import load_stack
from infra.queued_resource import QueuedResourceProvider
from tests.fakes.tpu_api import FakeTpuApi

NETWORK = "projects/acme-ml-dev/global/networks/multislice-dev-net"
SUBNETWORK = "projects/acme-ml-dev/regions/us-central2/subnetworks/multislice-dev-subnet"
SERVICE_ACCOUNT = "multislice-dev-tpu@acme-ml-dev.iam.gserviceaccount.com"
TAG = "multislice-dev-tpu"


@dataclass(frozen=True)
class Script:
    """Stands in for infra.startup.RenderedScript (the provider only reads these fields)."""

    text: str
    sha256: str
    bundle_sha256: str = "b" * 64
    requirements_sha256: str = "r" * 64

    @property
    def size_bytes(self) -> int:
        return len(self.text.encode())

    @property
    def files(self) -> dict[str, str]:
        """One release file, the script itself (RenderedScript.files lists the release's)."""
        return {"script.sh": self.sha256[:16]}


def script(text: str = "#!/bin/bash\necho v1\n", **fields: str) -> Script:
    return Script(text=text, sha256=hashlib.sha256(text.encode()).hexdigest(), **fields)


def props_for(config, rendered: Script | None = None) -> dict:
    """The QR's props for ``config`` as the program builds them (``queued_resource_inputs``),
    with this module's network, account and tag."""
    return queued_resource_inputs(
        config,
        rendered or script(),
        network=NETWORK,
        subnetwork=SUBNETWORK,
        service_account=SERVICE_ACCOUNT,
        tags=[TAG],
    ).to_props()


def provider_for(fake: FakeTpuApi, lines: list[str] | None = None, **overrides) -> QueuedResourceProvider:
    settings = dict(
        api_endpoint=fake.endpoint,
        poll_seconds=0.005,
        max_poll_seconds=0.01,
        retry_initial_seconds=0.005,
        retry_deadline_seconds=1.0,
        progress=(lines.append if lines is not None else (lambda _line: None)),
    )
    settings.update(overrides)
    return QueuedResourceProvider(**settings)


def qr_name(props) -> str:
    return f"projects/{props['project']}/locations/{props['zone']}/queuedResources/{props['queuedResourceId']}"


def create_body(fake: FakeTpuApi) -> tpu_v2.QueuedResource:
    """The ``tpu_v2.QueuedResource`` of the first successful CreateQueuedResource the fake got."""
    call = next(c for c in fake.calls if c.rpc == "CreateQueuedResource" and c.status == 200)
    return tpu_v2.QueuedResource.from_json(json.dumps(call.body))


#: Environment variables through which ambient credentials could reach a test.
CREDENTIAL_ENV = (
    *(name for names in credentials.SOURCES.values() for name in names),
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_QUOTA_PROJECT",
    "GCE_METADATA_HOST",
    "GCE_METADATA_IP",
    "MULTISLICE_TPU_API_ENDPOINT",
    "MULTISLICE_TPU_CONCURRENCY",
)


def clear_ambient_credentials(monkeypatch, tmp_path) -> None:
    """No credentials of the machine running the tests: none of :data:`CREDENTIAL_ENV`, an
    empty gcloud config directory, and not a Google Cloud VM."""
    for name in CREDENTIAL_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setattr(credentials, "PRODUCT_NAME_FILE", tmp_path / "product_name")


def refuse_connections(monkeypatch) -> list:
    """Every ``socket.connect`` of the test fails (ConnectionRefusedError); returns the list the
    attempted addresses are appended to, so a test can assert that nothing was sent."""
    import socket

    attempts: list = []

    def refuse(sock, address):
        attempts.append(address)
        raise ConnectionRefusedError("no network in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch, tmp_path):
    """:func:`clear_ambient_credentials` for every test (autouse where imported)."""
    clear_ambient_credentials(monkeypatch, tmp_path)


@pytest.fixture
def access_token(monkeypatch) -> str:
    """An access token in GOOGLE_OAUTH_ACCESS_TOKEN (as pulumi-gcp would take it)."""
    monkeypatch.setenv("GOOGLE_OAUTH_ACCESS_TOKEN", "ya29.test-token")
    return "ya29.test-token"


@pytest.fixture(scope="module")
def dev():
    return load_stack("dev")


@pytest.fixture
def props(dev):
    return props_for(dev)


@pytest.fixture
def fake():
    with FakeTpuApi() as server:
        yield server


@pytest.fixture
def active(fake, props):
    """(provider, id, outputs) of an ACTIVE queued resource of ``props``; the fake's call log
    is cleared."""
    provider = provider_for(fake)
    result = provider.create(props)
    fake.calls.clear()
    return provider, result.id, result.outs

"""The gke backend's operator commands (infra.backends.gke.operate) against the real clients: each
kubectl argument list parsed by the installed kubectl (it gets as far as dialling a closed loopback
port; a wrong flag stops it before), gcloud's get-credentials run against a loopback Container API
that answers one cluster, and the kubeconfig gcloud writes compared with the one the program's
Kubernetes provider uses (infra.backends.gke.workload.kubeconfig)."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import subprocess
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from infra.backends.gke import operate, workload
from infra.backends.gke.operate import PodListingError, PodPlace
from infra.emulated import api_traffic
from tests.helpers.kubectl import CONTEXT, DNS_ENDPOINT, kubectl_reaches_the_server


def test_the_listing_exec_and_suspend_commands_parse_in_kubectl(tmp_path):
    for args in (
        operate.pods_command(context=CONTEXT, namespace="default", jobset="dev"),
        operate.exec_command(context=CONTEXT, namespace="default", pod="dev-slice-0-0", command=["python3", "-V"]),
        operate.suspend_command(context=CONTEXT, namespace="default", jobset="dev", suspend=True),
        operate.suspend_command(context=CONTEXT, namespace="default", jobset="dev", suspend=False),
    ):
        kubectl_reaches_the_server(tmp_path, args)


def test_a_wrong_flag_is_what_the_check_catches(tmp_path):
    # The check above is only worth something if kubectl stops at a flag it does not know.
    args = operate.exec_command(context=CONTEXT, namespace="default", pod="p", command=["true"])
    args[args.index("--container")] = "--containr"
    with pytest.raises(AssertionError):
        kubectl_reaches_the_server(tmp_path, args)


def test_suspend_patches_the_spec():
    args = operate.suspend_command(context=CONTEXT, namespace="ns", jobset="dev", suspend=True)
    assert args[args.index("--patch") + 1] == '{"spec":{"suspend":true}}' and args[args.index("jobset") + 1] == "dev"


def test_exec_needs_a_command():
    with pytest.raises(ValueError, match="needs a command"):
        operate.exec_command(context=CONTEXT, namespace="default", pod="p", command=[])


class _ContainerApi(http.server.BaseHTTPRequestHandler):
    """Answers GET .../locations/L/clusters/C as the Container API does for a cluster with a
    DNS-based endpoint (the fields gcloud's get-credentials reads); vetted and recorded
    (:mod:`infra.emulated.api_traffic`), so the Container API's discovery document judges both."""

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        refusal = api_traffic.vet("container.v1", "GET", url.path, query, None)
        if refusal is not None:
            self._send(*refusal, api_traffic.Exchange("container.v1", "GET", url.path, query))
            return
        parts = url.path.split("/")
        body = {
            "name": parts[-1],
            "location": parts[-3],
            "zone": parts[-3],
            "status": "RUNNING",
            "endpoint": "10.0.0.2",
            "masterAuth": {"clusterCaCertificate": "Q0E="},
            "controlPlaneEndpointsConfig": {
                "dnsEndpointConfig": {"endpoint": DNS_ENDPOINT, "allowExternalTraffic": True},
                "ipEndpointsConfig": {"enabled": True},
            },
        }
        self._send(200, body, api_traffic.Exchange("container.v1", "GET", url.path, query))

    def _send(self, code: int, body: dict, exchange: api_traffic.Exchange) -> None:
        exchange.status, exchange.response = code, body
        api_traffic.record(exchange)
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


@pytest.fixture
def container_api() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ContainerApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    thread.join(timeout=10)


def test_gcloud_writes_the_kubeconfig_the_program_uses(tmp_path, container_api):
    if shutil.which("gcloud") is None:
        pytest.skip("no gcloud on PATH: the kubeconfig is compared with the one the installed gcloud writes")
    kube = tmp_path / "kubeconfig"
    env = {
        **os.environ,
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "CLOUDSDK_API_ENDPOINT_OVERRIDES_CONTAINER": container_api,
        "CLOUDSDK_AUTH_DISABLE_CREDENTIALS": "true",
        "KUBECONFIG": str(kube),
        "PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p),
    }
    args = operate.credentials_command(project="acme-ml-dev", location="us-east5-a", cluster="multislice-dev")
    done = subprocess.run(args, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, done.stderr
    written = yaml.safe_load(kube.read_text())
    ours = yaml.safe_load(
        workload.kubeconfig(
            project="acme-ml-dev", location="us-east5-a", cluster="multislice-dev", dns_endpoint=DNS_ENDPOINT
        )
    )
    written.pop("preferences", None)
    # gcloud names the plugin by its full path when it finds it installed: the command is its name.
    for user in written["users"]:
        user["user"]["exec"]["command"] = Path(user["user"]["exec"]["command"]).name
    assert written == ours


def test_the_log_filter_matches_the_runs_pods():
    assert operate.log_filter(cluster="multislice-dev", namespace="default", jobset="dev") == (
        'resource.type="k8s_container" AND resource.labels.cluster_name="multislice-dev" AND '
        'resource.labels.namespace_name="default" AND resource.labels.pod_name:"dev-"'
    )


def pod(name: str, slice_id: object, worker: object, phase: str = "Running", jobset: str = "dev", label: bool = True):
    labels = {"jobset.sigs.k8s.io/jobset-name": jobset, "jobset.sigs.k8s.io/job-index": slice_id}
    index = {"batch.kubernetes.io/job-completion-index": worker}
    metadata = (
        {"name": name, "labels": labels | index} if label else {"name": name, "labels": labels, "annotations": index}
    )
    return {"metadata": metadata, "status": {"phase": phase}}


def test_the_pods_are_placed_by_their_labels_or_annotation():
    listing = {
        "kind": "List",
        "items": [
            pod("dev-slice-1-0-x", "1", "0"),
            pod("dev-slice-0-1-y", "0", "1", label=False),  # before Kubernetes 1.28: the annotation only
            pod("dev-slice-0-0-z", "0", "0", phase="Pending"),
            pod("other-slice-0-0", "0", "0", jobset="other"),  # another JobSet's Pod: not the run's
        ],
    }
    assert operate.pods_of(json.dumps(listing), "dev") == [
        PodPlace(0, 0, "dev-slice-0-0-z", "Pending"),
        PodPlace(0, 1, "dev-slice-0-1-y", "Running"),
        PodPlace(1, 0, "dev-slice-1-0-x", "Running"),
    ]


@pytest.mark.parametrize(
    ("listing", "message"),
    [
        ("not json", "not JSON"),
        ("[" * 100_000, r"^kubectl's Pod listing is not JSON \(JSON nested deeper than this reader takes\)$"),
        (json.dumps({"kind": "Status"}), "no 'items' list"),
        (json.dumps({"items": [pod("dev-a", "zero", "0")]}), "Pod dev-a of JobSet dev has no integer"),
        (json.dumps({"items": [pod("dev-a", "0", "0"), pod("dev-b", "0", "0")]}), "dev-a and dev-b both claim"),
    ],
)
def test_a_listing_that_is_not_the_runs_pods_is_named(listing, message):
    with pytest.raises(PodListingError, match=message):
        operate.pods_of(listing, "dev")

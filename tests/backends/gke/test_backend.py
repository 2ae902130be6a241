"""The gke backend's operator commands on a stack (infra.backends.gke.backend): ``status`` reads the
run's Pods from kubectl's listing, ``exec`` plans ``kubectl exec`` in each Running Pod and refuses
otherwise, the commands say which gcloud command writes a missing kubeconfig context (the installed
kubectl's own error), the SSH hint's kubectl command parses in the installed kubectl, and the log
filter names the Pods' entry labels."""

from __future__ import annotations

import os
import re
import shlex
import stat
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from infra.backends.capacity import QueuedResourceNotFound
from infra.backends.gke import capacity, kubectl, logs, names
from infra.backends.operations import BACKENDS
from infra.remote.selection import RemoteError, select_workers
from infra.status.progress import RunProgress
from infra.status.report import StackStatus, render
from tests.helpers.kubectl import kubectl_reaches_the_server, pod_listing as listing

GKE = BACKENDS["gke"]


ALL_RUNNING = {(s, w): "Running" for s in (0, 1) for w in (0, 1)}


def test_status_reads_each_slices_pods(config):
    read = capacity.read(config, lambda: listing(config, ALL_RUNNING))
    assert (read.id, read.state, read.backend) == ("multislice-dev", "READY", "gke")
    assert [(item.node, item.state, item.vms_running) for item in read.slices] == [
        ("multislice-dev-0", "READY", 2),
        ("multislice-dev-1", "READY", 2),
    ]
    pending = capacity.read(config, lambda: listing(config, ALL_RUNNING | {(1, 1): "Pending"}))
    assert pending.state == "NOT_READY" and [item.state for item in pending.slices] == ["READY", "NOT_READY"]
    console = Console(width=200, record=True)
    console.print(render(StackStatus("dev", pending, RunProgress(config.run_dir, 24))))
    text = console.export_text()  # what `multislice status` prints: a slice's workers are its Pods
    assert "node pools" in text and "multislice-dev-1  NOT_READY  1/2 Pods running" in text, text
    one_slice = capacity.read(config, lambda: listing(config, {(0, 0): "Running", (0, 1): "Running"}))
    assert one_slice.state == "NOT_READY" and one_slice.slices[1].state == "MISSING"
    done = capacity.read(config, lambda: listing(config, dict.fromkeys(ALL_RUNNING, "Succeeded")))
    assert done.state == "SUCCEEDED"
    with pytest.raises(QueuedResourceNotFound, match="no Pods of JobSet multislice-dev"):
        capacity.read(config, lambda: listing(config, {}))
    assert GKE.headline("dev", read) == (
        "stack dev: JobSet multislice-dev on node pools multislice-dev-0, multislice-dev-1 is READY"
    )


def fake_kubectl(tmp_path: Path, answer: str, monkeypatch) -> Path:
    """A kubectl that prints ``answer`` (and records its arguments), named by MULTISLICE_KUBECTL."""
    (tmp_path / "answer.json").write_text(answer)
    path = tmp_path / "kubectl"
    path.write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/args\ncat {tmp_path}/answer.json\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("MULTISLICE_KUBECTL", str(path))
    return path


def test_exec_runs_kubectl_exec_in_each_selected_pod(config, tmp_path, monkeypatch):
    path = fake_kubectl(tmp_path, listing(config, ALL_RUNNING), monkeypatch)
    plan = GKE.exec_plan("", config, select_workers(config, slice_id=1), "hostname")
    listed = (tmp_path / "args").read_text().split()
    assert listed[:4] == ["--context", names.kube_context(config), "--namespace", "default"]
    targets = plan.targets()
    assert [(t.slice_id, t.worker) for t in targets] == [(1, 0), (1, 1)]
    argv = list(targets[1].argv)
    assert argv[0] == str(path) and argv[argv.index("exec") + 1] == "multislice-dev-slice-1-1-x11"
    assert argv[argv.index("--") + 1 : argv.index("--") + 3] == ["/bin/bash", "-c"] and "hostname" in argv[-1]
    assert not GKE.exec_needs_ssh


def test_exec_refuses_while_a_pod_is_not_running(config, tmp_path, monkeypatch):
    fake_kubectl(tmp_path, listing(config, ALL_RUNNING | {(0, 1): "Pending"}), monkeypatch)
    with pytest.raises(RemoteError, match=r"slice 0 worker 1 \(Pending\).*nothing was run") as err:
        GKE.exec_plan("", config, select_workers(config), "true")
    assert err.value.exit_code == 2
    fake_kubectl(tmp_path, listing(config, {(0, 0): "Running"}), monkeypatch)
    with pytest.raises(RemoteError, match="no Pod for slice 0 worker 1, slice 1 worker 0, slice 1 worker 1"):
        GKE.exec_plan("", config, select_workers(config), "true")


def test_a_missing_context_names_the_command_that_writes_it(config, tmp_path, monkeypatch):
    if not (found := kubectl.shutil.which("kubectl")):
        pytest.skip("no kubectl on PATH: the installed kubectl's own error is what this reads")
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config"}))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    monkeypatch.setenv("MULTISLICE_KUBECTL", found)
    with pytest.raises(kubectl.KubectlError) as err:
        kubectl.list_pods(config)
    assert err.value.exit_code == 2
    assert "gcloud container clusters get-credentials multislice-dev --location us-central2-b" in str(err.value)
    monkeypatch.setenv("MULTISLICE_KUBECTL", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(kubectl.KubectlError, match="cannot run kubectl"):
        kubectl.list_pods(config)
    monkeypatch.delenv("MULTISLICE_KUBECTL")
    with pytest.raises(kubectl.KubectlError, match="kubectl is not on PATH"):
        kubectl.list_pods(config)


def test_the_ssh_hint_follows_slice_0_worker_0_with_a_command_kubectl_parses(config, tmp_path):
    credentials, follow = GKE.ssh_command(config).split(" && ")
    assert shlex.split(credentials)[:5] == ["gcloud", "container", "clusters", "get-credentials", "multislice-dev"]
    args = shlex.split(follow)
    assert "jobset.sigs.k8s.io/job-index=0" in args[args.index("--selector") + 1]
    kubectl_reaches_the_server(tmp_path, args, context=names.kube_context(config))


def test_the_log_filter_reads_the_pods_labels_as_cloud_logging_writes_them(config):
    assert logs.entry_label("jobset.sigs.k8s.io/job-index") == "k8s-pod/jobset_sigs_k8s_io/job-index"
    assert logs.entry_label("multislice-run") == "k8s-pod/multislice-run"
    narrowed = GKE.trainer_filter(config, slice_id=1, worker=0)
    assert 'labels."k8s-pod/multislice-run"="dev"' in narrowed
    assert 'labels."k8s-pod/jobset_sigs_k8s_io/job-index"="1"' in narrowed
    assert 'labels."k8s-pod/batch_kubernetes_io/job-completion-index"="0"' in narrowed
    assert os.path.basename(GKE.log_source(config)).startswith("trainer lines of run dev")


#: A Kubernetes label value, as its docs give the syntax ("Labels and Selectors": at most 63
#: characters, beginning and ending with an alphanumeric, dashes, underscores and dots between).
K8S_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


@pytest.mark.parametrize("run", ["exp-1-", "_a_", "Run.Name_", "x" * 62 + "-y" + "z" * 30])
def test_a_run_name_becomes_a_kubernetes_label_the_log_filter_names(config, run):
    renamed = config.model_copy(update={"run_name": run})
    labels = names.pod_labels(renamed)
    assert all(K8S_LABEL_VALUE.fullmatch(v) and len(v) <= 63 for v in labels.values()), labels
    assert labels["multislice-stack"] == "dev"
    assert f'labels."k8s-pod/multislice-run"="{labels["multislice-run"]}"' in GKE.trainer_filter(renamed)


def test_both_of_kubectls_missing_context_errors_are_read(config, tmp_path, monkeypatch):
    # A kubeconfig with another context gives the other wording.
    context = {"name": "other", "context": {"cluster": "c", "user": "u"}}
    kubeconfig = {"apiVersion": "v1", "kind": "Config", "contexts": [context], "current-context": "other"}
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(kubeconfig))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    if not kubectl.shutil.which("kubectl"):
        pytest.skip("no kubectl on PATH: the installed kubectl's own error is what this reads")
    with pytest.raises(kubectl.KubectlError, match="get-credentials") as err:
        kubectl.list_pods(config)
    assert err.value.exit_code == 2

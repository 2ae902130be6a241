"""The installed kubectl as a checker of argument lists: a kubeconfig whose context points at a
closed loopback port, so a command gets as far as dialling it (a wrong flag stops it before)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.backends.gke import names

CONTEXT = "gke_acme-ml-dev_us-east5-a_multislice-dev"
DNS_ENDPOINT = "gke-0123456789ab.us-east5-a.gke.goog"


def kubectl_reaches_the_server(tmp_path: Path, args: list[str], context: str = CONTEXT) -> str:
    """Run ``args`` (a kubectl command) with a kubeconfig whose context ``context`` points at a
    closed loopback port; return its stderr, asserting it tried the server."""
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl on PATH: the argument lists are checked by the installed kubectl (Cloud SDK's)")
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": context, "context": {"cluster": "c", "user": "u"}}],
        "current-context": context,
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    env = {**os.environ, "KUBECONFIG": str(path), "HOME": str(tmp_path)}
    done = subprocess.run(args, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)
    assert done.returncode != 0 and "127.0.0.1:9" in done.stderr, (args, done.stderr)
    return done.stderr


def pod_listing(config, phases: dict[tuple[int, int], str]) -> str:
    """kubectl's ``get pods -o json`` of the run's Pods in the given phases (one other JobSet's Pod too)."""
    jobset = names.jobset_name(config)
    items = [
        {
            "metadata": {
                "name": f"{jobset}-slice-{s}-{w}-x{s}{w}",
                "labels": {
                    "jobset.sigs.k8s.io/jobset-name": jobset,
                    "jobset.sigs.k8s.io/job-index": str(s),
                    "batch.kubernetes.io/job-completion-index": str(w),
                },
            },
            "status": {"phase": phase},
        }
        for (s, w), phase in phases.items()
    ]
    items.append({"metadata": {"name": "other", "labels": {"jobset.sigs.k8s.io/jobset-name": "other"}}})
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})

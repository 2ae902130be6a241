"""``multislice reset`` on a gke stack (infra.backends.gke.reset) against a kubectl that plays the
cluster: the JobSet is suspended, its Pods go (the first listings after the patch still show them,
as Pods do while their trainers save), it is resumed, its Pods come back Pending, then Running.
Nothing is sent without Pods or without confirmation; a wait for the Pods to go that runs out leaves
the JobSet suspended and names the command that resumes it, which the installed kubectl parses."""

from __future__ import annotations

import json
import shlex
import stat
from pathlib import Path

import pytest

from infra.backends.gke import names, reset
from infra.backends.operations import BACKENDS
from infra.remote.selection import RemoteError
from tests.helpers.kubectl import kubectl_reaches_the_server, pod_listing

PODS = [(s, w) for s in (0, 1) for w in (0, 1)]

#: The cluster as kubectl shows it: what ``get pods`` answers depends on the JobSet's last patch and
#: on how many listings came since (``$GONE_AFTER`` listings still show a suspended JobSet's Pods,
#: the first one after a resume shows them Pending). Every call is appended to ``calls``.
FAKE = """#!/bin/bash
d=DIR
echo "$*" >> "$d/calls"
case "$*" in
  *" patch jobset "*'{"spec":{"suspend":true}}') echo suspended > "$d/state"; echo 0 > "$d/polls"; exit 0;;
  *" patch jobset "*'{"spec":{"suspend":false}}') echo resumed > "$d/state"; echo 0 > "$d/polls"; exit 0;;
  *" get pods "*)
    n=$(( $(cat "$d/polls") + 1 )); echo "$n" > "$d/polls"
    case "$(cat "$d/state")" in
      running) cat "$d/running.json";;
      suspended) if [ "$n" -le "$GONE_AFTER" ]; then cat "$d/running.json"; else cat "$d/none.json"; fi;;
      resumed) if [ "$n" -le 1 ]; then cat "$d/pending.json"; else cat "$d/running.json"; fi;;
    esac;;
  *) echo "unexpected: $*" >&2; exit 1;;
esac
"""


@pytest.fixture
def cluster(config, tmp_path, monkeypatch):
    """The fake kubectl's directory, its JobSet's Pods all Running; ``GONE_AFTER`` is 2."""
    (tmp_path / "state").write_text("running\n")
    (tmp_path / "polls").write_text("0\n")
    (tmp_path / "running.json").write_text(pod_listing(config, dict.fromkeys(PODS, "Running")))
    (tmp_path / "pending.json").write_text(pod_listing(config, dict.fromkeys(PODS, "Pending")))
    (tmp_path / "none.json").write_text(pod_listing(config, {}))
    path = tmp_path / "kubectl"
    path.write_text(FAKE.replace("DIR", shlex.quote(str(tmp_path))))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("MULTISLICE_KUBECTL", str(path))
    monkeypatch.setenv("GONE_AFTER", "2")
    return tmp_path


def calls(cluster: Path) -> list[str]:
    """What was asked of kubectl, in order: ``get``, or the patch's ``suspend`` value."""
    asked = []
    for line in (cluster / "calls").read_text().splitlines():
        asked.append("get" if " get pods " in line else str(json.loads(line.rsplit(" ", 1)[1])["spec"]["suspend"]))
    return asked


def test_a_reset_suspends_the_jobset_waits_for_its_pods_to_go_then_resumes_it(config, cluster):
    said: list[str] = []
    asked: list[str] = []
    seconds = reset.reset(config, confirm=lambda q: asked.append(q) or True, say=said.append, timeout_s=60, poll_s=0.01)
    assert seconds >= 0
    assert asked == [
        "Reset JobSet multislice-dev of stack dev: suspend it (its 4 Pod(s) get SIGTERM and are deleted) and "
        "resume it, so every Pod starts again?"
    ]
    # Listed; suspended; listed until no Pod is left (two listings still show them); resumed; listed
    # until every slice is READY (the first listing shows the new Pods Pending).
    assert calls(cluster) == ["get", "True", "get", "get", "get", "False", "get", "get"]
    assert said == [
        "reset: JobSet multislice-dev suspended; waiting for its 4 Pod(s) to save and end",
        "reset: 0 Pod(s) left",
        "reset: JobSet multislice-dev resumed; waiting for every Pod to run",
        "slice 0 (multislice-dev-0): NOT_READY",
        "slice 1 (multislice-dev-1): NOT_READY",
        "slice 0 (multislice-dev-0): READY",
        "slice 1 (multislice-dev-1): READY",
    ]
    for line in (cluster / "calls").read_text().splitlines():
        assert line.startswith(f"--context {names.kube_context(config)} --namespace default "), line


def test_the_backend_resets_and_says_how_long_it_took(config, cluster, monkeypatch):
    monkeypatch.setattr(reset, "POLL_S", 0.01)
    gke = BACKENDS["gke"]
    assert gke.reset_refusal(config) is None
    done = gke.reset(config, confirm=lambda q: True, say=lambda line: None, timeout_s=60)
    assert done.startswith("reset: every Pod of JobSet multislice-dev started again in ")
    assert done.endswith(" s; training resumes from its newest checkpoint")


def test_nothing_is_sent_without_pods_with_a_completed_run_or_without_confirmation(config, cluster):
    (cluster / "running.json").write_text(pod_listing(config, {}))
    with pytest.raises(RemoteError, match="JobSet multislice-dev has no Pods .* nothing to reset") as err:
        reset.reset(config, confirm=lambda q: True, say=print, timeout_s=60, poll_s=0.01)
    assert err.value.exit_code == 2 and calls(cluster) == ["get"]
    (cluster / "running.json").write_text(pod_listing(config, dict.fromkeys(PODS, "Succeeded")))
    with pytest.raises(RemoteError, match="every Pod of JobSet multislice-dev has completed, nothing to reset") as err:
        reset.reset(config, confirm=lambda q: True, say=print, timeout_s=60, poll_s=0.01)
    assert err.value.exit_code == 2 and calls(cluster) == ["get", "get"]
    (cluster / "running.json").write_text(pod_listing(config, dict.fromkeys(PODS, "Running")))
    with pytest.raises(RemoteError, match="not confirmed: nothing was reset") as err:
        reset.reset(config, confirm=lambda q: False, say=print, timeout_s=60, poll_s=0.01)
    assert err.value.exit_code == 1 and calls(cluster) == ["get", "get", "get"]


def test_pods_that_do_not_go_in_time_leave_the_jobset_suspended_and_the_resume_command_named(
    config, cluster, monkeypatch, tmp_path
):
    monkeypatch.setenv("GONE_AFTER", "1000000")
    with pytest.raises(RemoteError) as err:
        reset.reset(config, confirm=lambda q: True, say=lambda line: None, timeout_s=0.5, poll_s=0.01)
    message = str(err.value)
    assert err.value.exit_code == 1
    assert message.startswith("the reset stopped with JobSet multislice-dev suspended (4 Pod(s) of JobSet "), message
    assert "False" not in calls(cluster)  # not resumed: its Pods may still be saving
    resume = shlex.split(message.rsplit("resume it with `", 1)[1].rstrip("`"))
    assert resume == reset.suspend_argv(config, False)
    kubectl_reaches_the_server(tmp_path, resume, context=names.kube_context(config))

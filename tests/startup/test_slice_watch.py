"""``slice-watch.sh`` of a compute-engine release whose groups do not repair a VM alone
(infra/backends/compute_engine/slice_watch.sh): run as the release watch runs it each poll, on a
VM with its metadata (a loopback metadata server) and the slices' groups (the loopback Compute
API). A group with a lost VM (TERMINATED with no action) on two polls in a row is recreated whole,
by one VM: the first up outside the group, else inside it. The expected requests are written out
by hand from the Compute API v1 reference (``recreateInstances``: ``{"instances": [URL, …]}``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra.backends.compute_engine.emulated_api import ComputeApi
from infra.config import validate_stack
from infra.local.metadata import MetadataServer
from infra.startup import boot, contract
from tests.fakes import discovery
from tests.fakes.startup_vm import CE_GROUPS, CE_PROJECT, CE_ZONE
from tests.helpers.compute_engine import ce_map

#: Two slices of two VMs; sorted by name within each group.
GROUP_0 = ("multislice-dev-0-a1b2", "multislice-dev-0-k2m9")
GROUP_1 = ("multislice-dev-1-c8d2", "multislice-dev-1-m4n5")


def watch_text(accelerator: str = "v5p-16", capacity: str = "spot", **extra) -> str | None:
    return boot.slice_watch_script(validate_stack("dev", ce_map(accelerator, capacity=capacity, **extra), "test"))


@pytest.fixture(scope="module")
def watch(tmp_path_factory) -> Path:
    text = watch_text()
    assert text is not None
    path = tmp_path_factory.mktemp("release") / "slice-watch.sh"
    path.write_text(text)
    return path


@pytest.fixture
def api():
    with ComputeApi(CE_PROJECT, CE_ZONE, page_size=1) as server:  # one VM a page: nextPageToken is followed
        for group, vms in zip(CE_GROUPS, (GROUP_0, GROUP_1), strict=True):
            server.add_group(group)
            for i, name in enumerate(vms):
                server.add_vm(group, name, f"10.0.{group[-1]}.{i + 1}")
        yield server


def poll(watch: Path, api: ComputeApi, home: Path, own: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """One poll of the watch on VM ``own`` (``extra``: more environment variables)."""
    attributes = {contract.INSTANCE_GROUPS_KEY: ",".join(CE_GROUPS)}
    values = {
        "instance/name": own,
        "instance/zone": f"projects/123456789/zones/{CE_ZONE}",
        "project/project-id": CE_PROJECT,
    }
    home.mkdir(exist_ok=True)
    with MetadataServer(attributes, values) as metadata:
        env = {
            "PATH": "/usr/bin:/bin",
            "GCE_METADATA_IP": metadata.address,
            contract.COMPUTE_API_ENDPOINT_ENV: api.endpoint,
            "MULTISLICE_SLICE": own.split("-")[2],
            "MULTISLICE_WORKER": "0",
            **extra,
        }
        return subprocess.run(
            ["bash", str(watch), str(home)], env=env, capture_output=True, text=True, timeout=60, check=False
        )


def recreate_requests(api: ComputeApi) -> list[str]:
    return [path.rsplit("/", 2)[-2] for method, path in api.requests if path.endswith("/recreateInstances")]


def test_nothing_lost_nothing_asked(watch, api, tmp_path):
    for _ in range(2):
        result = poll(watch, api, tmp_path / "home", GROUP_1[0])
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert recreate_requests(api) == []


def test_a_lost_vm_has_its_whole_group_recreated_by_the_first_vm_up_outside_it(watch, api, tmp_path):
    """Slice 0's second VM preempted (TERMINATED, no action): slice 1's first VM says so at the first
    poll, and at the second asks for both of slice 0's VMs; the other VMs ask nothing."""
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    first = poll(watch, api, tmp_path / "actor", GROUP_1[0])
    assert first.returncode == 0 and recreate_requests(api) == []
    assert f"group {CE_GROUPS[0]}: lost VM {GROUP_0[1]} (TERMINATED)" in first.stdout
    for other in (GROUP_0[0], GROUP_1[1]):  # not the first VM up outside slice 0: silent
        for _ in range(2):
            quiet = poll(watch, api, tmp_path / other, other)
            assert (quiet.returncode, quiet.stdout) == (0, "")
    assert recreate_requests(api) == []

    second = poll(watch, api, tmp_path / "actor", GROUP_1[0])
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"group {CE_GROUPS[0]}: recreating all 2 of its VMs together" in second.stdout
    assert api.take_recreations() == [(CE_GROUPS[0], list(GROUP_0))]
    # The group's VMs now carry RECREATING: no VM asks again.
    assert poll(watch, api, tmp_path / "actor", GROUP_1[0]).stdout == ""
    assert recreate_requests(api) == [CE_GROUPS[0]]


def test_a_module_on_the_vms_pythonpath_does_not_change_how_the_answers_are_read(watch, api, tmp_path):
    """The answers are read with ``python3 -I -S``: a ``json`` module of the VM's ``PYTHONPATH``
    (a user's, or a package's) is not the one that parses them."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "json.py").write_text("raise SystemExit('a json module of PYTHONPATH was imported')\n")
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    result = poll(watch, api, tmp_path / "home", GROUP_1[0], PYTHONPATH=str(shadow))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"group {CE_GROUPS[0]}: lost VM {GROUP_0[1]} (TERMINATED)" in result.stdout


def test_a_vm_seen_lost_once_only_is_not_recreated(watch, api, tmp_path):
    """A VM that is back at the next poll (e.g. Compute Engine restarted it) is left alone."""
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    poll(watch, api, tmp_path / "home", GROUP_1[0])
    api.set_vm(GROUP_0[1], ip="10.0.0.2")
    assert poll(watch, api, tmp_path / "home", GROUP_1[0]).stdout == ""
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    assert "lost VM" in poll(watch, api, tmp_path / "home", GROUP_1[0]).stdout
    assert recreate_requests(api) == []


def test_with_no_vm_up_outside_a_group_a_survivor_inside_it_recreates_it(watch, api, tmp_path):
    """Slice 1 lost entirely and slice 0 one VM: slice 0's survivor recreates both groups (its
    own too: it is recreated with them)."""
    for name in (GROUP_0[1], *GROUP_1):
        api.set_vm(name, ip=None, status="STOPPED")
    for _ in range(2):
        result = poll(watch, api, tmp_path / "home", GROUP_0[0])
        assert result.returncode == 0, result.stdout + result.stderr
    assert api.take_recreations() == [(CE_GROUPS[0], list(GROUP_0)), (CE_GROUPS[1], list(GROUP_1))]


def test_a_refused_request_is_one_line_and_a_failed_poll(watch, api, tmp_path, monkeypatch):
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    api.remove_group(CE_GROUPS[1])  # listing it fails: this poll does nothing
    result = poll(watch, api, tmp_path / "home", GROUP_0[0])
    assert result.returncode == 1 and recreate_requests(api) == []
    assert result.stdout.count("\n") == 1 and f"group {CE_GROUPS[1]} could not be listed (HTTP 404" in result.stdout


@pytest.mark.parametrize(
    ("accelerator", "capacity", "extra", "watched"),
    [
        ("v5p-16", "spot", {}, True),
        ("v5p-16", "reserved", {"multislice:reservationName": "r"}, True),
        ("v6e-8", "flex-start", {"multislice:computeEngine": {"maxRunDuration": "1d"}}, True),
        ("v6e-8", "spot", {}, False),  # the group repairs its one VM
        ("v6e-8", "on-demand", {}, False),
    ],
)
def test_the_release_carries_the_watch_where_the_group_does_not_repair_a_vm(accelerator, capacity, extra, watched):
    text = watch_text(accelerator, capacity, **extra)
    assert (text is not None) == watched
    if text is not None:
        assert "@@" not in text and f"${{{contract.COMPUTE_API_ENDPOINT_ENV}:-" in text


@pytest.mark.schema_refusals
def test_a_refused_recreation_names_the_group_and_recreates_nothing(monkeypatch, watch, tmp_path):
    """The Compute API refuses recreateInstances (its document without ``instances``, as if Google had
    renamed it): one line naming the group, nothing recreated, asked again at the next poll."""

    def rename_instances(data: dict) -> None:
        del data["schemas"]["InstanceGroupManagersRecreateInstancesRequest"]["properties"]["instances"]

    discovery.refuse_with(monkeypatch, "compute.v1", rename_instances)
    with ComputeApi(CE_PROJECT, CE_ZONE) as api:
        for group, vms in zip(CE_GROUPS, (GROUP_0, GROUP_1), strict=True):
            api.add_group(group)
            for i, name in enumerate(vms):
                api.add_vm(group, name, f"10.0.{group[-1]}.{i + 1}")
        api.set_vm(GROUP_1[0], ip=None, status="TERMINATED")
        first = poll(watch, api, tmp_path / "home", GROUP_0[0])
        second = poll(watch, api, tmp_path / "home", GROUP_0[0])
        assert api.take_recreations() == []
    assert first.returncode == 0
    (line,) = second.stdout.splitlines()
    assert second.returncode == 1 and second.stderr == ""
    assert line.startswith(f"[slice 0 worker 0] slice watch: warning: group {CE_GROUPS[1]}: recreateInstances failed")
    assert "HTTP 400" in line and "unknown field 'instances'" in line and line.endswith("at the next poll")

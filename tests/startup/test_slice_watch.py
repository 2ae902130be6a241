"""``slice-watch.sh`` of a compute-engine release whose groups do not repair a VM alone
(infra/backends/compute_engine/slice_watch.sh): run as the release watch runs it each poll, on a
VM with its metadata (a loopback metadata server) and the slices' groups (the loopback Compute
API).

Spot (Compute Engine does not recover a preempted Spot slice: "Failure recovery of TPU
instances"): a group with a lost VM (TERMINATED with no action) on two polls in a row, first seen
at least the grace ago, is resized to 0 by the first VM up outside it, and a group that lists no
VM is resized back to the slice's VMs (bulk mode adds VMs only to an empty group: "About bulk
mode"). A managed capacity mode (on-demand here): Compute Engine recovers the slice itself, so the
watch reports it once and asks nothing. The expected requests are written out by hand from the
Compute API v1 reference (``instanceGroupManagers.resize``: ``POST …/resize?size=N``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from infra import vm_contract as contract
from infra.backends.compute_engine.emulated_api import ComputeApi
from infra.config import validate_stack
from infra.emulated.metadata import MetadataServer
from infra.startup import boot
from tests.fakes import discovery
from tests.fakes.startup_vm import CE_GROUPS, CE_PROJECT, CE_ZONE
from tests.helpers.compute_engine import ce_map

#: Two slices of two VMs; sorted by name within each group.
GROUP_0 = ("multislice-dev-0-a1b2", "multislice-dev-0-k2m9")
GROUP_1 = ("multislice-dev-1-c8d2", "multislice-dev-1-m4n5")


def watch_text(accelerator: str = "v5p-16", capacity: str = "spot", **extra) -> str | None:
    return boot.slice_watch_script(validate_stack("dev", ce_map(accelerator, capacity=capacity, **extra), "test"))


def written(tmp_path_factory, capacity: str) -> Path:
    text = watch_text(capacity=capacity)
    assert text is not None
    path = tmp_path_factory.mktemp("release") / "slice-watch.sh"
    path.write_text(text)
    return path


@pytest.fixture(scope="module")
def watch(tmp_path_factory) -> Path:
    return written(tmp_path_factory, "spot")


@pytest.fixture(scope="module")
def on_demand_watch(tmp_path_factory) -> Path:
    return written(tmp_path_factory, "on-demand")


def fill(server: ComputeApi) -> None:
    for group, vms in zip(CE_GROUPS, (GROUP_0, GROUP_1), strict=True):
        server.add_group(group)
        for i, name in enumerate(vms):
            server.add_vm(group, name, f"10.0.{group[-1]}.{i + 1}")


@pytest.fixture
def api():
    with ComputeApi(CE_PROJECT, CE_ZONE, page_size=1) as server:  # one VM a page: nextPageToken is followed
        fill(server)
        yield server


def poll(
    watch: Path, api: ComputeApi, home: Path, own: str, grace: str = "0", **extra: str
) -> subprocess.CompletedProcess[str]:
    """One poll of the watch on VM ``own`` (``grace``: MULTISLICE_SLICE_WATCH_GRACE_S; ``extra``:
    more environment variables)."""
    attributes = {contract.INSTANCE_GROUPS_KEY: ",".join(CE_GROUPS), contract.WORKERS_PER_SLICE_KEY: "2"}
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
            contract.SLICE_WATCH_GRACE_ENV: grace,
            "MULTISLICE_SLICE": own.split("-")[2],
            "MULTISLICE_WORKER": "0",
            **extra,
        }
        return subprocess.run(
            ["bash", str(watch), str(home)], env=env, capture_output=True, text=True, timeout=60, check=False
        )


def resizes(api: ComputeApi) -> list[str]:
    """``group size=N`` of each resize request, in order."""
    return [
        f"{path.split('/')[-2]} {path.rsplit('?', 1)[1]}"
        for method, path in api.requests
        if method == "POST" and "/resize?" in path
    ]


def test_nothing_lost_nothing_asked(watch, api, tmp_path):
    for _ in range(2):
        result = poll(watch, api, tmp_path / "home", GROUP_1[0])
        assert (result.returncode, result.stdout, result.stderr) == (0, "", "")
    assert resizes(api) == []


def test_a_lost_spot_vm_has_its_slices_vms_recreated_by_the_first_vm_up_outside_it(watch, api, tmp_path):
    """Slice 0's second VM preempted (TERMINATED, no action): slice 1's first VM says so at the first
    poll, resizes slice 0's group to 0 at the second, and back to its 2 VMs once it lists none; the
    other VMs ask nothing."""
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    first = poll(watch, api, tmp_path / "actor", GROUP_1[0])
    assert first.returncode == 0 and resizes(api) == []
    assert f"group {CE_GROUPS[0]}: lost VM {GROUP_0[1]} (TERMINATED)" in first.stdout
    for other in (GROUP_0[0], GROUP_1[1]):  # not the first VM up outside slice 0: silent
        for _ in range(2):
            quiet = poll(watch, api, tmp_path / other, other)
            assert (quiet.returncode, quiet.stdout) == (0, "")
    assert resizes(api) == []

    second = poll(watch, api, tmp_path / "actor", GROUP_1[0])
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"group {CE_GROUPS[0]}: resizing it to 0 to recreate all 2 of its VMs together" in second.stdout
    assert resizes(api) == [f"{CE_GROUPS[0]} size=0"] and api.take_recreations() == []
    third = poll(watch, api, tmp_path / "actor", GROUP_1[0])
    assert f"group {CE_GROUPS[0]} lists no VM: resizing it to its slice's 2 VMs" in third.stdout
    assert resizes(api) == [f"{CE_GROUPS[0]} size=0", f"{CE_GROUPS[0]} size=2"]
    assert api.take_recreations() == [(CE_GROUPS[0], list(GROUP_0))]
    # The group's VMs are now being created: nothing more is asked.
    assert poll(watch, api, tmp_path / "actor", GROUP_1[0]).stdout == ""
    assert len(resizes(api)) == 2


def test_the_watch_waits_out_the_grace_before_it_deletes_a_slices_vms(watch, api, tmp_path):
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    for _ in range(3):
        assert poll(watch, api, tmp_path / "actor", GROUP_1[0], grace="3600").returncode == 0
    assert resizes(api) == []
    assert poll(watch, api, tmp_path / "actor", GROUP_1[0], grace="0").returncode == 0
    assert resizes(api) == [f"{CE_GROUPS[0]} size=0"]


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
    """A VM that is back at the next poll is left alone, and its next loss starts the count again."""
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    poll(watch, api, tmp_path / "home", GROUP_1[0])
    api.set_vm(GROUP_0[1], ip="10.0.0.2")
    assert poll(watch, api, tmp_path / "home", GROUP_1[0]).stdout == ""
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    assert "lost VM" in poll(watch, api, tmp_path / "home", GROUP_1[0]).stdout
    assert resizes(api) == []


def test_with_no_vm_up_outside_a_group_a_survivor_inside_it_says_how_once(watch, api, tmp_path):
    """Slice 1 lost entirely and slice 0 one VM: slice 0's survivor resizes slice 1's group (it is
    up outside it), but cannot recreate its own group's VMs (the first step would delete it): it
    says once how to do it by hand."""
    for name in (GROUP_0[1], *GROUP_1):
        api.set_vm(name, ip=None, status="STOPPED")
    first = poll(watch, api, tmp_path / "home", GROUP_0[0])
    assert first.returncode == 0, first.stdout + first.stderr
    assert (
        f"group {CE_GROUPS[0]}: lost VM {GROUP_0[1]} (STOPPED), and no VM outside it is up to recreate its VMs "
        f"(Compute Engine does not recover a Spot slice): gcloud compute instance-groups managed resize "
        f"{CE_GROUPS[0]} --size=0 --zone={CE_ZONE} --project={CE_PROJECT}, then the same with --size=2"
    ) in first.stdout.splitlines()[0]
    second = poll(watch, api, tmp_path / "home", GROUP_0[0])
    assert second.stdout.count(CE_GROUPS[0]) == 0
    assert resizes(api) == [f"{CE_GROUPS[1]} size=0"]


def test_a_refused_request_is_one_line_and_a_failed_poll(watch, api, tmp_path):
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    api.remove_group(CE_GROUPS[1])  # listing it fails: this poll does nothing
    result = poll(watch, api, tmp_path / "home", GROUP_0[0])
    assert result.returncode == 1 and resizes(api) == []
    assert result.stdout.count("\n") == 1 and f"group {CE_GROUPS[1]} could not be listed (HTTP 404" in result.stdout


def test_in_a_managed_capacity_mode_the_watch_reports_a_lost_slice_once_and_asks_nothing(
    on_demand_watch, api, tmp_path
):
    """On-demand: "Compute Engine automatically recovers TPU instances and slices" (Failure recovery
    of TPU instances): the first VM up outside the group says so once; no request is sent, even
    for a group that lists no VM (e.g. flex-start VMs deleted at the end of their run)."""
    api.set_vm(GROUP_0[1], ip=None, status="TERMINATED")
    first = poll(on_demand_watch, api, tmp_path / "actor", GROUP_1[0])
    assert first.returncode == 0
    assert first.stdout.splitlines() == [
        f"[slice 1 worker 0] slice watch: group {CE_GROUPS[0]}: lost VM {GROUP_0[1]} (TERMINATED); Compute Engine "
        "recovers a slice in this capacity mode itself (managed capacity), so the slice watch only reports it"
    ]
    for _ in range(2):
        assert poll(on_demand_watch, api, tmp_path / "actor", GROUP_1[0]).stdout == ""
    api.remove_vm(GROUP_0[0])
    api.remove_vm(GROUP_0[1])
    assert poll(on_demand_watch, api, tmp_path / "actor", GROUP_1[0]).stdout == ""
    assert resizes(api) == []


@pytest.mark.parametrize(
    ("accelerator", "capacity", "extra", "action"),
    [
        ("v5p-16", "spot", {}, "recreate"),
        ("tpu7x-16", "spot", {}, "recreate"),
        ("v5p-16", "reserved", {"multislice:reservationName": "r"}, "report"),
        ("v5p-16", "on-demand", {}, "report"),
        ("v5p-16", "flex-start", {"multislice:computeEngine": {"maxRunDuration": "1d"}}, "report"),
        ("v6e-8", "flex-start", {"multislice:computeEngine": {"maxRunDuration": "1d"}}, "report"),
        ("v6e-8", "spot", {}, None),  # the group repairs its one VM
        ("v6e-8", "on-demand", {}, None),
    ],
)
def test_the_release_carries_the_watch_where_the_group_does_not_repair_a_vm(accelerator, capacity, extra, action):
    text = watch_text(accelerator, capacity, **extra)
    assert (text is not None) == (action is not None)
    if text is not None:
        assert "@@" not in text and f"${{{contract.COMPUTE_API_ENDPOINT_ENV}:-" in text
        assert f"readonly ACTION={action}\n" in text
        assert f"${{{contract.SLICE_WATCH_GRACE_ENV}:-120}}" in text


@pytest.mark.schema_refusals
def test_a_refused_resize_names_the_group_and_deletes_nothing(monkeypatch, watch, tmp_path):
    """The Compute API refuses resize (its document without ``size``, as if Google had renamed it):
    one line naming the group, nothing deleted, asked again at the next poll."""

    def rename_size(data: dict) -> None:
        del data["resources"]["instanceGroupManagers"]["methods"]["resize"]["parameters"]["size"]

    discovery.refuse_with(monkeypatch, "compute.v1", rename_size)
    with ComputeApi(CE_PROJECT, CE_ZONE) as api:
        fill(api)
        api.set_vm(GROUP_1[0], ip=None, status="TERMINATED")
        first = poll(watch, api, tmp_path / "home", GROUP_0[0])
        second = poll(watch, api, tmp_path / "home", GROUP_0[0])
        listed = [m for m in api._list(CE_GROUPS[1], "")["managedInstances"]]  # type: ignore[index]
    assert first.returncode == 0 and len(listed) == 2
    (line,) = second.stdout.splitlines()
    assert second.returncode == 1 and second.stderr == ""
    assert line.startswith(f"[slice 0 worker 0] slice watch: warning: group {CE_GROUPS[1]}: resize to 0 failed")
    assert "HTTP 400" in line and "size" in line
    assert line.endswith("trying again at the next poll; action needed if it persists: fix the cause the answer names")

"""The gke stacks' node pools and clusters against GKE's own rules (tests/fakes/gke_rules.py): every
capacity mode and TPU7x under mocks passes them, and the pools GKE refuses (today's flex-start pool
before it took per-zone bounds among them) fail them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.fakes import gke_rules
from tests.fakes.pulumi_program import evaluate
from tests.helpers.compute_engine import ce_map

POOL = "gcp:container/nodePool:NodePool"
CLUSTER = "gcp:container/cluster:Cluster"
JOBSET = "kubernetes:jobset.x-k8s.io/v1alpha2:JobSet"


def gke(accelerator: str, capacity: str, **extra: Any) -> dict[str, Any]:
    values = {**ce_map(accelerator, capacity=capacity), "multislice:backend": "gke"}
    if capacity == "reserved":
        values["multislice:reservationName"] = "tpu-pool"
    values.update(extra)
    return values


#: Every capacity mode on v5p and v6e, TPU7x on each mode it takes, and a pinned version.
STACKS = {
    **{f"{acc} {cap}": gke(acc, cap) for acc in ("v5p-16", "v6e-16") for cap in ("spot", "on-demand", "reserved")},
    "v5p-16 flex-start": gke("v5p-16", "flex-start", **{"multislice:gke": {"maxRunDuration": "3d"}}),
    "v6e-16 flex-start": gke("v6e-16", "flex-start"),
    "tpu7x-16 on-demand": gke("tpu7x-16", "on-demand"),
    "tpu7x-16 flex-start": gke("tpu7x-16", "flex-start"),
    "v6e-16 queued": gke("v6e-16", "flex-start", **{"multislice:gke": {"queuedProvisioning": True}}),
    "tpu7x-16 pinned": gke("tpu7x-16", "spot", **{"multislice:gke": {"version": "1.35"}}),
}


@pytest.fixture(scope="module")
def worlds() -> dict[str, Any]:
    """stack -> its program evaluated under mocks (once for every test of the module)."""
    return {name: evaluate("dev", values) for name, values in STACKS.items()}


@pytest.fixture(scope="module")
def registered(worlds) -> dict[str, list[Any]]:
    """stack -> its TPU node pools' registrations (inputs and options)."""
    return {
        name: [r for r in world.of(POOL) if gke_rules.is_tpu_pool(r.inputs)]
        for name, world in worlds.items()
        if name.startswith("tpu7x") or name == "v5p-16 spot"
    }


@pytest.fixture(scope="module")
def declared(worlds) -> dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]]:
    """stack -> (its TPU node pools' inputs, its clusters' inputs, its JobSet's Pod spec)."""
    out = {}
    for name, world in worlds.items():
        pools = [r.inputs for r in world.of(POOL) if gke_rules.is_tpu_pool(r.inputs)]
        (replicated,) = world.one(JOBSET).inputs["spec"]["replicatedJobs"]
        out[name] = (pools, [r.inputs for r in world.of(CLUSTER)], replicated["template"]["spec"]["template"]["spec"])
    return out


@pytest.mark.parametrize("stack", list(STACKS))
def test_every_gke_stack_declares_pools_gke_accepts(declared, stack):
    pools, clusters, _ = declared[stack]
    assert len(pools) == 2  # one a slice
    assert [refusal for pool in pools for refusal in gke_rules.node_pool_refusals(pool)] == []
    assert [refusal for cluster in clusters for refusal in gke_rules.version_refusals(cluster, pools)] == []
    # Upgrades never ask for a node beyond the slice (Cluster Toolkit's gke-node-pool defaults).
    assert [pool["upgradeSettings"] for pool in pools] == [
        {"strategy": "SURGE", "maxSurge": 0, "maxUnavailable": 1}
    ] * 2


def test_a_flex_start_pool_with_total_bounds_is_refused_as_gke_refused_it(declared):
    # The pool this backend declared before: total bounds leave the per-zone maximum at 0.
    pool = copy.deepcopy(declared["v5p-16 flex-start"][0][0])
    pool["autoscaling"] = {"totalMinNodeCount": 0, "totalMaxNodeCount": 2, "locationPolicy": "ANY"}
    assert gke_rules.node_pool_refusals(pool) == [
        "Maximum node count 0 is not a valid size of TPU pod slice with topology 2x2x2"
    ]


def test_each_rule_refuses_what_gke_refuses(declared):
    flex = declared["v5p-16 flex-start"][0][0]
    tpu7x = declared["tpu7x-16 on-demand"][0][0]
    spot = declared["v5p-16 spot"][0][0]

    def changed(pool: dict[str, Any], **changes: Any) -> dict[str, Any]:
        out = copy.deepcopy(pool)
        for path, value in changes.items():
            *parents, key = path.split("__")
            node = out
            for parent in parents:
                node = node.setdefault(parent, {})
            if value is None:
                node.pop(key, None)
            else:
                node[key] = value
        return out

    assert gke_rules.node_pool_refusals(changed(spot, nodeCount=3)) == [
        "node count 3 is not a valid size of TPU pod slice with topology 2x2x2"
    ]
    assert gke_rules.node_pool_refusals(changed(flex, autoscaling__minNodeCount=1)) == [
        "Minimum node count 1 is not a valid size of TPU pod slice with topology 2x2x2"
    ]
    assert gke_rules.node_pool_refusals(changed(flex, management__autoRepair=True)) == [
        "enable_flex_start needs node auto_repair set to false"
    ]
    assert "enable_flex_start does not work with static_node_count" in gke_rules.node_pool_refusals(
        changed(flex, nodeCount=2)
    )
    assert gke_rules.node_pool_refusals(
        changed(flex, nodeConfig__reservationAffinity={"consumeReservationType": "ANY_RESERVATION"})
    ) == ["enable_flex_start requires reservation_affinity.consume_reservation_type to be 'NO_RESERVATION'"]
    queued = declared["v6e-16 queued"][0][0]
    assert gke_rules.node_pool_refusals(changed(queued, nodeConfig__labels=None)) == [
        "a queued-provisioning pool's nodes carry no cloud.google.com/gke-queued=true label for the Pods to select"
    ]
    assert "reservation_affinity should be NO_RESERVATION when enable_queued_provisioning is true" in (
        gke_rules.node_pool_refusals(changed(queued, nodeConfig__reservationAffinity=None))
    )
    assert gke_rules.node_pool_refusals(changed(queued, autoscaling__minNodeCount=4)) == [
        "autoscaling_total_min_nodes should be 0 when enable_queued_provisioning is true"
    ]
    assert gke_rules.node_pool_refusals(changed(tpu7x, placementPolicy__policyName=None)) == [
        "a multi-host TPU7x pool needs the workload policy it is placed by (placementPolicy.policyName)"
    ]
    assert gke_rules.version_refusals({"minMasterVersion": "1.33.5"}, [tpu7x]) == [
        "GKE 1.33.5 is below 1.34.0-gke.2201000"
    ]
    assert gke_rules.version_refusals({"minMasterVersion": "1.33.0-gke.1711999"}, [flex]) == [
        "GKE 1.33.0-gke.1711999 is below 1.33.0-gke.1712000"
    ]


@pytest.mark.parametrize("stack", list(STACKS))
def test_every_gke_stacks_pods_execute_nothing_from_a_non_executable_node_path(declared, stack):
    assert gke_rules.pod_exec_refusals(declared[stack][2]) == []


@pytest.mark.parametrize("stack", list(STACKS))
def test_every_gke_stacks_pods_land_on_its_pools(declared, stack):
    pools, _, pod = declared[stack]
    assert gke_rules.queued_pod_refusals(pod, pools) == []
    assert any(gke_rules.is_queued(pool) for pool in pools) is stack.endswith("queued")


def test_a_pod_that_ignores_the_queued_taint_is_refused_as_gke_would_leave_it_pending(declared):
    pools, _, pod = copy.deepcopy(declared["v6e-16 queued"])
    pod["tolerations"] = [t for t in pod["tolerations"] if t["key"] != gke_rules.QUEUED]
    del pod["nodeSelector"][gke_rules.QUEUED]
    assert gke_rules.queued_pod_refusals(pod, pools) == [
        "the Pod does not tolerate cloud.google.com/gke-queued=true:NoSchedule, the taint of a queued pool's nodes",
        "the Pod does not select cloud.google.com/gke-queued: true",
    ]


def test_a_pod_running_its_boot_from_the_node_folder_is_refused_as_cos_would_refuse_it(declared):
    # The JobSet's Pods before: the node's folder (a hostPath under /var) mounted as the boot's MULTISLICE_HOME.
    pod = copy.deepcopy(declared["v6e-16 flex-start"][2])
    (container,) = pod["containers"]
    (cache,) = [m for m in container["volumeMounts"] if m["name"] == "node-cache"]
    cache["mountPath"] = "/var/lib/multislice"
    assert gke_rules.pod_exec_refusals(pod) == [
        "container trainer executes the boot's MULTISLICE_HOME (uv, Python, virtualenvs) at /var/lib/multislice, on "
        "hostPath /var/lib/multislice/multislice-dev, which Container-Optimized OS mounts non-executable"
    ]
    # An executable node path (COS: /var/lib/toolbox is) or a command from it would pass or fail as COS has it.
    (volume,) = [v for v in pod["volumes"] if v["name"] == "node-cache"]
    volume["hostPath"]["path"] = "/var/lib/toolbox/multislice"
    assert gke_rules.pod_exec_refusals(pod) == []
    volume["hostPath"]["path"] = "/home/multislice"
    container["command"] = ["/var/lib/multislice/bin/bash"]
    assert len(gke_rules.pod_exec_refusals(pod)) == 2


@pytest.mark.parametrize("stack", ["tpu7x-16 on-demand", "tpu7x-16 flex-start", "v5p-16 spot"])
def test_a_second_update_of_an_unchanged_stack_replaces_no_pool(registered, stack):
    # GKE stored a policy-named TPU7x pool with no type for a third party (vllm-project/ci-infra PR 547); the
    # provider reads type back as stored, and any change of placement_policy replaces the pool (ForceNew).
    for pool in registered[stack]:
        stored = copy.deepcopy(pool.inputs)
        if stored["placementPolicy"].get("policyName"):
            stored["placementPolicy"]["type"] = ""
        assert gke_rules.replaced_on_update(stored, pool.inputs, pool.ignore_changes) == []
        # The check itself: without the option, the stored type would replace a TPU7x pool.
        if stack.startswith("tpu7x"):
            assert gke_rules.replaced_on_update(stored, pool.inputs, []) == ["placementPolicy"]
        else:
            assert pool.ignore_changes == []  # COMPACT + topology: GKE stores what it was sent

"""The nodes (slices) of a queued resource: what the provider reports about them, how one is
patched, and the in-place update of every node of a QR of up to 256 slices.

A multislice QR of N slices has N nodes, ``<prefix>-0 … <prefix>-(N-1)``
(https://cloud.google.com/tpu/docs/multislice-introduction; at most 256 slices). Reading them
is one ``ListNodes`` per page, not one ``GetNode`` each. Updating them (``UpdateNode``: metadata,
labels, tags; https://cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.nodes/patch)
runs at most :data:`DEFAULT_CONCURRENCY` requests at once (``MULTISLICE_TPU_CONCURRENCY``),
each retried with jittered exponential backoff on 429 and 5xx by ``google.api_core.retry``,
so a rate limit slows the update down instead of multiplying the requests. Progress is stated
as nodes finish; an update that cannot finish every node (retries exhausted, the deadline)
returns which nodes are done and which are not, and the next ``pulumi up`` converges the rest.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from infra.backends.queued_resource.provider.inputs import metadata_content
from infra.vm_contract import RUN_DIR_KEY, STARTUP_SCRIPT_KEY

#: Concurrent node requests (``MULTISLICE_TPU_CONCURRENCY`` overrides). Cloud TPU's request
#: quotas are per minute and per project (https://cloud.google.com/tpu/docs/quota); a few
#: requests in flight keep a 256-node update to minutes without bursting into them.
DEFAULT_CONCURRENCY = 8

#: Node states in which a slice is gone for good (a Spot VM cannot be restarted after a
#: preemption, only recreated: https://cloud.google.com/tpu/docs/spot).
LOST_NODE_STATES = ("PREEMPTED", "TERMINATED")

#: A message lists at most this many nodes one by one, then counts them by state.
LISTED_NODES = 8

#: Seconds between progress lines of a long update (besides every 10% of the nodes).
PROGRESS_EVERY_SECONDS = 30.0

#: Metadata a node may carry from the queued resource's creation-time spec and still run what
#: the stack records: at boot the release record in the bucket names the release and the run
#: directory, and a VM runs those instead of its embedded ones
#: (docs/vm-boot.md, "The release record"). A slice that Cloud TPU recreated (auto-repair)
#: carries the spec's values.
RECORD_SUPERSEDES = (STARTUP_SCRIPT_KEY, RUN_DIR_KEY)


def spec_nodes(qr: Any) -> list[tuple[str | None, Any]]:
    """``(node id, the tpu_v2.Node it is created from)`` for every node a live
    ``tpu_v2.QueuedResource`` lists, in order, from either shape of its ``tpu.nodeSpec``: one
    entry per node, each with its ``nodeId`` (how the service answers a read of a multislice
    QR: docs/cloud-tpu.md), or the single entry of the creation request, whose
    ``multisliceParams`` stand for ``nodeCount`` nodes ``<nodeIdPrefix or QR id>-<i>``. The id
    is None for an entry that names no node."""
    nodes: list[tuple[str | None, Any]] = []
    for spec in qr.tpu.node_spec:
        if "multislice_params" in spec:
            params = spec.multislice_params
            prefix = params.node_id_prefix or qr.name.rsplit("/", 1)[-1]
            nodes += [(f"{prefix}-{i}", spec.node) for i in range(params.node_count)]
        else:
            nodes.append((spec.node_id or None, spec.node))
    return nodes


def live_node_ids(qr: Any) -> list[str | None]:
    """The node ids a live QR lists (:func:`spec_nodes`)."""
    return [node_id for node_id, _node in spec_nodes(qr)]


def spec_metadata(qr: Any | None) -> dict[str, dict[str, str]]:
    """Node id → the metadata the QR ``qr`` creates (and recreates) that node with: its
    creation-time spec, which no API call changes (empty when ``qr`` is None)."""
    if qr is None:
        return {}
    return {node_id: dict(node.metadata) for node_id, node in spec_nodes(qr) if node_id}


def node_in_sync(node: Any, props: dict[str, Any], created_with: dict[str, str] | None = None) -> bool:
    """Whether a ``tpu_v2.Node`` carries the metadata, labels and tags of ``props`` (other
    metadata keys and labels, such as ``ssh-keys``, may be there too). The startup script
    counts as carried when it names the same release
    (:func:`~infra.backends.queued_resource.provider.inputs.metadata_content`).

    ``created_with``: the metadata of the QR's creation-time spec for this node
    (:func:`spec_metadata`). A :data:`RECORD_SUPERSEDES` key that still has that value counts as
    carried: the node was recreated from the spec (auto-repair) and its boot runs the release
    and run directory of the release record, which every ``pulumi up`` writes."""
    metadata = dict(node.metadata)
    labels = dict(node.labels)
    created_with = created_with or {}

    def carried(key: str, wanted: str) -> bool:
        live = metadata_content(key, metadata.get(key))
        if live == metadata_content(key, wanted):
            return True
        return key in RECORD_SUPERSEDES and key in created_with and live == metadata_content(key, created_with[key])

    return (
        all(carried(k, v) for k, v in (props.get("metadata") or {}).items())
        and all(labels.get(k) == v for k, v in (props.get("labels") or {}).items())
        and list(node.tags) == list(props.get("tags") or [])
    )


def _meaning(metadata: dict[str, str]) -> dict[str, Any]:
    return {k: metadata_content(k, v) for k, v in metadata.items()}


def node_patch(node: Any, olds: dict[str, Any], news: dict[str, Any]) -> tuple[Any, list[str]]:
    """The ``UpdateNode`` patch (a ``tpu_v2.Node``) and update mask that bring a live node from
    ``olds`` to ``news``; the mask is empty when the node is in sync.

    Metadata and labels are merged: keys others set (such as ``ssh-keys``) survive, keys that
    ``olds`` set and ``news`` drops are removed. Tags are replaced.
    """
    from google.cloud import tpu_v2

    patch, mask = tpu_v2.Node(name=node.name), []
    live_metadata = dict(node.metadata)
    wanted_metadata = {
        **{k: v for k, v in live_metadata.items() if k not in (olds.get("metadata") or {})},
        **(news.get("metadata") or {}),
    }
    if _meaning(wanted_metadata) != _meaning(live_metadata):  # not for a recompressed script alone
        patch.metadata = wanted_metadata
        mask.append("metadata")
    live_labels = dict(node.labels)
    wanted_labels = {
        **{k: v for k, v in live_labels.items() if k not in (olds.get("labels") or {})},
        **(news.get("labels") or {}),
    }
    if wanted_labels != live_labels:
        patch.labels = wanted_labels
        mask.append("labels")
    if list(node.tags) != list(news.get("tags") or []):
        patch.tags = list(news.get("tags") or [])
        mask.append("tags")
    return patch, mask


def node_view(
    node_id: str, node: Any | None, props: dict[str, Any], created_with: dict[str, str] | None = None
) -> dict[str, Any]:
    """The plain dict the provider reports for a node: name, state, health,
    healthDescription, ipAddresses, inSync (:func:`node_in_sync` with ``created_with``, the
    node's creation-time metadata) (state ``NOT_CREATED`` when it does not exist)."""
    if node is None:
        return {"name": node_id, "state": "NOT_CREATED", "health": "", "healthDescription": "", "inSync": False}
    return {
        "name": node_id,
        "state": node.state.name,
        "health": node.health.name,
        "healthDescription": node.health_description,
        "ipAddresses": [e.ip_address for e in node.network_endpoints],
        "inSync": node_in_sync(node, props, created_with),
    }


def lost_nodes(views: list[dict[str, Any]]) -> list[str]:
    """Names of the nodes that are gone (never created, deleted, preempted, terminated)."""
    return [v["name"] for v in views if v["state"] in ("NOT_CREATED", *LOST_NODE_STATES)]


def describe_nodes(views: list[dict[str, Any]]) -> list[str]:
    """Message lines about ``views``: one per node for a few, else counts per state plus the
    names of the unhealthy ones (a 256-slice QR must not print 256 lines)."""
    if len(views) <= LISTED_NODES:
        lines = []
        for view in views:
            health = f", health {view['health']}" if view["health"] else ""
            detail = f": {view['healthDescription']}" if view.get("healthDescription") else ""
            lines.append(f"  node {view['name']}: {view['state']}{health}{detail}")
        return lines
    counts = Counter(v["state"] for v in views)
    lines = [f"  nodes: {', '.join(f'{n} {state}' for state, n in counts.most_common())}"]
    odd = [v["name"] for v in views if v["state"] != "READY" or v["health"] not in ("", "HEALTHY")]
    if odd:
        shown = ", ".join(odd[:LISTED_NODES]) + (
            f" and {len(odd) - LISTED_NODES} more" if len(odd) > LISTED_NODES else ""
        )
        lines.append(f"  not READY/HEALTHY: {shown}")
    return lines


@dataclass
class NodeSync:
    """The outcome of :func:`update_nodes`.

    ``updated``: node ids updated now; ``in_sync``: already in sync (not called);
    ``failed``: node id → why it was not updated; ``missing``: nodes that do not exist;
    ``metadata_changed``: whether any updated node's metadata changed.
    """

    updated: list[str] = field(default_factory=list)
    in_sync: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)
    metadata_changed: bool = False

    @property
    def pending(self) -> list[str]:
        """Nodes still to converge (failed or missing), in node order."""
        return sorted([*self.failed, *self.missing], key=_node_order)

    @property
    def complete(self) -> bool:
        return not self.failed and not self.missing


def _node_order(node_id: str) -> tuple[int, str]:
    tail = node_id.rsplit("-", 1)[-1]
    return (int(tail), node_id) if tail.isdigit() else (-1, node_id)


def update_nodes(
    live: dict[str, Any],
    node_ids: list[str],
    olds: dict[str, Any],
    news: dict[str, Any],
    *,
    update: Callable[[Any, list[str]], None],
    concurrency: int,
    remaining: Callable[[], float],
    is_fatal: Callable[[BaseException], bool],
    describe: Callable[[BaseException], str],
    say: Callable[[str], None],
) -> NodeSync:
    """Bring every node of ``node_ids`` from ``olds`` to ``news``, ``concurrency`` at a time.

    Args:
      live: node id → its live ``tpu_v2.Node`` (absent: it does not exist).
      update: sends one ``UpdateNode`` (patch, mask) and waits for its operation; raises on
        failure (after its own retries).
      remaining: seconds left of the caller's deadline; no node is started after it passes.
      is_fatal: an error that every other node would get too (permission, quota, credentials):
        nothing more is started after it.
      describe: one line for an error.
      say: receives progress lines.
    """
    result = NodeSync(missing=[n for n in node_ids if n not in live])
    work = []
    for node_id in node_ids:
        if node_id not in live:
            continue
        patch, mask = node_patch(live[node_id], olds, news)
        if mask:
            work.append((node_id, patch, mask))
        else:
            result.in_sync.append(node_id)
    if not work:
        return result
    total, done, stop = len(work), 0, False
    step = max(1, total // 10)  # a progress line every 10% (and every PROGRESS_EVERY_SECONDS)
    next_report, last_report = step, time.monotonic()
    stopped_by = ""
    say(f"updating {total} node(s), at most {min(concurrency, total)} at a time")
    queue = list(reversed(work))
    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="update-node") as pool:
        running: dict[Future[None], tuple[str, list[str]]] = {}
        while queue or running:
            while queue and len(running) < concurrency and not stop:
                if remaining() <= 0:
                    stop, stopped_by = True, "the deadline passed first"
                    break
                node_id, patch, mask = queue.pop()
                running[pool.submit(update, patch, mask)] = (node_id, mask)
            if not running:
                break
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                node_id, mask = running.pop(future)
                error = future.exception()
                if error is None:
                    result.updated.append(node_id)
                    result.metadata_changed = result.metadata_changed or "metadata" in mask
                else:
                    result.failed[node_id] = describe(error)
                    if not stop and is_fatal(error):
                        stop, stopped_by = True, f"stopped after node {node_id}'s error, which every node would get"
                done += 1
            now = time.monotonic()
            if done >= next_report or done == total or now - last_report >= PROGRESS_EVERY_SECONDS:
                failed = f", {len(result.failed)} failed" if result.failed else ""
                say(f"updated {len(result.updated)}/{total} node(s){failed}")
                next_report, last_report = (done // step + 1) * step, now
    for node_id, _patch, _mask in queue:  # never started
        result.failed[node_id] = f"not started: {stopped_by}"
    return result

"""Node views and the concurrent node update (infra/backends/queued_resource/provider/nodes.py), on plain
``tpu_v2.Node`` messages and a stand-in ``update`` callable: concurrency, deadline and fatal
errors are checked exactly, without HTTP (the fake-backed runs are in
tests/backends/queued_resource/test_scale.py)."""

from __future__ import annotations

import re
import threading

from google.cloud import tpu_v2

from infra.backends.queued_resource.provider.nodes import describe_nodes, lost_nodes, node_view, update_nodes

OLDS = {"metadata": {"startup-script": "v1"}, "labels": {"managed-by": "pulumi"}, "tags": ["t"]}
NEWS = {"metadata": {"startup-script": "v2"}, "labels": {"managed-by": "pulumi"}, "tags": ["t"]}


def live_nodes(count: int, props=OLDS) -> dict[str, tpu_v2.Node]:
    return {
        f"n-{i}": tpu_v2.Node(
            name=f"projects/p/locations/z/nodes/n-{i}",
            state="READY",
            health="HEALTHY",
            metadata=dict(props["metadata"]),
            labels=dict(props["labels"]),
            tags=list(props["tags"]),
        )
        for i in range(count)
    }


class Recorder:
    """An ``update`` that records calls and the most running at once; fails the given nodes."""

    def __init__(self, fail: dict[str, Exception] | None = None) -> None:
        self.fail, self.calls, self.running, self.most = fail or {}, [], 0, 0
        self.lock = threading.Lock()
        self.release = threading.Event()

    def __call__(self, patch, mask) -> None:
        node_id = patch.name.rsplit("/", 1)[-1]
        with self.lock:
            self.calls.append((node_id, tuple(mask)))
            self.running += 1
            self.most = max(self.most, self.running)
        self.release.wait(0.002)  # overlap with the other workers
        with self.lock:
            self.running -= 1
        if node_id in self.fail:
            raise self.fail[node_id]


def run(live, ids, update, *, concurrency=4, remaining=lambda: 100.0, is_fatal=lambda e: False):
    lines: list[str] = []
    result = update_nodes(
        live,
        ids,
        OLDS,
        NEWS,
        update=update,
        concurrency=concurrency,
        remaining=remaining,
        is_fatal=is_fatal,
        describe=lambda e: f"{type(e).__name__}: {e}",
        say=lines.append,
    )
    return result, lines


def test_every_differing_node_is_updated_at_most_concurrency_at_a_time():
    live = live_nodes(40)
    live["n-3"].metadata["startup-script"] = "v2"  # already in sync: not called
    recorder = Recorder()
    result, lines = run(live, list(live) + ["n-99"], recorder, concurrency=4)
    assert sorted(result.updated) == sorted(set(live) - {"n-3"}) and result.in_sync == ["n-3"]
    assert result.missing == ["n-99"] and not result.complete and result.pending == ["n-99"]
    assert result.metadata_changed and all(mask == ("metadata",) for _n, mask in recorder.calls)
    assert len(recorder.calls) == 39 and 1 < recorder.most <= 4
    assert lines[0] == "updating 39 node(s), at most 4 at a time"
    assert lines[-1] == "updated 39/39 node(s)" and len(lines) >= 10


def test_a_failed_node_is_recorded_and_the_others_continue():
    recorder = Recorder(fail={"n-5": RuntimeError("500 backend error")})
    result, lines = run(live_nodes(12), [f"n-{i}" for i in range(12)], recorder)
    assert result.failed == {"n-5": "RuntimeError: 500 backend error"} and len(result.updated) == 11
    assert result.pending == ["n-5"] and "1 failed" in lines[-1]


def test_an_error_every_node_would_get_stops_starting_new_ones():
    denied = PermissionError("403 denied")
    recorder = Recorder(fail={f"n-{i}": denied for i in range(100)})
    result, _ = run(live_nodes(100), [f"n-{i}" for i in range(100)], recorder, concurrency=4, is_fatal=lambda e: True)
    assert len(recorder.calls) <= 4  # only what was already running
    assert len(result.failed) == 100 and not result.updated
    not_started = [why for why in result.failed.values() if why.startswith("not started")]
    assert len(not_started) == 100 - len(recorder.calls)
    assert len(set(not_started)) == 1
    assert re.fullmatch(r"not started: stopped after node n-[0-3]'s error, which every node would get", not_started[0])


def test_nothing_is_started_after_the_deadline():
    budget = iter([5.0, 5.0, 0.0])
    result, _ = run(
        live_nodes(10), [f"n-{i}" for i in range(10)], Recorder(), concurrency=1, remaining=lambda: next(budget, 0.0)
    )
    assert len(result.updated) == 2
    assert set(result.failed.values()) == {"not started: the deadline passed first"} and len(result.failed) == 8
    assert result.pending == [f"n-{i}" for i in range(2, 10)]  # in node order, not string order


def test_views_report_lost_nodes_and_messages_summarize_many():
    live = live_nodes(3, NEWS)
    live["n-1"].state = "PREEMPTED"
    views = [node_view(n, live.get(n), NEWS) for n in ["n-0", "n-1", "n-2", "n-3"]]
    assert [v["inSync"] for v in views] == [True, True, True, False]
    assert lost_nodes(views) == ["n-1", "n-3"]
    assert describe_nodes(views[:2]) == ["  node n-0: READY, health HEALTHY", "  node n-1: PREEMPTED, health HEALTHY"]
    many = [node_view(f"n-{i}", None if i >= 200 else live["n-0"], NEWS) for i in range(256)]
    lines = describe_nodes(many)
    assert lines[0] == "  nodes: 200 READY, 56 NOT_CREATED"
    assert lines[1] == "  not READY/HEALTHY: n-200, n-201, n-202, n-203, n-204, n-205, n-206, n-207 and 48 more"

"""Which slices are up (elastic slices): each trainer process's heartbeat in the run directory.

Every process of an elastic run (``min_slices`` set, more than one slice) writes
``<run>/membership/heartbeats/slice-<S>-worker-<W>.json`` every :func:`interval_s` seconds from a
thread of its own, from its start until it exits: its slice and worker, the slice's worker count,
its host (worker 0's is the coordinator's when its slice leads the job), the time, and the
membership epoch it is ready to train in (``ready``; None while it has not chosen one). A slice is
**healthy** when every one of its workers wrote within :func:`stale_after_s` (three intervals);
a slice whose VMs were preempted or deleted stops writing and turns stale within that bound, one
that is recreated and boots writes again. Nothing backend-specific: the bucket is what every
backend's VMs and Pods share (docs/faults.md, "Elastic slices").

The times are the writers' clocks; Compute Engine VMs (TPU VMs and GKE nodes among them) keep
theirs synchronized to Google's NTP service (https://cloud.google.com/compute/docs/instances/
configure-ntp), well inside an interval.

A heartbeat is checked, not believed (:func:`read_all`): at most :data:`MAX_BEAT_BYTES`, its slice and
worker the ones its name says and in the run's range, its worker count the run's, its host a host
name or address (the coordinator's address is built from it), its time finite and not ahead of the
reader's clock by more than one interval (a beat from the future would keep a lost slice "up"), its
``ready`` an epoch. One that fails is logged and left out: it says nothing about its slice.

Environment: ``MULTISLICE_ELASTIC_HEARTBEAT_S`` (default 10 s; the local emulation sets less).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import threading
import time
from typing import Any

from training.run_dir import RunDir
from training.run_objects import json_record
from training.warning_text import act, emit

log = logging.getLogger(__name__)

#: The heartbeats' folder in the run directory.
HEARTBEAT_DIR = "membership/heartbeats"
INTERVAL_ENV = "MULTISLICE_ELASTIC_HEARTBEAT_S"
DEFAULT_INTERVAL_S = 10.0
_NAME = re.compile(r"^membership/heartbeats/slice-(\d+)-worker-(\d+)\.json$")
#: Largest heartbeat read (bytes): one is about 120.
MAX_BEAT_BYTES = 4096
#: A host as a heartbeat may name it: a DNS name, an IPv4 or IPv6 address (RFC 1123 characters), or
#: none (a process whose host is not known keeps the coordinator address its VM was given).
_HOST = re.compile(r"^([A-Za-z0-9][A-Za-z0-9.:_-]{0,252})?$")


def interval_s() -> float:
    """Seconds between two heartbeats of one process (``MULTISLICE_ELASTIC_HEARTBEAT_S``, else 10)."""
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        value = DEFAULT_INTERVAL_S
    return value if 0 < value < 3600 else DEFAULT_INTERVAL_S


def stale_after_s() -> float:
    """Age (seconds) past which a heartbeat says its process is gone: three intervals."""
    return 3 * interval_s()


@dataclasses.dataclass(frozen=True)
class Beat:
    """One process's newest heartbeat.

    Attributes:
      slice_id, worker: the process's slice and worker, as its VM was allocated (not renumbered).
      workers: its slice's workers.
      host: its host (the coordinator's host when it is worker 0 of the job's first slice).
      time: when it was written (seconds since the epoch).
      ready: the membership epoch it is ready to train in, or None.
    """

    slice_id: int
    worker: int
    workers: int
    host: str
    time: float
    ready: int | None = None

    def to_json(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self), sort_keys=True) + "\n").encode()


def name(slice_id: int, worker: int) -> str:
    return f"{HEARTBEAT_DIR}/slice-{slice_id}-worker-{worker}.json"


def _count(value: Any, what: str, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < high:
        raise ValueError(f"{what} {str(value)[:40]} is not an integer in [0, {high})")
    return value


def _beat(record: Any, num_slices: int | None, workers_per_slice: int | None, now: float) -> Beat:
    """The heartbeat ``record`` holds, checked (the module docstring); a ValueError says why not."""
    workers = _count(record["workers"], "workers", 1 << 12)
    if workers_per_slice is not None and workers != workers_per_slice:
        raise ValueError(f"{workers} workers per slice, not the run's {workers_per_slice}")
    host, when, ready = record["host"], record["time"], record.get("ready")
    if not isinstance(host, str) or not _HOST.fullmatch(host):
        raise ValueError(f"host {str(host)[:40]!r} is not a host name or address")
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when) or when < 0:
        raise ValueError(f"time {str(when)[:40]} is not a time")
    if when > now + interval_s():
        raise ValueError(f"time {when} is ahead of this clock by more than {interval_s():g} s")
    return Beat(
        slice_id=_count(record["slice_id"], "slice", num_slices if num_slices is not None else 1 << 16),
        worker=_count(record["worker"], "worker", workers),
        workers=workers,
        host=host,
        time=float(when),
        ready=None if ready is None else _count(ready, "ready", 1 << 62),
    )


#: What to do about a heartbeat left out that keeps being left out.
_LEFT_OUT = "find why from the reason given (a slice counts as silent until its worker writes a valid heartbeat)"


def read_all(
    run_dir: RunDir, num_slices: int | None = None, workers_per_slice: int | None = None, now: float | None = None
) -> list[Beat]:
    """Every process's newest heartbeat (a fresh listing), each checked (the module docstring) against
    the run's ``num_slices`` and ``workers_per_slice`` where given and the clock ``now`` (default: this
    one); one that fails, or whose name and content disagree, is logged and left out."""
    now = time.time() if now is None else now
    beats = []
    for entry in run_dir.list(f"{HEARTBEAT_DIR}/*.json"):
        if not (match := _NAME.fullmatch(entry)):
            continue
        try:
            data = run_dir.read(entry)  # a local FIFO or device there: UnreadableObject, a ValueError
            if data is None:
                continue
            if len(data) > MAX_BEAT_BYTES:
                raise ValueError(f"{len(data):,} bytes, over {MAX_BEAT_BYTES:,}")
            beat = _beat(json_record(data), num_slices, workers_per_slice, now)
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            what = f"heartbeat {entry} is not one this trainer wrote ({err}); left out"
            emit(act(what, _LEFT_OUT, when="it repeats"), log.warning)
            continue
        if (beat.slice_id, beat.worker) != (int(match[1]), int(match[2])):
            what = f"heartbeat {entry} names slice {beat.slice_id} worker {beat.worker}; left out"
            emit(act(what, _LEFT_OUT, when="it repeats"), log.warning)
            continue
        beats.append(beat)
    return beats


def healthy(beats: list[Beat], now: float) -> dict[int, list[Beat]]:
    """The slices whose every worker wrote within :func:`stale_after_s` of ``now``: slice id → its
    workers' heartbeats, in worker order."""
    fresh: dict[int, dict[int, Beat]] = {}
    workers: dict[int, int] = {}
    for beat in beats:
        if now - beat.time <= stale_after_s():
            fresh.setdefault(beat.slice_id, {})[beat.worker] = beat
            workers[beat.slice_id] = beat.workers
    return {
        s: [by_worker[w] for w in range(workers[s])]
        for s, by_worker in fresh.items()
        if all(w in by_worker for w in range(workers[s]))
    }


def last_seen(beats: list[Beat]) -> dict[int, float]:
    """Each slice's newest heartbeat time (any worker's): the latest moment it is known up."""
    seen: dict[int, float] = {}
    for beat in beats:
        seen[beat.slice_id] = max(seen.get(beat.slice_id, 0.0), beat.time)
    return seen


class Heartbeat:
    """This process's heartbeat: :meth:`start` writes one at once and then every :func:`interval_s`
    from a daemon thread until :meth:`stop`; :attr:`ready` goes into the next one (and
    :meth:`beat` writes it at once). A write that fails is logged and tried again at the next
    interval: a storage hiccup must not end training."""

    def __init__(self, run_dir: RunDir, slice_id: int, worker: int, workers: int, host: str) -> None:
        self.run_dir = run_dir
        self.slice_id, self.worker, self.workers, self.host = slice_id, worker, workers, host
        self.ready: int | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """Write the heartbeat now."""
        beat = Beat(self.slice_id, self.worker, self.workers, self.host, time.time(), self.ready)
        with self._lock:
            try:
                self.run_dir.write(name(self.slice_id, self.worker), beat.to_json())
            except Exception as err:  # gcsfs raises its own and aiohttp's errors besides OSError
                what = f"heartbeat not written ({err}); training goes on and tries again in {interval_s():.0f} s"
                action = "check the run directory's storage from this VM (a slice whose heartbeats stop counts as lost)"
                emit(act(what, action, when="it repeats"), log.warning)

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(interval_s()):
            self.beat()

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

Environment: ``MULTISLICE_ELASTIC_HEARTBEAT_S`` (default 10 s; the local emulation sets less).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import threading
import time
from typing import Any

from training.run_dir import RunDir
from training.run_objects import json_record

log = logging.getLogger(__name__)

#: The heartbeats' folder in the run directory.
HEARTBEAT_DIR = "membership/heartbeats"
INTERVAL_ENV = "MULTISLICE_ELASTIC_HEARTBEAT_S"
DEFAULT_INTERVAL_S = 10.0
_NAME = re.compile(r"^membership/heartbeats/slice-(\d+)-worker-(\d+)\.json$")


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


def read_all(run_dir: RunDir) -> list[Beat]:
    """Every process's newest heartbeat (a fresh listing); one that does not parse, or whose name
    and content disagree, is logged and left out (it says nothing about the slice being up)."""
    beats = []
    for entry in run_dir.list(f"{HEARTBEAT_DIR}/*.json"):
        if not (match := _NAME.fullmatch(entry)):
            continue
        data = run_dir.read(entry)
        if data is None:
            continue
        try:
            record: Any = json_record(data)
            beat = Beat(
                slice_id=int(record["slice_id"]),
                worker=int(record["worker"]),
                workers=int(record["workers"]),
                host=str(record["host"]),
                time=float(record["time"]),
                ready=None if record.get("ready") is None else int(record["ready"]),
            )
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            log.warning("heartbeat %s is not one this trainer wrote (%r); left out", entry, err)
            continue
        if (beat.slice_id, beat.worker) != (int(match[1]), int(match[2])) or not 0 <= beat.worker < beat.workers:
            log.warning("heartbeat %s names slice %d worker %d; left out", entry, beat.slice_id, beat.worker)
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
                log.warning("heartbeat not written (%s); trying again in %.0f s", err, interval_s())

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

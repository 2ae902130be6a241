"""The objects of a run directory (``gs://<bucket>/runs/<run>/`` or a local path), read from their
bytes: the one place where what another process, another VM or an earlier run wrote there is
decoded. Each caller then checks the value against what its writer writes, beside its own type:

* membership records ``membership/<epoch>.json`` (:mod:`training.membership`);
* heartbeats ``heartbeats/slice-S-worker-W.json`` (:mod:`training.heartbeats`);
* the ``COMPLETE`` marker (:mod:`training.checkpoint.completion`, ``infra/status/progress.py``,
  :mod:`training.workload`);
* the run's recorded ``TrainConfig`` (:mod:`training.checkpoint.manager`);
* each line of the run's logs ``events/``, ``metrics/`` (:mod:`training.metrics.run_log`), the goodput
  report (``infra/status/progress.py``) and a dataset's manifest (:mod:`training.data.manifest`).

Bounds: an object of at most :data:`MAX_OBJECT_BYTES` (the largest, a manifest of many shards, is a
few MB), nesting no deeper than Python's parser takes (past it, a ``RecursionError`` would escape
every caller's ``except ValueError``), integers of at most 4,300 digits (Python's own limit).

The trainer ships to the VMs and imports nothing of ``infra/``; ``infra/`` reads these objects
through this module too (its own readers of outside bytes are ``infra/readers/``).
"""

from __future__ import annotations

import json
from typing import Any

#: The most bytes of one object decoded (see the module docstring).
MAX_OBJECT_BYTES = 64 << 20


def json_record(data: bytes, limit: int = MAX_OBJECT_BYTES) -> Any:
    """The JSON value of an object's ``data`` (UTF-8 JSON, as every writer of the run directory
    writes it).

    Raises:
      ValueError: over ``limit`` bytes, not UTF-8 (``UnicodeDecodeError``), not JSON
        (``json.JSONDecodeError``), nested deeper than the parser takes, or an integer past
        Python's digit limit.
    """
    if len(data) > limit:
        raise ValueError(f"{len(data):,} bytes, over the {limit:,} a run-directory object may have")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ValueError("JSON nested deeper than this reader takes") from None

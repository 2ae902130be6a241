"""The objects of a run directory (``gs://<bucket>/runs/<run>/`` or a local path), read from their
bytes: the one place where what another process, another VM or an earlier run wrote there is
decoded. Each caller then checks the value against what its writer writes, beside its own type:

* membership records ``membership/<epoch>.json`` (:mod:`training.membership`);
* heartbeats ``heartbeats/slice-S-worker-W.json`` (:mod:`training.heartbeats`);
* the ``COMPLETE`` marker (:mod:`training.checkpoint.completion`, ``infra/status/progress.py``,
  :mod:`training.workload`);
* the run's recorded ``TrainConfig`` (:mod:`training.checkpoint.manager`).

The trainer ships to the VMs and imports nothing of ``infra/``; ``infra/`` reads these objects
through this module too (its own readers of outside bytes are ``infra/readers/``).
"""

from __future__ import annotations

import json
from typing import Any


def json_record(data: bytes) -> Any:
    """The JSON value of an object's ``data`` (UTF-8 JSON, as every writer of the run directory
    writes it).

    Raises:
      ValueError: not UTF-8 (``UnicodeDecodeError``) or not JSON (``json.JSONDecodeError``), or
        an integer past Python's digit limit.
    """
    return json.loads(data.decode("utf-8"))

"""The emulator's kit: all that a backend's emulation half may take from :mod:`infra.emulated`.

A backend emulates its platform (``infra/backends/<name>/emulation.py``, ``emulated_api.py``,
``emulated_reset.py``) with these and nothing else of the emulated platform, so that a change
inside it breaks a backend only through a name listed here (``tests/test_import_graph.py`` fails
on a backend that imports any other module of ``infra/emulated/``):

* :class:`LocalPaths`: where a stack's local run keeps its state (its VMs' disks and logs, the
  emulator's state file, the record of a deleted queued resource);
* :func:`record_deletion` and :func:`forget_deletion`: that record, as the emulated API writes it
  when worker 0 of slice 0 deletes the queued resource once the run is complete;
* :class:`LoopbackServer`: the HTTP server on 127.0.0.1 an emulated Google API runs on;
* :mod:`api_traffic`: each request an emulated API serves is vetted (``api_traffic.vet``) and each
  exchange recorded (``api_traffic.record``, ``api_traffic.Exchange``, ``api_traffic.parse_json``);
* :data:`EMULATED_TOKEN`: the access token every emulated VM's metadata server hands out, which the
  emulated APIs accept;
* :class:`EmulatedVM`: one emulated TPU VM (or GKE Pod), as the emulator started it;
* :func:`stop_groups`: stop supervised process groups (SIGTERM, then SIGKILL after a grace).
"""

from __future__ import annotations

from infra.emulated import api_traffic
from infra.emulated.loopback_http import LoopbackServer
from infra.emulated.metadata import EMULATED_TOKEN
from infra.emulated.state import LocalPaths, forget_deletion, record_deletion
from infra.emulated.supervisor import stop_groups
from infra.emulated.vm import EmulatedVM

__all__ = [
    "EMULATED_TOKEN",
    "EmulatedVM",
    "LocalPaths",
    "LoopbackServer",
    "api_traffic",
    "forget_deletion",
    "record_deletion",
    "stop_groups",
]

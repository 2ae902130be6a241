"""``orbax.checkpoint`` (as ``ocp``), imported without the Cloud Logging client it would load
for nothing.

``orbax.checkpoint.logging`` imports ``google.cloud.logging`` only for its optional
``CloudLogger``, inside ``try: ... except ImportError: pass``
(orbax/checkpoint/logging/__init__.py, orbax-checkpoint as pinned in uv.lock). That package is
installed on every VM for the log shipper (training/log_shipping.py, a process of its own), so
every trainer start paid for loading it, a quarter of the trainer's imports (measured:
docs/goodput.md, "Start-up"). The trainer never uses ``CloudLogger``:
while orbax is imported, the module is hidden (a ``None`` in ``sys.modules`` makes its import
raise ImportError: https://docs.python.org/3/reference/import.html#the-module-cache), and
afterwards importing it works as before.
"""

from __future__ import annotations

import sys

_HIDDEN = "google.cloud.logging"
if "orbax.checkpoint" not in sys.modules and _HIDDEN not in sys.modules:
    sys.modules[_HIDDEN] = None  # pyright: ignore[reportArgumentType]
    try:
        import orbax.checkpoint as ocp
    finally:
        del sys.modules[_HIDDEN]
else:
    import orbax.checkpoint as ocp

__all__ = ["ocp"]

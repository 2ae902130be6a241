"""The emulated platform: the parts ``multislice local up`` builds a stack's emulation from.

An emulated TPU VM (:mod:`.vm`: a process session led by its emulated systemd, :mod:`.systemd`,
with its unit manager, lifeline and stop signals), its metadata server (:mod:`.metadata`), the
loopback HTTP servers the emulated Google APIs run on (:mod:`.loopback_http`) and the record of
what they exchange (:mod:`.api_traffic`), the emulated Cloud Storage (:mod:`.gcs`), the process
groups the emulator supervises (:mod:`.supervisor`), free ports (:mod:`.ports`) and where a
stack's local run keeps its state (:mod:`.state`).

This floor stands below the backends: it imports no backend, no driver of ``infra/local/`` and no
operator command. A backend's emulation half takes what it needs through one face,
:mod:`infra.emulated.kit`, and from no other module here (``tests/test_import_graph.py``). The
emulator's driver, ``infra/local/``, stands above the backends and puts these parts together.
"""

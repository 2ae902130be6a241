"""Commands on the TPU VMs of a stack, and resets of its queued resource.

* :mod:`infra.remote.selection`: which workers (``--slice``, ``--worker``), checked against the
  stack; :class:`~infra.remote.selection.RemoteError`, the one-line refusal;
* :mod:`infra.remote.command`: the shell line a worker runs, and ``--background``'s wrapping;
* :mod:`infra.remote.fanout`: every worker's process at once, lines prefixed, logs kept;
* :mod:`infra.remote.gcloud`: gcloud, OpenSSH's tools and gcloud's SSH key made once, whatever the
  backend;
* :mod:`infra.remote.emulated`: the emulated VMs of a running ``multislice local up``.

Each backend's own transport and reset live with it (:meth:`infra.backends.interface.Backend.exec_plan`,
``reset``): ``gcloud … tpu-vm ssh`` and ResetQueuedResource in :mod:`infra.backends.queued_resource`,
``gcloud compute ssh`` to each slice's instance group and the refusal of a reset in
:mod:`infra.backends.compute_engine`.

docs/exec-and-reset.md says how they are used and what each relies on.
"""

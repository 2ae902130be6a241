"""Commands on the TPU VMs of a stack, and resets of its queued resource.

* :mod:`infra.remote.selection`: which workers (``--slice``, ``--worker``), checked against the
  stack; :class:`~infra.remote.selection.RemoteError`, the one-line refusal;
* :mod:`infra.remote.command`: the shell line a worker runs, and ``--background``'s wrapping;
* :mod:`infra.remote.fanout`: every worker's process at once, lines prefixed, logs kept;
* :mod:`infra.remote.gcloud`: Cloud TPU workers through ``gcloud … tpu-vm ssh`` over IAP (the SSH
  key made once, one worker per node first, a command never run twice);
* :mod:`infra.remote.instance_groups` / :mod:`infra.remote.compute_ssh`: the compute-engine
  backend's VMs (each slice's managed instance group listed) through ``gcloud compute ssh``
  over IAP, and its refusal of ``reset``;
* :mod:`infra.remote.emulated`: the emulated VMs of a running ``multislice local up``;
* :mod:`infra.remote.reset` / :mod:`infra.remote.emulated_reset`: ResetQueuedResource, waited for.

docs/exec-and-reset.md says how they are used and what each relies on.
"""

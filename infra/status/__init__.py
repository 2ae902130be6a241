"""``multislice status``: where a stack's run stands, for a deployed stack and for the local
emulation alike.

One concern per module:

* :mod:`~infra.status.store`: the run directory's objects through the Cloud Storage JSON API
  (gcsfs): listings with update times, and concurrent reads of the few objects needed;
* :mod:`~infra.status.progress`: the run's progress from its newest records (step, loss,
  tokens/s, ETA, checkpoints, restarts and preemptions, goodput, COMPLETE);
* :mod:`~infra.status.capacity`: the queued resource and its slices: the Cloud TPU API
  (``tpu_v2``) for a deployed stack, the emulator's state file for a local one;
* :mod:`~infra.status.reader`: both read together, from the cloud or from a local emulation
  (credentials checked first), a fresh status per call;
* :mod:`~infra.status.report`: both together, as stable JSON and as a rich table (times of
  day: :mod:`~infra.clock`);
* :mod:`~infra.status.plot`: loss and tokens/s against step with the run's events marked
  (matplotlib, imported only for ``--plot``).

Nothing here imports jax, orbax or pulumi: the command answers in about a second.
"""

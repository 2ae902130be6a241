"""Checkpoints of the train state: the Orbax manager, save policy, run config and completion
marker (:mod:`training.checkpoint.manager`); restore agreement among the job's processes
(:mod:`~training.checkpoint.restore`); the checks a restored state must pass
(:mod:`~training.checkpoint.integrity`); the fall-back from a restored checkpoint the training
cannot continue from (:mod:`~training.checkpoint.fallback`); how messages name a checkpoint
(:mod:`~training.checkpoint.messages`); and Orbax's import (:mod:`~training.checkpoint.orbax_import`)."""

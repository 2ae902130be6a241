"""Checkpoints of the train state: the Orbax manager, save policy and run config
(:mod:`training.checkpoint.manager`); the run's completion marker, read without jax or orbax
(:mod:`~training.checkpoint.completion`); restore agreement among the job's processes
(:mod:`~training.checkpoint.restore`); the checks a restored state must pass
(:mod:`~training.checkpoint.integrity`); the fall-back from a restored checkpoint the training
cannot continue from (:mod:`~training.checkpoint.fallback`); how messages name a checkpoint
(:mod:`~training.checkpoint.messages`); and Orbax's import (:mod:`~training.checkpoint.orbax_import`)."""

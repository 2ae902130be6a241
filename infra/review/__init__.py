"""Reviewing a stack without the Pulumi engine or credentials (``multislice check``, ``diff``).

* :mod:`~infra.review.program_mocks`: the Pulumi program evaluated under Pulumi's mocks, the way
  the tests evaluate it; what ``check`` runs the policy pack over.
* :mod:`~infra.review.revision_diff`: two revisions of a stack evaluated and compared: changed
  stack keys, the trainer bundle's files, and each resource's create/replace/update (the queued
  resource classified by its own provider's diff).
"""

"""The CrossGuard policy pack (``pulumi preview --policy-pack infra/policy``) and its policies.

:mod:`infra.policy.policies` holds the policies (``POLICIES``); ``__main__.py`` builds the
``PolicyPack`` the Pulumi CLI runs; :mod:`infra.policy.evaluate` runs the same policies over a
stack's resources without the CLI (``multislice check``).
"""

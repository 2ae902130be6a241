"""The policy pack the Pulumi CLI runs: ``pulumi preview --policy-pack infra/policy``.

Only builds the ``PolicyPack`` from :data:`infra.policy.policies.POLICIES`. The CLI starts this
file from ``infra/policy/``; the project root goes on ``sys.path`` so ``infra`` imports.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pulumi_policy import EnforcementLevel, PolicyPack  # noqa: E402

from infra.policy.policies import POLICIES  # noqa: E402

PolicyPack(name="multislice", policies=POLICIES, enforcement_level=EnforcementLevel.ADVISORY)

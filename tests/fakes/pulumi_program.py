"""The program evaluation under mocks now lives in :mod:`infra.review.program_mocks` (``multislice
check`` and ``multislice diff`` use it too); this name stays for the tests. It is the same
module object, so ``monkeypatch.setattr(pulumi_program, ...)`` patches what ``evaluate`` uses."""

import sys

from infra.review import program_mocks

sys.modules[__name__] = program_mocks

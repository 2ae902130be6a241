"""Hypothesis's profiles for the tests that generate inputs (as tests/readers/test_fuzz.py sets
them): ``suite``, derandomized (the same examples on every run) and few enough for the suite's
budget, and ``long`` (``HYPOTHESIS_PROFILE=long``) for benchmarks and local hunts."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings


def load_profile() -> None:
    """Register both profiles and load the one ``HYPOTHESIS_PROFILE`` names (``suite`` by default)."""
    settings.register_profile(
        "suite",
        max_examples=60,
        derandomize=True,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    settings.register_profile("long", max_examples=2000, deadline=None, suppress_health_check=list(HealthCheck))
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

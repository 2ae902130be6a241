"""training.bench.reference and .shardings: when the before/after reference matmuls disagree, or the efficiency exceeds
1, the result and the summary say the efficiency is too noisy to trust. Synthetic
timings only: nothing here times anything."""

from __future__ import annotations

import pytest

from training.bench import reference as reference_matmul, shardings as bench
from training.bench.spec import spec_from_options

TINY = {"batch_size": 16, "embedding_dimension": 64, "layers": 2, "steps": 2, "warmup": 1}


def reference(seconds: float, shape: list[int]) -> dict:
    """A :func:`training.bench.reference.matmul_reference` result whose every sample took ``seconds``."""
    rows, k, n = shape
    return {
        "flops_per_second": 2.0 * rows * k * n / seconds,
        "seconds": seconds,
        "times": [seconds] * 4,
        "shape": shape,
    }


def result_for(before_s: float, after_s: float, step_s: float) -> dict:
    """:func:`training.bench.shardings.figures` on synthetic timings: reference matmuls of ``before_s``
    and ``after_s`` seconds each, a benchmark step of ``step_s`` seconds, 8 CPU devices."""
    spec = spec_from_options(ici_fsdp=8, **TINY)
    shape = [spec.global_batch, spec.embedding_dimension, spec.ff_width]
    measured = {"flops_per_second": spec.flops_per_step / step_s, "step_seconds": step_s, "step_times": [step_s] * 2}
    return bench.figures(
        spec,
        measured,
        [reference(before_s, shape), reference(after_s, shape)],
        platform="cpu",
        dtype="float32",
        processes=1,
        emulated=False,
    )


def test_agreeing_references_and_efficiency_below_1_are_trusted():
    check = reference_matmul.reference_check([100.0, 120.0], 0.8)
    assert check == {"spread": pytest.approx(1.2), "trusted": True, "warnings": []}


def test_a_spread_above_the_limit_is_reported_and_not_trusted():
    check = reference_matmul.reference_check([50.0, 100.0], 0.7)
    assert check["spread"] == pytest.approx(2.0) and not check["trusted"]
    (warning,) = check["warnings"]
    assert "differ 2.00× (more than 1.5×)" in warning and "too noisy to trust" in warning


def test_the_limit_is_the_stated_factor():
    assert reference_matmul.REFERENCE_SPREAD_LIMIT == 1.5
    assert reference_matmul.reference_check([100.0, 150.0], 0.5)["trusted"]  # exactly 1.5×: trusted
    assert not reference_matmul.reference_check([100.0, 151.0], 0.5)["trusted"]
    assert reference_matmul.reference_check([100.0, 190.0], 0.5, limit=2.0)["trusted"]


def test_an_efficiency_above_1_is_never_trusted_even_with_agreeing_references():
    check = reference_matmul.reference_check([100.0, 101.0], 1.2)
    assert not check["trusted"]
    (warning,) = check["warnings"]
    assert "efficiency 1.200 is above 1" in warning and "too noisy to trust" in warning


def test_bad_rates_raise():
    for rates in ([], [0.0, 1.0], [-1.0, 2.0]):
        with pytest.raises(ValueError, match="positive"):
            reference_matmul.reference_check(rates, 0.5)


def test_figures_carry_the_spread_and_the_warnings():
    """The issue's case: references 2× apart (0.1 s before, 0.2 s after) and an efficiency
    above 1; the median of the pooled samples is their midpoint, 0.15 s."""
    spec = spec_from_options(ici_fsdp=8, **TINY)
    rows, k, n = spec.global_batch, spec.embedding_dimension, spec.ff_width
    matmul_rate = 2.0 * rows * k * n / 0.15
    step_s = spec.flops_per_step / (1.3 * matmul_rate)  # efficiency 1.3
    result = result_for(0.1, 0.2, step_s)
    assert result["efficiency"] == pytest.approx(1.3)
    assert result["reference"]["spread"] == pytest.approx(2.0)
    assert result["efficiency_trusted"] is False
    assert len(result["warnings"]) == 2
    text = bench.summary(result)
    assert "efficiency: 1.300 (reference spread before/after 2.00×, trusted up to 1.5×)" in text
    assert sum(line.startswith("warning: ") and "too noisy to trust" in line for line in text.splitlines()) == 2


def test_a_trusted_result_prints_no_warning():
    spec = spec_from_options(ici_fsdp=8, **TINY)
    rows, k, n = spec.global_batch, spec.embedding_dimension, spec.ff_width
    step_s = spec.flops_per_step / (0.6 * 2.0 * rows * k * n / 0.11)  # efficiency 0.6 of the 0.11 s median
    result = result_for(0.1, 0.12, step_s)
    assert result["efficiency"] == pytest.approx(0.6) and result["efficiency_trusted"] is True
    assert result["warnings"] == [] and "warning" not in bench.summary(result)


@pytest.mark.parametrize("before_s", [0.1, 0.13, 0.2])
@pytest.mark.parametrize("efficiency", [0.5, 0.99, 1.01, 2.0])
def test_an_efficiency_above_1_is_never_printed_without_the_warning(before_s, efficiency):
    spec = spec_from_options(ici_fsdp=8, **TINY)
    rows, k, n = spec.global_batch, spec.embedding_dimension, spec.ff_width
    median = (before_s + 0.1) / 2
    step_s = spec.flops_per_step / (efficiency * 2.0 * rows * k * n / median)
    result = result_for(before_s, 0.1, step_s)
    text = bench.summary(result)
    noisy = result["efficiency"] > 1 or before_s / 0.1 > 1.5
    assert ("too noisy to trust" in text) is noisy
    assert result["efficiency_trusted"] is not noisy

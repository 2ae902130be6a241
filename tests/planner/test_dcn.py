"""infra.planner.dcn: the Multislice overview's DCN arithmetic on hand-computed examples."""

from __future__ import annotations

import pytest

from infra import accelerators, planner
from infra.config import StackConfigError, validate_stack
from tests.planner.stacks import stack
from training.config import ParallelismConfig


def test_v4_hardware_arithmetic_intensity_is_the_overviews_22000():
    for name in ("v4-8", "v4-16", "v4-32", "v4-4096"):
        acc = accelerators.parse_accelerator_type(name)
        assert planner.hardware_arithmetic_intensity(acc) == pytest.approx(4 * 275e12 / 50e9) == pytest.approx(22_000)


@pytest.mark.parametrize("name", ["v5litepod-8", "v5litepod-16", "v5p-8", "v6e-4", "v6e-16", "v6e-256"])
def test_arithmetic_intensity_uses_the_vm_share_of_the_host_dcn(name):
    """v5e/v6e: a multi-host VM has 4 of the physical host's 8 chips and half its DCN."""
    acc = accelerators.parse_accelerator_type(name)
    expected = acc.chips_per_host * acc.generation.peak_bf16_flops_per_chip / acc.dcn_bits_per_second_per_host
    assert planner.hardware_arithmetic_intensity(acc) == pytest.approx(expected)
    assert planner.hardware_arithmetic_intensity(acc) == pytest.approx(acc.generation.flops_per_dcn_bit)


def test_overview_minimum_batches():
    assert planner.dcn_bits_per_parameter(2) == 32
    assert planner.dcn_bits_per_parameter(3) == planner.dcn_bits_per_parameter(256) == 64
    assert planner.min_tokens_per_replica(22_000, 2) == pytest.approx(176_000)
    assert planner.min_tokens_per_replica(22_000, 4) == pytest.approx(352_000)
    assert planner.operational_intensity(176_000, 2) == pytest.approx(22_000)
    assert planner.operational_intensity(352_000, 3) == pytest.approx(22_000)
    # The overview's margin: ~350,000 (two pods) to ~700,000 (many pods).
    assert planner.SAFETY_MARGIN * planner.min_tokens_per_replica(22_000, 2) == pytest.approx(352_000)
    assert planner.SAFETY_MARGIN * planner.min_tokens_per_replica(22_000, 8) == pytest.approx(704_000)


@pytest.mark.parametrize(
    ("slices", "batch", "tokens", "oi", "bound", "margin"),
    [
        # 2 × v4-8, seq 1024, B = batch × 1024 / 2 tokens per pod; minimum 176,000.
        (2, 288, 147_456, 4 * 147_456 / 32, True, False),
        (2, 352, 180_224, 4 * 180_224 / 32, False, False),
        (2, 704, 360_448, 4 * 360_448 / 32, False, True),
        # 4 × v4-8, B = batch × 1024 / 4; minimum 352,000 (64 bits per parameter).
        (4, 1360, 348_160, 4 * 348_160 / 64, True, False),
        (4, 1392, 356_352, 4 * 356_352 / 64, False, False),
        (4, 2752, 704_512, 4 * 704_512 / 64, False, True),
    ],
)
def test_dcn_verdict_on_both_sides_of_the_overview_thresholds(slices, batch, tokens, oi, bound, margin):
    p = planner.plan(stack(slices=slices, training={"global_batch_size": batch}))
    assert p.dcn.replicas == slices
    assert p.dcn.tokens_per_replica == tokens
    assert p.dcn.arithmetic_intensity == pytest.approx(22_000)
    assert p.dcn.operational_intensity == pytest.approx(oi)
    assert p.dcn.min_tokens_per_replica == pytest.approx(176_000 if slices == 2 else 352_000)
    assert p.dcn.min_global_batch_tokens == pytest.approx(slices * (176_000 if slices == 2 else 352_000))
    assert p.dcn.recommended_global_batch_tokens == pytest.approx(2 * slices * (176_000 if slices == 2 else 352_000))
    assert p.dcn.dcn_bound is bound
    assert p.dcn.meets_margin is margin
    assert p.global_batch_tokens == batch * 1024


def test_b_is_tokens_per_pod_not_the_global_batch():
    """200,000 tokens per step over 2 pods is 100,000 per pod: DCN-bound."""
    p = planner.plan(stack(slices=2, training={"sequence_length": 1000, "global_batch_size": 200}))
    assert p.global_batch_tokens == 200_000
    assert p.dcn.tokens_per_replica == 100_000
    assert p.dcn.dcn_bound


def test_replicas_are_dcn_data_not_slices():
    """4 slices as 2 DCN data replicas × 2 FSDP slices: the all-reduce is between 2 groups."""
    p = planner.plan(
        stack(
            slices=4,
            training={"global_batch_size": 400, "parallelism": {"ici": {"fsdp": 4}, "dcn": {"data": 2, "fsdp": 2}}},
        )
    )
    assert p.dcn.replicas == 2 and p.dcn.bits_per_parameter == 32
    assert p.dcn.tokens_per_replica == 400 * 1024 / 2
    assert any("pure data parallelism over DCN" in r for r in p.recommendations)


def test_single_slice_has_no_dcn_all_reduce():
    p = planner.plan(stack(slices=1))
    assert p.dcn.replicas == 1 and not p.dcn.applies
    assert p.dcn.operational_intensity is None and p.dcn.min_tokens_per_replica is None
    assert p.dcn.min_global_batch_tokens is None and p.dcn.recommended_global_batch_tokens is None
    assert p.dcn.dcn_bound is False
    assert p.dcn.arithmetic_intensity == pytest.approx(22_000)


def test_dcn_check_carries_the_catalog_figures_and_the_margin():
    """v5p-16 (4 chips per VM) with dcn {data: 3}: 64 bits per parameter, figures from the catalog."""
    acc = accelerators.parse_accelerator_type("v5p-16")
    par = ParallelismConfig.model_validate({"ici": {"fsdp": acc.chips}, "dcn": {"data": 3}})
    check = planner.dcn_check(acc, par, 3 * 500_000)
    gen = acc.generation
    assert (check.chips_per_host, check.peak_flops_per_chip, check.dcn_bits_per_second_per_host) == (
        acc.chips_per_host,
        gen.peak_bf16_flops_per_chip,
        acc.dcn_bits_per_second_per_host,
    )
    assert check.dcn_fsdp == 1 and check.bits_per_parameter == 64
    assert check.tokens_per_replica == 500_000
    assert check.min_tokens_per_replica == pytest.approx(check.arithmetic_intensity * 64 / 4)
    assert check.safety_margin == planner.SAFETY_MARGIN == 2.0
    assert check.recommended_tokens_per_replica == pytest.approx(2.0 * check.min_tokens_per_replica)
    assert check.meets_margin is (500_000 >= check.recommended_tokens_per_replica)
    # The global figures are the per-replica ones over the 3 replicas: comparable with the global batch.
    assert check.min_global_batch_tokens == pytest.approx(3 * check.arithmetic_intensity * 64 / 4)
    assert check.recommended_global_batch_tokens == pytest.approx(3 * 2.0 * check.arithmetic_intensity * 64 / 4)


def test_bad_arguments_raise_value_errors():
    acc = accelerators.parse_accelerator_type("v4-8")
    for call in (
        lambda: planner.dcn_bits_per_parameter(1),
        lambda: planner.dcn_bits_per_parameter(0),
        lambda: planner.operational_intensity(0, 2),
        lambda: planner.operational_intensity(-5, 2),
        lambda: planner.min_tokens_per_replica(0, 2),
        lambda: planner.dcn_check(acc, ParallelismConfig(), 0),
    ):
        with pytest.raises(ValueError):
            call()


def test_the_planner_only_sees_validated_meshes():
    """``plan`` takes a StackConfig: a slice count or mesh that does not match the accelerator
    never reaches it; the stack is refused with the key named."""
    base = {"gcp:project": "acme-ml-test", "gcp:zone": "us-central2-b", "multislice:acceleratorType": "v4-16"}
    cases = [
        ({"multislice:slices": 0}, r"multislice:slices"),
        (
            {"multislice:training": {"parallelism": {"ici": {"fsdp": 4}}}},
            r"parallelism.ici: .* = 4 must equal the chips per slice of v4-16: 8",
        ),
        (
            {"multislice:slices": 2, "multislice:training": {"parallelism": {"ici": {"fsdp": 8}}}},
            r"parallelism.dcn: .* = 1 must equal multislice:slices: 2",
        ),
    ]
    for keys, message in cases:
        with pytest.raises(StackConfigError, match=message):
            planner.plan(validate_stack("t", base | keys, "test"))

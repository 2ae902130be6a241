"""infra.planner.advice: recommendations from the Multislice overview's parallelism guidance,
and the preview advisories (also as the Pulumi program logs them)."""

from __future__ import annotations

import pytest

from infra import planner
from infra.config import load_stack
from tests.planner.stacks import STACKS, stack


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


BIG_MODEL = {"model": {"d_model": 1024, "n_layers": 24, "n_heads": 16}, "sequence_length": 4096}


def test_over_hbm_is_flagged_with_advice():
    config = stack("v4-8", slices=2, training=BIG_MODEL | {"global_batch_size": 64})
    p = planner.plan(config)
    assert not p.memory.fits and p.memory.total > p.memory.capacity
    assert p.recommendations[0].startswith("over HBM")
    assert any("over HBM" in line for line in planner.advisories(config))


def test_over_hbm_advice_prices_fsdp_over_dcn_with_the_stack_it_would_be():
    """The memory advice names the first DCN FSDP split that fits, with its estimate: the
    same figure as the plan of that stack written out. (~9.7e9 parameters: 16 bytes each
    over 4 chips exceed 32 GiB, over 8 chips they fit.)"""
    training = {
        "model": {"d_model": 4096, "n_layers": 48, "n_heads": 32},
        "sequence_length": 128,
        "global_batch_size": 16,
    }
    p = planner.plan(
        stack("v4-8", slices=4, training=training | {"parallelism": {"ici": {"fsdp": 4}, "dcn": {"data": 4}}})
    )
    assert not p.memory.fits
    split = planner.plan(
        stack(
            "v4-8", slices=4, training=training | {"parallelism": {"ici": {"fsdp": 4}, "dcn": {"data": 2, "fsdp": 2}}}
        )
    )
    assert split.memory.fits
    assert p.recommendations[0].startswith("over HBM")
    assert f"dcn {{data: 2, fsdp: 2}} → {gib(split.memory.total)}" in p.recommendations[0]


def test_fsdp_over_dcn_advice_prices_pure_data_parallelism():
    config = stack(
        slices=4,
        training={"global_batch_size": 400, "parallelism": {"ici": {"fsdp": 4}, "dcn": {"data": 2, "fsdp": 2}}},
    )
    pure = planner.plan(stack(slices=4, training={"global_batch_size": 400}))  # dcn {data: 4}
    (line,) = [r for r in planner.plan(config).recommendations if "pure data parallelism over DCN" in r]
    assert f"dcn {{data: 4, fsdp: 1}} fits ({gib(pure.memory.total)} per chip)" in line


def test_ici_data_parallelism_gets_the_fsdp_advice():
    p = planner.plan(stack(slices=1, training={"global_batch_size": 8, "parallelism": {"ici": {"data": 2, "fsdp": 2}}}))
    assert any("prefer FSDP" in r and "fsdp: 4" in r for r in p.recommendations)


def test_dcn_bound_recommendation_gives_the_batch_and_pipeline_fallback():
    p = planner.plan(stack(slices=4, training={"global_batch_size": 16}))
    text = " ".join(p.recommendations)
    assert "raise global_batch_size to ≥ 1376 sequences" in text  # 4 × 352,000 / 1024 → multiple of 16
    per_replica = 4 * 275e12 / 50e9 * 64 / 4  # 4 replicas: 64 bits per parameter
    assert f"({4 * per_replica:,.0f} tokens global = {per_replica:,.0f} per replica × 4 replicas)" in text
    assert f"({8 * per_replica:,.0f} tokens global) with the Multislice overview's 2× margin" in text
    assert "pipeline parallelism" in text


@pytest.mark.parametrize(
    ("batch", "verdict"),
    [
        (352, "compute-bound but below the Multislice overview's 2× margin"),
        (704, "compute-bound with the Multislice overview's margin"),
    ],
)
def test_compute_bound_stacks_get_the_margin_verdict(batch, verdict):
    p = planner.plan(stack(slices=2, training={"global_batch_size": batch}))
    assert sum(verdict in r for r in p.recommendations) == 1
    assert not any(r.startswith("DCN-bound") for r in p.recommendations)


def test_compute_bound_stack_that_fits_has_no_advisory():
    config = stack(slices=2, training={"global_batch_size": 704})
    assert planner.plan(config).dcn.meets_margin
    assert planner.advisories(config) == []


def test_dcn_bound_advisory_names_the_figures():
    (line,) = planner.advisories(stack(slices=2, training={"global_batch_size": 16}))
    assert (
        "DCN-bound" in line and "176,000 per replica needed" in line and "22,000" in line and "multislice plan" in line
    )
    assert line.startswith("stack t: ") and line.endswith(
        "; no action needed: it trains as declared, with DCN bounding its step time; `multislice plan --stack t` "
        "says the multislice:training.global_batch_size that lifts the bound"
    )


# --- the Pulumi program's preview advisory ---------------------------------------------------


def program_warnings(monkeypatch, config_map=None) -> list[str]:
    import pulumi

    from tests.fakes.pulumi_program import evaluate

    warnings: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: warnings.append(message))
    evaluate("dev", config_map, preview=True)
    return warnings


def test_pulumi_preview_warns_when_dcn_bound(monkeypatch):
    warnings = program_warnings(monkeypatch)
    assert [w for w in warnings if "predicted DCN-bound" in w] == planner.advisories(load_stack("dev", STACKS))


def test_pulumi_preview_is_quiet_for_a_compute_bound_stack(monkeypatch):
    from tests.fakes.pulumi_program import stack_map

    config_map = stack_map("dev")
    config_map["multislice:training"] = dict(config_map["multislice:training"], global_batch_size=5504)
    warnings = program_warnings(monkeypatch, config_map)
    assert not [w for w in warnings if "predicted" in w]

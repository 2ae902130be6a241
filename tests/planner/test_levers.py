"""infra.planner.levers: the microbatch count and remat policy that bring the DCN minimum
batch within HBM, in the plan's recommendations and the preview advisory."""

from __future__ import annotations

import json

import pytest

from infra import planner
from infra.planner import levers
from infra.planner.memory import HBM_TIGHT_FRACTION
from tests.planner.stacks import V4, stack


def llama_stack(preset: str, sequence_length: int = 2048):
    """2 × v4-8 (ici fsdp 4, dcn data 2) training ``preset`` at a small batch: DCN-bound."""
    model = {"preset": preset, "vocab_size": None}
    return stack(slices=2, training={"model": model, "sequence_length": sequence_length, "global_batch_size": 8})


def estimate(config, remat: str, microbatches: int, batch: int) -> int:
    train = config.training
    variant = train.model_copy(
        update={
            "model": train.model.model_copy(update={"remat": remat}),
            "microbatches": microbatches,
            "global_batch_size": batch,
        }
    )
    return planner.memory_per_chip(variant, V4.hbm_bytes_per_chip).total


def test_the_cheapest_setting_that_fits_the_minimum_batch_is_recommended():
    config = llama_stack("smollm2-135m")
    p = planner.plan(config)
    fit = p.dcn_batch
    assert p.dcn.dcn_bound and fit is not None
    # 176,000 tokens per replica × 2 replicas ÷ 2048 tokens, up to a multiple of fsdp 4 × data 2
    assert (fit.global_batch_size, fit.per_replica_batch) == (176, 22)
    assert not fit.at_stack_settings.fits  # one batch of 22 sequences, no remat: far over 32 GiB
    limit = HBM_TIGHT_FRACTION * V4.hbm_bytes_per_chip
    for option in fit.options:  # each priced as the stack it would be
        assert option.estimate_bytes_per_chip == estimate(config, option.remat, option.microbatches, 176)
        fewer = [k for k in range(1, option.microbatches) if 22 % k == 0]
        assert all(estimate(config, option.remat, k, 176) > limit for k in fewer)  # the fewest that fit
    assert [o.remat for o in fit.options] == list(levers.REMAT_ORDER)
    assert fit.choice == fit.options[0] and (fit.choice.remat, fit.choice.microbatches) == ("none", 11)
    text = " ".join(p.recommendations)
    assert "set microbatches: 11 and model.remat: none" in text
    for option in fit.options:
        gib = f"{option.estimate_bytes_per_chip / 2**30:.2f} GiB"
        assert f"microbatches {option.microbatches} with remat {option.remat} → {gib}" in text
    lines = planner.advisories(config)
    (line,) = [a for a in lines if "DCN minimum batch" in a]
    assert "; action needed if multislice:training.global_batch_size is raised to it: also set " in line
    assert "multislice:training.microbatches: 11 and multislice:training.model.remat: none, which bring it" in line
    assert line.endswith("per chip; `multislice plan --stack t`)")
    document = json.loads(json.dumps(p.to_json()))
    assert document["dcn_min_batch_in_hbm"]["choice"] == {
        "remat": "none",
        "microbatches": 11,
        "estimate_bytes_per_chip": fit.choice.estimate_bytes_per_chip,
        "fits": True,
    }


def test_rematerialization_is_chosen_when_microbatches_alone_do_not_fit():
    config = stack(
        slices=2,
        training={
            "model": {"preset": "llama-3.2-1b", "vocab_size": None},
            "sequence_length": 4096,
            "global_batch_size": 8,
        },
    )
    fit = planner.plan(config).dcn_batch
    assert fit is not None and fit.choice is not None
    assert not fit.options[0].fits and fit.choice.remat != "none"
    assert fit.choice == next(o for o in fit.options if o.fits)


def test_no_setting_fits_is_said():
    config = llama_stack("llama-2-7b", 4096)
    p = planner.plan(config)
    assert p.dcn_batch is not None and p.dcn_batch.choice is None
    assert any("no microbatch count dividing 11 with any remat policy fits" in r for r in p.recommendations)
    assert any("no microbatch count or remat policy brings it within HBM" in a for a in planner.advisories(config))


def test_a_minimum_batch_that_fits_at_the_stack_settings_adds_no_advisory():
    config = stack(slices=2, training={"global_batch_size": 16})
    p = planner.plan(config)
    assert p.dcn_batch is not None and p.dcn_batch.at_stack_settings.fits
    assert any("fits in HBM" in r and "DCN minimum batch" in r for r in p.recommendations)
    assert not [a for a in planner.advisories(config) if "DCN minimum batch" in a]


def test_compute_bound_stacks_have_no_batch_fit():
    assert planner.plan(stack(slices=2, training={"global_batch_size": 704})).dcn_batch is None
    assert planner.plan(stack(slices=1)).dcn_batch is None


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="min_global_batch_tokens"):
        levers.dcn_batch_fit(stack().training, 0, V4.hbm_bytes_per_chip)

"""infra.planner and ``multislice plan``: the seed's DCN arithmetic on hand-computed examples,
memory against a direct count of sharded arrays, recommendations, advisories, bad input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
import yaml
from typer.testing import CliRunner

from infra import accelerators, planner
from infra.cli import app
from infra.config import StackConfig, load_stack, validate_stack
from training import mesh as mesh_lib
from training import model
from training.config import ParallelismConfig, TrainConfig
from training.optimizer import make_optimizer

STACKS = Path(__file__).resolve().parents[1] / "stacks"
V4 = accelerators.GENERATIONS["v4"]


def stack(accelerator: str = "v4-8", slices: int = 2, training: dict | None = None) -> StackConfig:
    """A valid stack map around ``training`` (defaults: small model, seq 1024)."""
    chips = accelerators.parse_accelerator_type(accelerator).chips
    train = {
        "model": {"d_model": 256, "n_layers": 2, "n_heads": 4},
        "sequence_length": 1024,
        "global_batch_size": 8 * slices,
        "parallelism": {"ici": {"fsdp": chips}, "dcn": {"data": slices}},
    }
    for key, value in (training or {}).items():
        train[key] = value
    return validate_stack(
        "t",
        {
            "gcp:project": "acme-ml-test",
            "gcp:zone": "us-central2-b",
            "multislice:acceleratorType": accelerator,
            "multislice:slices": slices,
            "multislice:training": train,
        },
        "test",
    )


# --- DCN arithmetic ------------------------------------------------------------------------


def test_v4_hardware_arithmetic_intensity_is_the_seeds_22000():
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


def test_seed_minimum_batches():
    assert planner.dcn_bits_per_parameter(2) == 32
    assert planner.dcn_bits_per_parameter(3) == planner.dcn_bits_per_parameter(256) == 64
    assert planner.min_batch_tokens(22_000, 2) == pytest.approx(176_000)
    assert planner.min_batch_tokens(22_000, 4) == pytest.approx(352_000)
    assert planner.operational_intensity(176_000, 2) == pytest.approx(22_000)
    assert planner.operational_intensity(352_000, 3) == pytest.approx(22_000)
    # The seed's margin: ~350,000 (two pods) to ~700,000 (many pods).
    assert planner.SAFETY_MARGIN * planner.min_batch_tokens(22_000, 2) == pytest.approx(352_000)
    assert planner.SAFETY_MARGIN * planner.min_batch_tokens(22_000, 8) == pytest.approx(704_000)


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
def test_dcn_verdict_on_both_sides_of_the_seed_thresholds(slices, batch, tokens, oi, bound, margin):
    p = planner.plan(stack(slices=slices, training={"global_batch_size": batch}))
    assert p.dcn.replicas == slices
    assert p.dcn.tokens_per_replica == tokens
    assert p.dcn.arithmetic_intensity == pytest.approx(22_000)
    assert p.dcn.operational_intensity == pytest.approx(oi)
    assert p.dcn.min_batch_tokens == pytest.approx(176_000 if slices == 2 else 352_000)
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
        stack(slices=4, training={"global_batch_size": 400, "parallelism": {"ici": {"fsdp": 4}, "dcn": {"data": 2, "fsdp": 2}}})
    )
    assert p.dcn.replicas == 2 and p.dcn.bits_per_parameter == 32
    assert p.dcn.tokens_per_replica == 400 * 1024 / 2
    assert any("pure data parallelism over DCN" in r for r in p.recommendations)


def test_single_slice_has_no_dcn_all_reduce():
    p = planner.plan(stack(slices=1))
    assert p.dcn.replicas == 1 and not p.dcn.applies
    assert p.dcn.operational_intensity is None and p.dcn.min_batch_tokens is None
    assert p.dcn.dcn_bound is False
    assert p.dcn.arithmetic_intensity == pytest.approx(22_000)


# --- memory --------------------------------------------------------------------------------


def direct_count(train: TrainConfig) -> dict[str, int]:
    """Bytes of the parameter and optimizer-state shards on each device, counted from real
    arrays sharded the way training.train shards them (8 CPU devices, one process)."""
    mesh = mesh_lib.build_mesh(train.parallelism)
    axes = model.logical_axes(train.model)
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)  # noqa: E731
    param_shardings = jax.tree.map(lambda a: mesh_lib.sharding_for(mesh, a), axes, is_leaf=is_axes)
    opt, _ = make_optimizer(train.optimizer, train.steps)
    params = jax.jit(lambda: model.init_params(train.model, jax.random.key(0)), out_shardings=param_shardings)()
    abstract_opt = jax.eval_shape(opt.init, params)
    opt_shardings = optax.tree_map_params(
        opt, lambda _, s: s, abstract_opt, param_shardings, transform_non_params=lambda _: mesh_lib.sharding_for(mesh, ())
    )
    opt_state = jax.jit(opt.init, out_shardings=opt_shardings)(params)

    def per_device(tree, keep=lambda a: True) -> set[int]:
        totals: dict[int, int] = {}
        for leaf in jax.tree.leaves(tree):
            if not keep(leaf):
                continue
            for shard in leaf.addressable_shards:
                totals[shard.device.id] = totals.get(shard.device.id, 0) + shard.data.nbytes
        return set(totals.values())

    (param_bytes,) = per_device(params)
    (moment_bytes,) = per_device(opt_state, keep=lambda a: a.ndim > 0)
    (counter_bytes,) = per_device(opt_state, keep=lambda a: a.ndim == 0)
    return {"params": param_bytes, "moments": moment_bytes, "counters": counter_bytes,
            "count": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))}


@pytest.mark.parametrize(
    "ici", [{"data": 1, "fsdp": 8, "tensor": 1}, {"data": 2, "fsdp": 2, "tensor": 2}, {"data": 1, "fsdp": 2, "tensor": 4}]
)
def test_memory_matches_a_direct_count_of_sharded_arrays(ici):
    train = TrainConfig.model_validate(
        {
            "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 96},
            "sequence_length": 32,
            "global_batch_size": 8,
            "parallelism": {"ici": ici},
        }
    )
    counted = direct_count(train)
    mem = planner.memory_per_chip(train, V4.hbm_bytes_per_chip)
    assert counted["count"] == model.param_count(train.model)
    assert mem.parameters == counted["params"]
    assert mem.gradients == mem.parameters  # float32, sharded like the parameters
    assert mem.optimizer_state == counted["moments"]  # AdamW mu + nu
    assert counted["counters"] <= 16  # int32 step counters, not estimated
    assert mem.capacity == 32 * 2**30


def test_activation_formula_is_korthikanti_adapted():
    s, b, h, a, n = 128, 2, 64, 4, 3
    base = {"model": {"d_model": h, "n_layers": n, "n_heads": a}, "sequence_length": s, "global_batch_size": b}
    bf16 = TrainConfig.model_validate(base | {"model": base["model"] | {"compute_dtype": "bfloat16"}})
    # Korthikanti et al. 2022: s·b·h·34 + 5·a·s²·b per layer (16-bit, with dropout). Here: no
    # dropout masks (−2·s·b·h), float32 softmax plus its bf16 cast (6 instead of 5 × a·s²·b).
    per_layer = s * b * h * 34 + 5 * a * s * s * b - 2 * s * b * h + a * s * s * b
    output = 2 * 2 * s * b * h + 2 * 4 * s * b * 256
    assert planner.activation_bytes_per_chip(bf16) == n * per_layer + output
    f32 = TrainConfig.model_validate(base | {"model": base["model"] | {"compute_dtype": "float32"}})
    per_layer = 4 * s * b * h * 4 + 4 * s * b * h * 4 + 2 * 4 * s * b * 4 * h + 4 * a * s * s * b
    assert planner.activation_bytes_per_chip(f32) == n * per_layer + 2 * 4 * s * b * h + 2 * 4 * s * b * 256


def test_activations_split_over_batch_and_tensor_axes():
    base = {"model": {"d_model": 64, "n_layers": 2, "n_heads": 4}, "sequence_length": 64, "global_batch_size": 16}
    one = planner.activation_bytes_per_chip(TrainConfig.model_validate(base))
    fsdp = planner.activation_bytes_per_chip(
        TrainConfig.model_validate(base | {"parallelism": {"ici": {"fsdp": 8}}})
    )
    assert fsdp * 8 == one
    tensor = planner.activation_bytes_per_chip(
        TrainConfig.model_validate(base | {"parallelism": {"ici": {"tensor": 4}}})
    )
    assert one / 4 < tensor < one  # norms stay replicated, the rest is split


def test_over_hbm_is_flagged_with_advice():
    config = stack(
        "v4-8",
        slices=2,
        training={
            "model": {"d_model": 1024, "n_layers": 24, "n_heads": 16},
            "sequence_length": 4096,
            "global_batch_size": 64,
        },
    )
    p = planner.plan(config)
    assert not p.memory.fits and p.memory.total > p.memory.capacity
    assert p.recommendations[0].startswith("over HBM")
    assert any("over HBM" in line for line in planner.advisories(config))


# --- plans of the shipped stacks, recommendations, advisories -------------------------------


@pytest.mark.parametrize("name", ["dev", "staging", "prod"])
def test_shipped_stacks_plan(name):
    config = load_stack(name, STACKS)
    p = planner.plan(config)
    assert p.chips == config.slices * config.accelerator.chips
    assert p.hosts == config.total_workers
    assert p.memory.fits
    assert p.dcn.tokens_per_replica == config.training.global_batch_tokens / config.training.parallelism.dcn.data
    assert p.recommendations[0].startswith("dcn tensor parallelism is 1")
    assert (len(planner.advisories(config)) > 0) == p.dcn.dcn_bound


def test_compute_bound_stack_that_fits_has_no_advisory():
    config = stack(slices=2, training={"global_batch_size": 704})
    assert planner.plan(config).dcn.meets_margin
    assert planner.advisories(config) == []


def test_dcn_bound_advisory_names_the_figures():
    (line,) = planner.advisories(stack(slices=2, training={"global_batch_size": 16}))
    assert "DCN-bound" in line and "176,000" in line and "22,000" in line and "multislice plan" in line


def test_ici_data_parallelism_gets_the_fsdp_advice():
    p = planner.plan(stack(slices=1, training={"global_batch_size": 8, "parallelism": {"ici": {"data": 2, "fsdp": 2}}}))
    assert any("prefer FSDP" in r and "fsdp: 4" in r for r in p.recommendations)


def test_dcn_bound_recommendation_gives_the_batch_and_pipeline_fallback():
    p = planner.plan(stack(slices=4, training={"global_batch_size": 16}))
    text = " ".join(p.recommendations)
    assert "raise global_batch_size to ≥ 1376 sequences" in text  # 4 × 352,000 / 1024 → multiple of 16
    assert "pipeline parallelism" in text


# --- bad input ----------------------------------------------------------------------------


def test_bad_arguments_raise_value_errors():
    acc = accelerators.parse_accelerator_type("v4-8")
    for call in (
        lambda: planner.dcn_bits_per_parameter(1),
        lambda: planner.dcn_bits_per_parameter(0),
        lambda: planner.operational_intensity(0, 2),
        lambda: planner.operational_intensity(-5, 2),
        lambda: planner.min_batch_tokens(0, 2),
        lambda: planner.memory_per_chip(TrainConfig(), 0),
        lambda: planner.memory_per_chip(TrainConfig(), -1),
        lambda: planner.dcn_check(acc, ParallelismConfig(), 0),
        lambda: planner.plan_training(TrainConfig(), acc, 0),
    ):
        with pytest.raises(ValueError):
            call()


def test_plan_training_rejects_a_mesh_that_does_not_match_the_accelerator():
    acc = accelerators.parse_accelerator_type("v4-16")  # 8 chips
    train = TrainConfig.model_validate({"parallelism": {"ici": {"fsdp": 4}}})
    with pytest.raises(ValueError, match=r"parallelism.ici: .* = 4 must equal the chips per slice of v4-16: 8"):
        planner.plan_training(train, acc, 1)
    with pytest.raises(ValueError, match=r"parallelism.dcn: .* = 1 must equal slices: 2"):
        planner.plan_training(TrainConfig.model_validate({"parallelism": {"ici": {"fsdp": 8}}}), acc, 2)


runner = CliRunner()


def write_stack(tmp_path: Path, edit) -> Path:
    data = yaml.safe_load((STACKS / "Pulumi.dev.yaml").read_text())
    config = copy.deepcopy(data["config"])
    edit(config)
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda c: c.update({"multislice:acceleratorType": "v4-12"}), "multislice:acceleratorType"),
        (lambda c: c["multislice:training"]["parallelism"]["ici"].update({"fsdp": 2}), "parallelism.ici"),
        (lambda c: c.update({"multislice:slices": 3}), "parallelism.dcn"),
        (lambda c: c["multislice:training"].update({"global_batch_size": 12}), "global_batch_size"),
        (lambda c: c["multislice:training"].update({"sequence_length": 0}), "sequence_length"),
        (lambda c: c["multislice:training"]["parallelism"]["ici"].update({"data": -1}), "parallelism.ici.data"),
        (lambda c: c.update({"multislice:slices": 0}), "multislice:slices"),
    ],
)
def test_cli_bad_stack_is_one_clear_error_naming_the_key(tmp_path, edit, key):
    result = runner.invoke(app, ["plan", "--config-file", str(write_stack(tmp_path, edit))])
    assert result.exit_code == 2
    assert "error:" in result.output and key in result.output
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not a crash


def test_cli_plan_json_has_the_documented_keys():
    result = runner.invoke(app, ["plan", "--stack", "staging", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key, kind in {
        "dcn_bound": bool,
        "min_batch_tokens": float,
        "operational_intensity": float,
        "arithmetic_intensity": float,
        "hbm_bytes_per_chip": int,
        "hbm_capacity_bytes": int,
        "fits_in_hbm": bool,
        "global_batch_tokens": int,
    }.items():
        assert isinstance(data[key], kind), key
    assert data["mesh"]["fsdp"] == {"dcn": 1, "ici": 16, "size": 16}
    assert (data["chips"], data["hosts"], data["slices"]) == (32, 8, 2)
    assert data["arithmetic_intensity"] == pytest.approx(22_000)


def test_cli_plan_human_output(tmp_path):
    result = runner.invoke(app, ["plan", "--config-file", str(STACKS / "Pulumi.dev.yaml")])
    assert result.exit_code == 0, result.output
    for text in ("stack dev", "mesh", "memory per chip", "22,000 FLOP/bit", "DCN-bound", "recommendations", "sources"):
        assert text in result.output


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

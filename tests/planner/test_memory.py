"""infra.planner.memory: memory per chip against a direct count of sharded arrays, and the
activation formula (the residuals autodiff saves, after Korthikanti et al.)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
import optax
import pytest

from infra import planner
from tests.planner.stacks import V4
from training import mesh as mesh_lib
from training.config import TrainConfig
from training.model import transformer as model
from training.optimizer import make_optimizer


def direct_count(train: TrainConfig) -> dict[str, int]:
    """Bytes of the parameter and optimizer-state shards on each device, counted from real
    arrays sharded the way training.train shards them (8 CPU devices, one process)."""
    mesh = mesh_lib.build_mesh(train.parallelism)
    axes = model.logical_axes(train.model, train.vocab_size)
    is_axes = lambda x: isinstance(x, tuple) and all(isinstance(a, (str, type(None))) for a in x)  # noqa: E731
    param_shardings = jax.tree.map(lambda a: mesh_lib.sharding_for(mesh, a), axes, is_leaf=is_axes)
    opt, _ = make_optimizer(train.optimizer, train.steps)
    params = jax.jit(
        lambda: model.init_params(train.model, train.vocab_size, jax.random.key(0)), out_shardings=param_shardings
    )()
    abstract_opt = jax.eval_shape(opt.init, params)
    opt_shardings = optax.tree_map_params(
        opt,
        lambda _, s: s,
        abstract_opt,
        param_shardings,
        transform_non_params=lambda _: mesh_lib.sharding_for(mesh, ()),
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
    return {
        "params": param_bytes,
        "moments": moment_bytes,
        "counters": counter_bytes,
        "count": sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params)),
    }


@pytest.mark.parametrize(
    "ici",
    [{"data": 1, "fsdp": 8, "tensor": 1}, {"data": 2, "fsdp": 2, "tensor": 2}, {"data": 1, "fsdp": 2, "tensor": 4}],
)
@pytest.mark.parametrize(
    "options",
    [{}, {"mlp": "swiglu", "n_heads": 8, "n_kv_heads": 4, "tie_embeddings": True}],
    ids=["gelu-mha", "swiglu-gqa-tied"],
)
def test_memory_matches_a_direct_count_of_sharded_arrays(ici, options):
    train = TrainConfig.model_validate(
        {
            "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 96} | options,
            "sequence_length": 32,
            "global_batch_size": 8,
            "parallelism": {"ici": ici},
        }
    )
    counted = direct_count(train)
    mem = planner.memory_per_chip(train, V4.hbm_bytes_per_chip)
    assert counted["count"] == model.param_count(train.model, train.vocab_size)
    assert mem.parameters == counted["params"]
    assert mem.gradients == mem.parameters  # float32, sharded like the parameters
    assert mem.optimizer_state == counted["moments"]  # AdamW mu + nu
    assert counted["counters"] <= 16  # int32 step counters, not estimated
    assert mem.capacity == 32 * 2**30


def test_parameter_shapes_are_the_models_with_their_logical_axes():
    train = TrainConfig.model_validate({"model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 96}})
    params = model.init_params(train.model, train.vocab_size, jax.random.key(0))
    axes = model.logical_axes(train.model, train.vocab_size)
    flat = {
        "/".join(str(k.key) for k in path): (tuple(leaf.shape), axes_leaf)
        for (path, leaf), axes_leaf in zip(
            jax.tree_util.tree_leaves_with_path(params),
            jax.tree.leaves(axes, is_leaf=lambda x: isinstance(x, tuple)),
            strict=True,
        )
    }
    assert planner.parameter_shapes(train) == flat


def test_activation_formula_counts_what_autodiff_saves():
    s, b, h, a, n = 128, 2, 64, 4, 3
    base = {"model": {"d_model": h, "n_layers": n, "n_heads": a}, "sequence_length": s, "global_batch_size": b}
    f32 = TrainConfig.model_validate(base | {"model": base["model"] | {"compute_dtype": "float32"}})
    e, f = 4, 4 * h
    # Per layer: two RMSNorms (float32 input, normalized value, e-byte output), q/k/v/attention
    # output, six f-wide MLP tensors, the float32 softmax and its e-byte probabilities.
    per_layer = (16 + 2 * e) * s * b * h + e * s * b * 4 * h + 6 * e * s * b * f + a * s * s * b * (4 + e)
    output = (8 + e) * s * b * h + 2 * 4 * s * b * 256
    assert planner.activation_bytes_per_chip(f32) == n * per_layer + output
    bf16 = TrainConfig.model_validate(base | {"model": base["model"] | {"compute_dtype": "bfloat16"}})
    e = 2
    per_layer = (16 + 2 * e) * s * b * h + e * s * b * 4 * h + 6 * e * s * b * f + a * s * s * b * (4 + e)
    casts = e * n * (4 * h * h + 2 * h * f)  # every layer's weights cast to bfloat16 are saved too
    output = (8 + e) * s * b * h + 2 * 4 * s * b * 256
    assert planner.activation_bytes_per_chip(bf16) == n * per_layer + casts + output


def test_swiglu_gqa_microbatches_and_remat_in_the_activations():
    s, b, h, a, n, f = 64, 8, 64, 4, 2, 96
    base = {
        "model": {"d_model": h, "n_layers": n, "n_heads": a, "d_ff": f, "compute_dtype": "float32"},
        "sequence_length": s,
        "global_batch_size": b,
    }

    def act(**model_keys) -> int:
        keys = dict(model_keys)
        top = {k: keys.pop(k) for k in ("microbatches",) if k in keys}
        return planner.activation_bytes_per_chip(
            TrainConfig.model_validate(base | top | {"model": base["model"] | keys})
        )

    e = 4
    assert act(mlp="swiglu") == act()  # six f-wide tensors saved either way (print_saved_residuals)
    assert act() - act(n_kv_heads=1) == n * 2 * e * s * b * (h - h // a)  # k and v one head wide
    assert act(microbatches=4) * 4 == act()  # one microbatch of b/4 at a time
    output = (8 + e) * s * b * h + 2 * 4 * s * b * 256
    per_layer = (act() - output) // n
    assert act(remat="full") == n * e * s * b * h + per_layer + output
    # dots policies: the matmul outputs of every layer, one layer's other tensors recomputed
    dots = e * s * b * (3 * h + 2 * h + f)
    assert act(remat="dots_with_no_batch_dims_saveable") == n * dots + per_layer - dots + output
    dots += a * s * s * b * 4 + e * s * b * h
    assert act(remat="dots_saveable") == n * dots + per_layer - dots + output
    assert act(remat="full") < act(remat="dots_with_no_batch_dims_saveable") < act(remat="dots_saveable") < act()
    wide = TrainConfig.model_validate(
        base | {"sequence_length": 128, "model": base["model"] | {"d_model": 512, "attention": "splash"}}
    )
    # splash keeps a float32 log-sum-exp per query, not the s×s scores
    assert planner.activation_bytes_per_chip(wide) < planner.activation_bytes_per_chip(
        wide.model_copy(update={"model": wide.model.model_copy(update={"attention": "reference"})})
    )
    # auto is splash on a TPU, xla (materialized scores) on a CPU
    auto = wide.model_copy(update={"model": wide.model.model_copy(update={"attention": "auto"})})
    assert planner.activation_bytes_per_chip(auto) == planner.activation_bytes_per_chip(wide)
    assert planner.activation_bytes_per_chip(auto, "cpu") > planner.activation_bytes_per_chip(wide)
    grads = planner.memory_per_chip(TrainConfig.model_validate(base | {"microbatches": 2}), V4.hbm_bytes_per_chip)
    assert grads.gradients == 2 * grads.parameters  # the float32 sum and one microbatch's


def test_fsdp_counts_the_gathered_tables_and_one_layer():
    s, b, h, n = 64, 16, 64, 2
    base = {"model": {"d_model": h, "n_layers": n, "n_heads": 4, "compute_dtype": "float32"}}
    base |= {"sequence_length": s, "global_batch_size": b}
    one = TrainConfig.model_validate(base)
    fsdp = TrainConfig.model_validate(base | {"parallelism": {"ici": {"fsdp": 8}}})
    tables = 2 * 256 * h  # embed and unembed, float32, whole over fsdp
    layer = 4 * h * h + 2 * h * 4 * h
    assert planner.activation_bytes_per_chip(fsdp) * 8 == planner.activation_bytes_per_chip(one) + 8 * 2 * 4 * (
        tables + layer
    )


def test_activations_split_over_batch_and_tensor_axes():
    model = {"d_model": 64, "n_layers": 2, "n_heads": 4, "compute_dtype": "float32"}  # no weight casts
    base = {"model": model, "sequence_length": 64, "global_batch_size": 16}
    one = planner.activation_bytes_per_chip(TrainConfig.model_validate(base))
    data = planner.activation_bytes_per_chip(TrainConfig.model_validate(base | {"parallelism": {"ici": {"data": 8}}}))
    assert data * 8 == one
    tensor = planner.activation_bytes_per_chip(
        TrainConfig.model_validate(base | {"parallelism": {"ici": {"tensor": 4}}})
    )
    assert one / 4 < tensor < one  # norms stay replicated, the rest is split


def test_memory_estimate_derives_total_fraction_and_fit():
    mem = planner.MemoryEstimate(parameters=100, gradients=100, optimizer_state=200, activations=624, capacity=1024)
    assert (mem.total, mem.fraction, mem.fits) == (1024, 1.0, True)  # exactly full still fits
    over = dataclasses.replace(mem, activations=625)
    assert (over.total, over.fits) == (1025, False) and over.fraction == pytest.approx(1025 / 1024)
    with pytest.raises(TypeError):
        planner.MemoryEstimate(1, 1, 1, 1, 8, total=4)  # derived, not an argument


def test_bad_capacity_raises_value_errors():
    for capacity in (0, -1):
        with pytest.raises(ValueError, match="hbm_capacity_bytes"):
            planner.memory_per_chip(TrainConfig(), capacity)

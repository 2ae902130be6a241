"""training.model.shapes, the jax-free parameter shapes the planner reads, against the real model:
``jax.eval_shape`` of ``training.model.transformer.init_params`` for several configs."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from training import mesh
from training.config import ModelConfig, TrainConfig
from training.model import shapes, transformer as model

ROOT = Path(__file__).resolve().parents[2]

CONFIGS = [
    ModelConfig(),
    ModelConfig(d_model=64, n_layers=2, n_heads=4, d_ff=96),
    ModelConfig(d_model=48, n_layers=3, n_heads=6, compute_dtype="float32"),
    ModelConfig(d_model=8, n_layers=1, n_heads=1, d_ff=3),
    ModelConfig(d_model=1024, n_layers=12, n_heads=16),
    ModelConfig(d_model=64, n_layers=2, n_heads=8, n_kv_heads=2, mlp="swiglu", d_ff=160),
    ModelConfig(d_model=64, n_layers=1, n_heads=4, n_kv_heads=1, tie_embeddings=True, vocab_size=1000),
]


def vocab(cfg: ModelConfig) -> int:
    return cfg.resolve_vocab(256)  # byte data


def _is_param(x) -> bool:
    return isinstance(x, shapes.Param)


@pytest.mark.parametrize(
    "cfg",
    CONFIGS,
    ids=lambda c: (
        f"d{c.d_model}-l{c.n_layers}-h{c.n_heads}-g{c.kv_heads}-f{c.ff_width}-{c.mlp}"
        + ("-tied" if c.tie_embeddings else "")
    ),
)
def test_shapes_are_the_models(cfg):
    abstract = jax.eval_shape(lambda: model.init_params(cfg, vocab(cfg), jax.random.key(0)))
    spec = shapes.params(cfg, vocab(cfg))
    # Same tree (same keys at every level), and each leaf's shape and dtype.
    assert jax.tree.structure(abstract) == jax.tree.structure(spec, is_leaf=_is_param)
    pairs = zip(jax.tree.leaves(abstract), jax.tree.leaves(spec, is_leaf=_is_param), strict=True)
    for leaf, param in pairs:
        assert tuple(leaf.shape) == param.shape
        assert leaf.dtype == jax.numpy.float32
        assert len(param.axes) == len(param.shape)
    assert shapes.param_count(cfg, vocab(cfg)) == sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(abstract))
    assert model.param_count(cfg, vocab(cfg)) == shapes.param_count(cfg, vocab(cfg))


@pytest.mark.parametrize("cfg", [*CONFIGS[:2], *CONFIGS[-2:]], ids=["default", "small", "swiglu-gqa", "tied"])
def test_flat_params_are_the_tree_paths(cfg):
    abstract = jax.eval_shape(lambda: model.init_params(cfg, vocab(cfg), jax.random.key(0)))
    from_jax = {
        "/".join(str(k.key) for k in path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
    }
    assert {path: p.shape for path, p in shapes.flat_params(cfg, vocab(cfg)).items()} == from_jax


def test_the_default_model_keeps_the_parameter_tree_of_existing_checkpoints():
    # The paths and shapes (so the names) the trainer wrote before the model options existed (d256, 4 layers,
    # 4 heads, d_ff 1024, 256 bytes): checkpoints of existing runs restore into this tree.
    before = {
        "embed": (256, 256),
        "layers/ln1": (4, 256),
        "layers/wq": (4, 256, 4, 64),
        "layers/wk": (4, 256, 4, 64),
        "layers/wv": (4, 256, 4, 64),
        "layers/wo": (4, 4, 64, 256),
        "layers/ln2": (4, 256),
        "layers/w_in": (4, 256, 1024),
        "layers/w_out": (4, 1024, 256),
        "ln_f": (256,),
        "unembed": (256, 256),
    }
    default = TrainConfig()
    flat = shapes.flat_params(default.model, default.vocab_size)
    assert {path: p.shape for path, p in flat.items()} == before
    abstract = jax.eval_shape(lambda: model.init_params(default.model, default.vocab_size, jax.random.key(0)))
    assert {
        "/".join(str(k.key) for k in path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
    } == before


def test_the_default_model_draws_the_same_initial_values_as_before():
    # The keys of init_params (split(key, 7), then fold_in(key, 7)) in tree order, as the trainer
    # drew them before the options existed: a new run of the default config starts where it did.
    cfg = ModelConfig(d_model=16, n_layers=1, n_heads=2)
    params = model.init_params(cfg, 256, jax.random.key(3))
    key = jax.random.key(3)
    keys = [*jax.random.split(key, 7), jax.random.fold_in(key, 7)]
    assert bool(jax.numpy.all(params["embed"] == 0.02 * jax.random.normal(keys[0], (256, 16))))
    assert bool(jax.numpy.all(params["unembed"] == 0.02 * jax.random.normal(keys[7], (16, 256))))


def test_logical_axes_come_from_shapes_and_every_axis_has_a_rule():
    cfg = CONFIGS[-2]
    axes = model.logical_axes(cfg, vocab(cfg))
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    assert jax.tree.leaves(axes, is_leaf=is_axes) == [
        p.axes for p in jax.tree.leaves(shapes.params(cfg, vocab(cfg)), is_leaf=_is_param)
    ]
    used = {name for p in shapes.flat_params(cfg, vocab(cfg)).values() for name in p.axes}
    assert used <= set(shapes.LOGICAL_AXIS_RULES)
    # The trainer shards by the very rules the planner reads.
    assert mesh.LOGICAL_AXIS_RULES is shapes.LOGICAL_AXIS_RULES


def test_shapes_import_no_jax():
    code = (
        "import sys, training.model.shapes; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'numpy')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"

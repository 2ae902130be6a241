"""training.shapes, the jax-free parameter shapes the planner reads, against the real model:
``jax.eval_shape`` of ``training.model.init_params`` for several configs."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from training import mesh, model, shapes
from training.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]

CONFIGS = [
    ModelConfig(),
    ModelConfig(d_model=64, n_layers=2, n_heads=4, d_ff=96),
    ModelConfig(d_model=48, n_layers=3, n_heads=6, compute_dtype="float32"),
    ModelConfig(d_model=8, n_layers=1, n_heads=1, d_ff=3),
    ModelConfig(d_model=1024, n_layers=12, n_heads=16),
]


def _is_param(x) -> bool:
    return isinstance(x, shapes.Param)


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"d{c.d_model}-l{c.n_layers}-h{c.n_heads}-f{c.ff_width}")
def test_shapes_are_the_models(cfg):
    abstract = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    spec = shapes.params(cfg)
    # Same tree (same keys at every level), and each leaf's shape and dtype.
    assert jax.tree.structure(abstract) == jax.tree.structure(spec, is_leaf=_is_param)
    pairs = zip(jax.tree.leaves(abstract), jax.tree.leaves(spec, is_leaf=_is_param), strict=True)
    for leaf, param in pairs:
        assert tuple(leaf.shape) == param.shape
        assert leaf.dtype == jax.numpy.float32
        assert len(param.axes) == len(param.shape)
    assert shapes.param_count(cfg) == sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(abstract))
    assert model.param_count(cfg) == shapes.param_count(cfg)


@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=["default", "small"])
def test_flat_params_are_the_tree_paths(cfg):
    abstract = jax.eval_shape(lambda: model.init_params(cfg, jax.random.key(0)))
    from_jax = {
        "/".join(str(k.key) for k in path): tuple(leaf.shape)
        for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
    }
    assert {path: p.shape for path, p in shapes.flat_params(cfg).items()} == from_jax


def test_logical_axes_come_from_shapes_and_every_axis_has_a_rule():
    cfg = CONFIGS[1]
    axes = model.logical_axes(cfg)
    is_axes = lambda x: isinstance(x, tuple)  # noqa: E731
    assert jax.tree.leaves(axes, is_leaf=is_axes) == [
        p.axes for p in jax.tree.leaves(shapes.params(cfg), is_leaf=_is_param)
    ]
    used = {name for p in shapes.flat_params(cfg).values() for name in p.axes}
    assert used <= set(shapes.LOGICAL_AXIS_RULES)
    # The trainer shards by the very rules the planner reads.
    assert mesh.LOGICAL_AXIS_RULES is shapes.LOGICAL_AXIS_RULES


def test_shapes_import_no_jax():
    code = (
        "import sys, training.shapes; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'numpy')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]"

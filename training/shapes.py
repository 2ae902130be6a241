"""The model's parameters without jax: shape and logical axes (D d_model, H heads, K head_dim,
F d_ff, L layers, V = ``ModelConfig.vocab``: 256 bytes or the data's tokens), and the mesh
axes each logical axis is split over. ``training.model.init_params`` creates its parameters
from these shapes; the planner (``multislice plan``, ``pulumi preview``) counts and shards them."""

from __future__ import annotations

import math
from typing import NamedTuple

from training.config import ModelConfig

#: logical axis name -> mesh axes it is split over (None: replicated).
LOGICAL_AXIS_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "sequence": None,
    "embed": "fsdp",
    "activation_embed": None,
    "heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "vocab": "tensor",
    "layers": None,
    "norm": None,
}


class Param(NamedTuple):
    """A float32 parameter's shape and one logical axis name per dimension."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]


def params(cfg: ModelConfig) -> dict:
    """Every :class:`Param`, in the tree of ``init_params`` (``layers`` stacks L layers)."""
    d, h, k, f, n = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.ff_width, cfg.n_layers
    qkv = Param((n, d, h, k), ("layers", "embed", "heads", "head_dim"))
    norm = Param((n, d), ("layers", "norm"))
    return {
        "embed": Param((cfg.vocab, d), ("vocab", "embed")),
        "layers": {
            "ln1": norm,
            "wq": qkv,
            "wk": qkv,
            "wv": qkv,
            "wo": Param((n, h, k, d), ("layers", "heads", "head_dim", "embed")),
            "ln2": norm,
            "w_in": Param((n, d, f), ("layers", "embed", "mlp")),
            "w_out": Param((n, f, d), ("layers", "mlp", "embed")),
        },
        "ln_f": Param((d,), ("norm",)),
        "unembed": Param((d, cfg.vocab), ("embed", "vocab")),
    }


def flat_params(cfg: ModelConfig) -> dict[str, Param]:
    """:func:`params` keyed by path: ``embed``, ``layers/wq``, ..."""
    tree = params(cfg)
    layers = tree.pop("layers")
    return tree | {f"layers/{key}": p for key, p in layers.items()}


def param_count(cfg: ModelConfig) -> int:
    """Number of parameters: the elements of every shape."""
    return sum(math.prod(p.shape) for p in flat_params(cfg).values())

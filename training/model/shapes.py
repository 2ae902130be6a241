"""The model's parameters without jax: shape and logical axes (D d_model, H query heads, G
key/value heads, K head_dim, F d_ff, L layers, V the vocabulary: ``TrainConfig.vocab_size``),
and the mesh axes each logical axis is split over. ``training.model.transformer.init_params`` creates its
parameters from these shapes; the planner (``multislice plan``, ``pulumi preview``) counts and
shards them.

The default model (``mlp: gelu``, untied embeddings, G = H) has exactly the tree of the
trainer before these options existed, so its checkpoints still restore; SwiGLU adds
``layers/w_gate``, tied embeddings drop ``unembed`` (the logits use ``embed`` transposed)."""

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
    "kv_heads": "tensor",
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


def params(cfg: ModelConfig, vocab_size: int) -> dict:
    """Every :class:`Param`, in the tree of ``init_params`` (``layers`` stacks L layers), for a
    vocabulary of ``vocab_size`` rows (``TrainConfig.vocab_size``)."""
    d, h, g, k, f, n = cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.head_dim, cfg.ff_width, cfg.n_layers
    kv = Param((n, d, g, k), ("layers", "embed", "kv_heads", "head_dim"))
    norm = Param((n, d), ("layers", "norm"))
    mlp_in = Param((n, d, f), ("layers", "embed", "mlp"))
    layers = {
        "ln1": norm,
        "wq": Param((n, d, h, k), ("layers", "embed", "heads", "head_dim")),
        "wk": kv,
        "wv": kv,
        "wo": Param((n, h, k, d), ("layers", "heads", "head_dim", "embed")),
        "ln2": norm,
        "w_in": mlp_in,
        **({"w_gate": mlp_in} if cfg.mlp == "swiglu" else {}),
        "w_out": Param((n, f, d), ("layers", "mlp", "embed")),
    }
    return {
        "embed": Param((vocab_size, d), ("vocab", "embed")),
        "layers": layers,
        "ln_f": Param((d,), ("norm",)),
        **({} if cfg.tie_embeddings else {"unembed": Param((d, vocab_size), ("embed", "vocab"))}),
    }


def flat_params(cfg: ModelConfig, vocab_size: int) -> dict[str, Param]:
    """:func:`params` keyed by path: ``embed``, ``layers/wq``, ..."""
    tree = params(cfg, vocab_size)
    layers = tree.pop("layers")
    return tree | {f"layers/{key}": p for key, p in layers.items()}


def param_count(cfg: ModelConfig, vocab_size: int) -> int:
    """Number of parameters: the elements of every shape."""
    return sum(math.prod(p.shape) for p in flat_params(cfg, vocab_size).values())


def matmul_params(cfg: ModelConfig, vocab_size: int) -> int:
    """Weights used in matmuls, per token: every parameter except the norm scales and the
    embedding gather (a lookup, no FLOPs), plus the unembedding (D × V), which is a matmul
    whether or not it shares the embedding's table."""
    flat = flat_params(cfg, vocab_size)
    weights = sum(math.prod(p.shape) for path, p in flat.items() if path.startswith("layers/") and "norm" not in p.axes)
    return weights + cfg.d_model * vocab_size

"""The optimizer: optax AdamW with a warmup + decay schedule and global-norm clipping.

Weight decay applies to matrices only (``ndim >= 2``), not to norm scales — the usual
practice for transformers (Loshchilov & Hutter 2019, "Decoupled Weight Decay
Regularization"; GPT-2/nanoGPT exclude norms and biases).
"""

from __future__ import annotations

import jax
import optax

from training.config import OptimizerConfig


def learning_rate_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """Learning rate per step: linear warmup from 0 to the peak over ``warmup_steps``, then
    cosine or linear decay to ``end_learning_rate_fraction × peak`` at ``total_steps``, or
    constant."""
    peak = cfg.peak_learning_rate
    end = peak * cfg.end_learning_rate_fraction
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    decay_steps = max(total_steps - warmup, 1)
    if cfg.schedule == "cosine":
        decay = optax.cosine_decay_schedule(peak, decay_steps, alpha=cfg.end_learning_rate_fraction)
    elif cfg.schedule == "linear":
        decay = optax.linear_schedule(peak, end, decay_steps)
    else:
        decay = optax.constant_schedule(peak)
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), decay], [warmup])


def make_optimizer(cfg: OptimizerConfig, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The optax transformation and its schedule (for logging the learning rate)."""
    schedule = learning_rate_schedule(cfg, total_steps)
    parts = []
    if cfg.grad_clip_norm is not None:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip_norm))
    parts.append(
        optax.adamw(
            schedule,
            b1=cfg.b1,
            b2=cfg.b2,
            weight_decay=cfg.weight_decay,
            mask=lambda params: jax.tree.map(lambda p: p.ndim >= 2, params),
        )
    )
    return optax.chain(*parts), schedule

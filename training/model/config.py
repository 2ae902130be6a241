"""ModelConfig: the transformer's shape, validated before any work starts (``model`` of
:class:`training.config.TrainConfig`, which re-exports it).

Every error names the key path (``model.heads``) and the allowed values (:mod:`training.validation`).
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import Field, model_validator

from training.model import presets
from training.validation import ConfigBool, StrictModel, invalid, shorten

#: RoPE base wavelength (Su et al. 2021, "RoFormer", arXiv:2104.09864, eq. 15).
ROPE_THETA = 10_000.0
# Upper bounds of the model's shape: far beyond any run this trainer could make, so that a slip
# of the finger stops at validation (training/config.py has the bounds of the run).
#: Residual width: 2^16; the widest published dense models use 18,432 (PaLM 540B).
MAX_D_MODEL = 1 << 16
#: MLP width: 4 × MAX_D_MODEL (PaLM 540B: 73,728).
MAX_D_FF = 4 * MAX_D_MODEL
#: Layers: 1,024; published dense models use at most ~128 (PaLM 540B: 118).
MAX_LAYERS = 1024
#: Heads: 1,024 (they divide d_model; PaLM 540B uses 48).
MAX_HEADS = 1024
#: Vocabulary: 2^22; published vocabularies are at most ~256k (Gemma: 256,000, PaLM: 256k).
MAX_VOCAB_SIZE = 1 << 22


#: ``model.attention`` values: ``auto`` picks per platform (``training.model.kernels.attention_kernel``).
AttentionKernel = Literal["auto", "reference", "xla", "cudnn", "splash"]
ATTENTION_KERNELS: tuple[str, ...] = typing.get_args(AttentionKernel)
#: ``model.remat`` values: rematerialization policy of each layer (``training.model.transformer``).
RematPolicy = Literal["none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable"]
REMAT_POLICIES: tuple[str, ...] = typing.get_args(RematPolicy)


class ModelConfig(StrictModel):
    """A decoder-only transformer (pre-norm RMSNorm, causal self-attention with rotary
    positions, GELU or SwiGLU MLP), by default the byte-level model of the ``byte`` preset.

    ``preset`` names a shape of :data:`training.model.presets.PRESETS` whose keys fill every key the
    mapping does not set. ``attention`` and ``remat`` choose how the same function is computed
    (kernel: training.model.kernels, memory), not what it is: they may change between attempts of a run.
    """

    preset: str | None = Field(
        default=None, description="A training.model.presets name; its keys fill the keys not set here (default: byte)."
    )
    d_model: int = Field(default=256, ge=8, le=MAX_D_MODEL, description="Residual stream width.")
    n_layers: int = Field(default=4, ge=1, le=MAX_LAYERS)
    n_heads: int = Field(default=4, ge=1, le=MAX_HEADS, description="Query heads.")
    n_kv_heads: int | None = Field(
        default=None, ge=1, le=MAX_HEADS, description="Key/value heads (grouped-query attention); default n_heads."
    )
    d_ff: int | None = Field(default=None, ge=1, le=MAX_D_FF, description="MLP hidden width; default 4 × d_model.")
    mlp: Literal["gelu", "swiglu"] = Field(
        default="gelu", description="gelu: two matrices; swiglu: three (Shazeer 2020, arXiv:2002.05202)."
    )
    vocab_size: int | None = Field(
        default=None,
        ge=2,
        le=MAX_VOCAB_SIZE,
        description="Embedding rows and logits; null: from the data (a prepared dataset's manifest; 256 for bytes). "
        "May exceed the data's vocabulary (padding), never be smaller.",
    )
    tie_embeddings: ConfigBool = Field(default=False, description="Unembed with the transposed embedding table.")
    rope_theta: float = Field(default=ROPE_THETA, gt=1, description="Rotary embedding base wavelength.")
    norm_eps: float = Field(default=1e-6, gt=0, lt=1, description="RMSNorm epsilon.")
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        default="bfloat16", description="Matmul/activation dtype; parameters and optimizer state stay float32."
    )
    attention: AttentionKernel = Field(
        default="auto", description="Attention kernel; auto: splash on TPU, cudnn on GPU, xla elsewhere."
    )
    remat: RematPolicy = Field(default="none", description="Per-layer rematerialization (jax.checkpoint policy).")

    @model_validator(mode="before")
    @classmethod
    def _expand_preset(cls, data: Any) -> Any:
        try:
            return presets.expand(data)
        except KeyError:
            raise invalid(
                "preset", f"unknown preset {shorten(data.get('preset'))}; presets: {', '.join(presets.PRESETS)}"
            ) from None

    @property
    def ff_width(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or ``n_heads`` (multi-head attention)."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def resolve_vocab(self, data_vocab: int) -> int:
        """The embedding rows for data of ``data_vocab`` tokens: ``vocab_size``, or the data's.
        The one place the model's vocabulary is decided (``TrainConfig.vocab_size`` calls it)."""
        return self.vocab_size if self.vocab_size is not None else data_vocab

    def architecture(self, data_vocab: int) -> dict[str, Any]:
        """The keys that decide the parameters and the function they compute, defaults resolved
        (vocabulary, key/value heads, MLP width): what a run's checkpoints depend on. Without the
        preset name and the kernel/remat choices, which change neither."""
        resolved = self.model_copy(
            update={"vocab_size": self.resolve_vocab(data_vocab), "n_kv_heads": self.kv_heads, "d_ff": self.ff_width}
        )
        return resolved.model_dump(mode="json", exclude={"preset", "attention", "remat"})

    def describe(self, data_vocab: int) -> str:
        """The shape in one line, e.g. ``d_model=256 n_layers=4 n_heads=4 n_kv_heads=4 d_ff=1024
        mlp=gelu vocab_size=256 tie_embeddings=False compute_dtype=bfloat16``."""
        arch = self.architecture(data_vocab)
        keys = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "mlp", "vocab_size", "tie_embeddings")
        extra = [k for k in ("rope_theta", "norm_eps") if arch[k] != type(self).model_fields[k].default]
        return " ".join(f"{k}={arch[k]}" for k in (*keys, *extra, "compute_dtype"))

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise invalid("n_heads", f"must divide d_model={self.d_model}; got {self.n_heads}")
        if self.head_dim % 2:
            raise invalid("n_heads", f"d_model/n_heads = {self.head_dim} must be even (rotary embeddings rotate pairs)")
        if self.n_heads % self.kv_heads:
            raise invalid(
                "n_kv_heads",
                f"{self.kv_heads} must divide n_heads={self.n_heads} "
                "(each key/value head serves a group of query heads)",
            )
        return self

"""TrainConfig: the trainer's whole configuration, validated before any work starts.

The same model is read in three places and must agree everywhere:

* inside the stack file, as the value of the ``multislice:training`` key (``infra.config``);
* as ``config.json`` inside the startup script on every TPU VM (``python -m training run``);
* in tests and benchmarks, built directly.

Unknown keys are rejected. Every error names the key path (``parallelism.ici.fsdp``) and the
allowed values (:mod:`training.validation` holds the strict base model and the error lines).

Parallelism follows the Cloud TPU Multislice overview
(https://cloud.google.com/tpu/docs/multislice-introduction):
the mesh has axes ``(data, fsdp, tensor)``; inside a slice (ICI) their product is the chips
per slice, across slices (DCN) their product is the number of slices, and DCN tensor
parallelism must be 1. Those two products need the accelerator catalog and the slice count,
so ``infra.config.StackConfig`` checks them; this module checks what the trainer alone knows
(divisibility of the batch, heads and widths by the mesh axes that shard them).
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic
from pydantic import Field, field_validator, model_validator

from training.model.config import ModelConfig
from training.model.kernels import kernel_problem
from training.validation import ConfigBool, StrictModel, format_errors, invalid

#: The vocabulary of byte-level data: one token per byte (``TrainConfig.data_vocab_size``).
VOCAB_SIZE = 256

# Upper bounds: far beyond any run this trainer could make, so that a slip of the finger
# (an extra zero, a number pasted into the wrong key) stops at validation instead of queueing
# TPUs for a run that cannot finish or cannot fit. Each is well above published figures.
#: Steps of one run: 10^8 is over 3 years at 1 step/s; published pre-training runs take
#: 10^5 to 10^6 steps (PaLM 540B: 255k steps, https://arxiv.org/abs/2204.02311 §5; its widths and depth in
#: Table 1).
MAX_STEPS = 100_000_000
#: Bytes per sequence: 2^20 (1 Mi tokens), the longest contexts published today; attention
#: memory grows with its square.
MAX_SEQUENCE_LENGTH = 1 << 20
#: Sequences per step: 2^20; PaLM's largest batch was 2048 sequences (4M tokens).
MAX_GLOBAL_BATCH_SIZE = 1 << 20
#: Tokens per step (global batch × sequence length): 2^30, over 16× the largest published
#: batches (tens of millions of tokens).
MAX_GLOBAL_BATCH_TOKENS = 1 << 30

#: ``ModelConfig`` (the model's shape, training/model/config.py) is part of this module's interface.
__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "ModelConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "TrainConfig",
    "load_train_config",
    "vocabulary_mismatch",
]

MESH_AXES = ("data", "fsdp", "tensor")


class AxisSizes(StrictModel):
    """Sizes of the mesh axes over one network (ICI inside a slice, or DCN across slices)."""

    data: int = Field(default=1, ge=1, description="Data parallelism: batch split, parameters replicated.")
    fsdp: int = Field(default=1, ge=1, description="Fully sharded data parallelism: batch and parameters split.")
    tensor: int = Field(default=1, ge=1, description="Tensor (model) parallelism: heads and hidden units split.")

    @property
    def product(self) -> int:
        return self.data * self.fsdp * self.tensor


class ParallelismConfig(StrictModel):
    """Hybrid mesh shape: ``ici`` axes inside each slice, ``dcn`` axes across slices.

    The mesh axis ``a`` has size ``ici.a * dcn.a``
    (https://cloud.google.com/tpu/docs/multislice-introduction).
    """

    ici: AxisSizes = AxisSizes()
    dcn: AxisSizes = AxisSizes()

    @property
    def mesh_shape(self) -> dict[str, int]:
        """Size of each mesh axis, in ``MESH_AXES`` order."""
        return {axis: getattr(self.ici, axis) * getattr(self.dcn, axis) for axis in MESH_AXES}

    @property
    def batch_shards(self) -> int:
        """How many ways the batch is split: data × fsdp over both networks."""
        shape = self.mesh_shape
        return shape["data"] * shape["fsdp"]


class OptimizerConfig(StrictModel):
    """optax AdamW with warmup then a decay schedule, and global-norm gradient clipping."""

    peak_learning_rate: float = Field(default=3e-3, gt=0)
    warmup_steps: int = Field(default=20, ge=0)
    schedule: Literal["cosine", "linear", "constant"] = "cosine"
    end_learning_rate_fraction: float = Field(
        default=0.1, ge=0, le=1, description="Final learning rate as a fraction of the peak (cosine/linear)."
    )
    weight_decay: float = Field(default=0.1, ge=0)
    b1: float = Field(default=0.9, gt=0, lt=1)
    b2: float = Field(default=0.95, gt=0, lt=1)
    grad_clip_norm: float | None = Field(default=1.0, gt=0, description="Global-norm clip; null disables it.")


class CheckpointConfig(StrictModel):
    """Orbax checkpoint policy: save every ``interval_steps`` and at the last step."""

    interval_steps: int = Field(default=50, ge=1)
    keep: int = Field(default=3, ge=1, description="Finalized checkpoints kept (older ones are deleted).")
    async_save: ConfigBool = Field(default=True, description="Write checkpoints in the background while training.")


class DataConfig(StrictModel):
    """Where the training text comes from.

    ``source`` is ``"stdlib"`` (the Python standard library's own source files: real text
    present on every machine with Python) or a glob of text files, local or ``gs://``.
    Files are read as bytes; the split into train and eval is by file, deterministic.
    """

    source: str = Field(default="stdlib", min_length=1)

    @field_validator("source")
    @classmethod
    def _absolute_or_uri(cls, value: str) -> str:
        if value == "stdlib" or value.startswith("/") or "://" in value:
            return value
        raise ValueError(
            f"{value!r} must be 'stdlib', an absolute path/glob (the trainer runs in its own directory "
            "on every VM) or a URI like gs://bucket/dir/*.txt"
        )

    eval_fraction: float = Field(default=0.05, gt=0, lt=0.5, description="Share of files held out for eval.")
    seed: int = Field(default=0, ge=0, description="Seed of the example order (data is a pure function of the step).")


class TrainConfig(StrictModel):
    """Everything the trainer needs besides its run directory and cluster identity."""

    model: ModelConfig = ModelConfig()
    sequence_length: int = Field(
        default=256, ge=8, le=MAX_SEQUENCE_LENGTH, description="Tokens (bytes) per training sequence."
    )
    global_batch_size: int = Field(
        default=32, ge=1, le=MAX_GLOBAL_BATCH_SIZE, description="Sequences per step, summed over all slices."
    )
    microbatches: int = Field(
        default=1,
        ge=1,
        le=MAX_GLOBAL_BATCH_SIZE,
        description="Gradient accumulation: each step's per-replica batch runs in this many equal parts.",
    )
    steps: int = Field(default=200, ge=1, le=MAX_STEPS, description="Total optimizer steps of the run.")
    optimizer: OptimizerConfig = OptimizerConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    data: DataConfig = DataConfig()
    parallelism: ParallelismConfig = ParallelismConfig()
    seed: int = Field(default=0, ge=0, description="Parameter initialization seed.")
    log_every_steps: int = Field(default=10, ge=1, description="Progress log period (metrics.jsonl gets every step).")
    eval_every_steps: int = Field(default=0, ge=0, description="Eval-loss period in steps; 0 disables eval.")
    eval_batches: int = Field(default=2, ge=1, description="Global batches per eval.")
    peak_flops_per_chip: float | None = Field(
        default=None,
        gt=0,
        description="Peak dense bf16 FLOP/s of one chip, the denominator of MFU; infra.config fills it "
        "from the accelerator catalog; null: no MFU.",
    )
    min_slices: int | None = Field(
        default=None,
        ge=1,
        description="Fewest slices the run may train on (elastic: training.elastic); the program fills it from "
        "multislice:elastic.minSlices; null: exactly the slices of parallelism.dcn.",
    )
    shrink_after_s: float = Field(
        default=120.0,
        gt=0,
        description="Seconds a lost slice may stay away before the others train without it (elastic); the "
        "program fills it from multislice:elastic.shrinkAfter.",
    )
    grow_after_s: float = Field(
        default=3 * 3600.0,
        ge=0,
        description="Least seconds after a change of slice count before the run grows back (elastic); the "
        "program fills it from multislice:elastic.growAfter.",
    )

    @property
    def global_batch_tokens(self) -> int:
        """Tokens per optimizer step: global batch × sequence length."""
        return self.global_batch_size * self.sequence_length

    @property
    def data_vocab_size(self) -> int:
        """Token ids of byte-level data (ids ``0 .. 255``). A prepared dataset's vocabulary (its
        manifest) enters through ``model.vocab_size``, which the trainer fills from the data when
        the stack leaves it unset (``training.data.sources.with_vocabulary``)."""
        return VOCAB_SIZE

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary (embedding rows): ``model.vocab_size``, or the data's."""
        return self.model.resolve_vocab(self.data_vocab_size)

    @model_validator(mode="after")
    def _plausible_run(self) -> TrainConfig:
        """Sizes that no run could use, and a warmup the run never finishes (the schedule would
        clamp it: ``training.optimizer``; only a warmup the config sets to another value than the
        default is checked: the default 20 steps is clamped quietly for short runs, also where a
        config was written out with its defaults filled in, as ``train_config.json`` and
        ``multislice render --config`` write it, and read back)."""
        if self.global_batch_tokens > MAX_GLOBAL_BATCH_TOKENS:
            raise invalid(
                "global_batch_size",
                f"{self.global_batch_size} sequences × sequence_length {self.sequence_length} = "
                f"{self.global_batch_tokens:,} tokens per step, above the limit {MAX_GLOBAL_BATCH_TOKENS:,} "
                "(published runs use tens of millions)",
            )
        warmup = self.optimizer.warmup_steps
        default = type(self.optimizer).model_fields["warmup_steps"].default
        if "warmup_steps" in self.optimizer.model_fields_set and warmup != default and warmup > self.steps:
            raise invalid(
                "optimizer.warmup_steps",
                f"{warmup} is longer than the run (steps: {self.steps}): the learning rate would never reach "
                "its peak; use fewer warmup steps than steps",
            )
        return self

    @model_validator(mode="after")
    def _mesh_divides_shapes(self) -> TrainConfig:
        par = self.parallelism
        if par.dcn.tensor != 1:
            raise invalid(
                "parallelism.dcn.tensor",
                f"must be 1 (tensor parallelism over DCN is not supported); got {par.dcn.tensor}",
            )
        shape = par.mesh_shape
        shards = par.batch_shards
        if self.global_batch_size % shards:
            raise invalid(
                "global_batch_size",
                f"{self.global_batch_size} is not divisible by the data-parallel size {shards} "
                f"(ici.data×ici.fsdp×dcn.data×dcn.fsdp); use a multiple of {shards}",
            )
        per_replica = self.global_batch_size // shards
        if per_replica % self.microbatches:
            raise invalid(
                "microbatches",
                f"{self.microbatches} does not divide the per-replica batch {per_replica} (global_batch_size "
                f"{self.global_batch_size} ÷ data-parallel size {shards}); use a divisor of {per_replica}",
            )
        tensor, fsdp = shape["tensor"], shape["fsdp"]
        checks = [
            ("model.n_heads", self.model.n_heads, tensor, "tensor"),
            ("model.n_kv_heads", self.model.kv_heads, tensor, "tensor"),
            ("model.d_ff", self.model.ff_width, tensor, "tensor"),
            ("model.d_model", self.model.d_model, fsdp, "fsdp"),
        ]
        if self.vocab_size % tensor:
            if self.model.vocab_size is not None:
                raise invalid(
                    "model.vocab_size", f"{self.vocab_size} is not divisible by the tensor mesh axis size {tensor}"
                )
            raise invalid(
                "parallelism.ici.tensor", f"tensor size {tensor} must divide the vocabulary {self.vocab_size}"
            )
        for path, value, size, axis in checks:
            if value % size:
                raise invalid(path, f"{value} is not divisible by the {axis} mesh axis size {size}")
        return self

    @model_validator(mode="after")
    def _model_fits_data(self) -> TrainConfig:
        """A vocabulary that holds every token id of the data, and an attention kernel that
        takes the model's heads and the sequence length."""
        if self.model.vocab_size is not None and self.model.vocab_size < self.data_vocab_size:
            raise invalid(
                "model.vocab_size",
                f"{self.model.vocab_size} is smaller than the data's vocabulary {self.data_vocab_size}: token ids "
                f"up to {self.data_vocab_size - 1} would have no embedding; use at least {self.data_vocab_size} "
                "or null (the data's)",
            )
        problem = kernel_problem(self.model.attention, self.model, self.sequence_length)
        if problem is not None:
            raise invalid("model.attention", f"{problem}; use auto, xla or reference")
        return self


def vocabulary_mismatch(stated: int | None, data_vocab: int, tensor: int) -> Literal["smaller", "indivisible"] | None:
    """Whether a model whose ``model.vocab_size`` is ``stated`` (None: it takes the data's) can
    train on data of ``data_vocab`` token ids with a tensor mesh axis of size ``tensor``:
    ``"smaller"`` (ids at or above ``stated`` would have no embedding row), ``"indivisible"``
    (the resolved vocabulary is not a multiple of ``tensor``, over which the embedding is
    sharded), or None. The one rule behind the trainer's check (``training.data.sources.with_vocabulary``)
    and the one at plan and preview (``infra.config.dataset``), each phrasing its own message."""
    if stated is not None and stated < data_vocab:
        return "smaller"
    if (stated if stated is not None else data_vocab) % tensor:
        return "indivisible"
    return None


def load_train_config(data: dict[str, Any] | str | bytes) -> TrainConfig:
    """Parse a TrainConfig from a mapping or JSON text.

    Raises:
      ValueError: one line per invalid key, each naming its key path.
    """
    try:
        if isinstance(data, (str, bytes)):
            return TrainConfig.model_validate_json(data)
        return TrainConfig.model_validate(data)
    except pydantic.ValidationError as err:
        raise ValueError("invalid trainer config:\n  " + "\n  ".join(format_errors(err, model=TrainConfig))) from None

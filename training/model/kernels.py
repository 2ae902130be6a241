"""Which attention kernel runs, and which shapes each fused kernel takes: no jax, so the
trainer's config validation and the planner (``multislice plan``) decide as the trainer does.
The kernels themselves: ``training.model.attention``; sources: docs/model.md."""

from __future__ import annotations

from typing import Protocol


class AttentionShape(Protocol):
    """What the kernel choice reads of a model's configuration (``training.config.ModelConfig``
    has each as a field or property); a protocol, so that the config, which validates with
    :func:`kernel_problem`, and this module need not import each other."""

    @property
    def attention(self) -> str: ...  # "auto" or a kernel name (training.config.ATTENTION_KERNELS)

    @property
    def compute_dtype(self) -> str: ...  # "float32" or "bfloat16"

    @property
    def d_model(self) -> int: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def head_dim(self) -> int: ...  # d_model / n_heads


#: What each fused kernel takes (checked at validation):
#: cuDNN flash attention: bf16/fp16 inputs, head dim a multiple of 8 and at most 256 (128 before
#: Hopper; jax/_src/cudnn/fused_attention_stablehlo.py, ``check_is_flash_attention``). Splash
#: attention (Pallas, TPU): sequences in whole 128-token blocks and head dims of whole 128-lane
#: vregs, as the kernel's tests exercise them (jax tests/pallas/tpu_splash_attention_kernel_test.py:
#: head_dim 128 or 256; block sizes 128-512).
CUDNN_HEAD_DIM_MULTIPLE, CUDNN_MAX_HEAD_DIM = 8, 256
SPLASH_LANES = 128


def attention_kernel(model: AttentionShape, platform: str, sequence_length: int) -> str:
    """The kernel ``model.attention`` runs on ``platform`` (``jax.default_backend()``: ``tpu``,
    ``gpu``/``cuda``/``rocm``, ``cpu``): itself unless ``auto``, which picks ``splash`` on TPU and
    ``cudnn`` on NVIDIA GPUs where the kernel takes the shapes (:func:`kernel_problem`), else
    ``xla`` (``jax.nn.dot_product_attention``'s XLA implementation)."""
    if model.attention != "auto":
        return model.attention
    if platform == "tpu" and kernel_problem("splash", model, sequence_length) is None:
        return "splash"
    if platform in ("gpu", "cuda") and kernel_problem("cudnn", model, sequence_length) is None:
        return "cudnn"
    return "xla"


def kernel_problem(kernel: str, model: AttentionShape, sequence_length: int) -> str | None:
    """Why ``kernel`` cannot take this model's attention, or None (limits: the constants above)."""
    k = model.head_dim
    if kernel == "cudnn":
        if model.compute_dtype != "bfloat16":
            return (
                "cudnn needs compute_dtype bfloat16 (cuDNN flash attention takes 16-bit inputs); "
                f"got {model.compute_dtype}"
            )
        if k % CUDNN_HEAD_DIM_MULTIPLE or k > CUDNN_MAX_HEAD_DIM:
            return (
                f"cudnn takes head dimensions that are multiples of {CUDNN_HEAD_DIM_MULTIPLE} up to "
                f"{CUDNN_MAX_HEAD_DIM}; d_model/n_heads = {model.d_model}/{model.n_heads} = {k}"
            )
    if kernel == "splash":
        if k % SPLASH_LANES:
            return (
                f"splash takes head dimensions that are multiples of {SPLASH_LANES}; "
                f"d_model/n_heads = {model.d_model}/{model.n_heads} = {k}"
            )
        if sequence_length % SPLASH_LANES:
            return f"splash takes sequence lengths that are multiples of {SPLASH_LANES}; got {sequence_length}"
    return None

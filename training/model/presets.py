"""Named model shapes a stack selects with ``model: {preset: NAME}`` and may override key by key
(``model: {preset: llama-3.2-1b, n_layers: 8}``): plain ``ModelConfig`` keys, no jax.

``byte`` is the trainer's own default model (every ``ModelConfig`` default: a 4-layer byte-level
transformer). The others are the shapes of published Llama-architecture models (pre-norm RMSNorm,
rotary positions, SwiGLU MLP, grouped-query attention, no biases), taken from each model's
``config.json`` on the Hugging Face Hub (the file ``transformers``' ``LlamaConfig`` reads:
``hidden_size`` → ``d_model``, ``num_hidden_layers`` → ``n_layers``, ``num_attention_heads`` →
``n_heads``, ``num_key_value_heads`` → ``n_kv_heads``, ``intermediate_size`` → ``d_ff``,
``vocab_size``, ``tie_word_embeddings`` → ``tie_embeddings``, ``rope_theta``, ``rms_norm_eps``
→ ``norm_eps``) and, for the widths and depths, the papers' tables:

* Llama 2: Touvron et al. 2023, "Llama 2: Open Foundation and Fine-Tuned Chat Models",
  arXiv:2307.09288, Table 1 (sizes, GQA for 70B); https://huggingface.co/meta-llama/Llama-2-7b-hf,
  ``Llama-2-13b-hf``, ``Llama-2-70b-hf`` (``config.json``).
* Llama 3.1: Llama Team 2024, "The Llama 3 Herd of Models", arXiv:2407.21783, Table 3 (layers,
  model dimension, FFN dimension, heads, key/value heads, vocabulary, RoPE θ 500,000);
  https://huggingface.co/meta-llama/Llama-3.1-8B, ``Llama-3.1-70B``.
* Llama 3.2 1B and 3B (tied embeddings): https://huggingface.co/meta-llama/Llama-3.2-1B,
  ``Llama-3.2-3B`` (``config.json``).
* SmolLM2-135M, the ~125M-parameter Llama-architecture model (``LlamaForCausalLM``, tied
  embeddings): Allal et al. 2025, "SmolLM2", arXiv:2502.02737;
  https://huggingface.co/HuggingFaceTB/SmolLM2-135M (``config.json``).

Llama 3.x's long-context RoPE frequency scaling (``rope_scaling``) is not modelled: it changes
neither a shape nor a FLOP. :data:`PUBLISHED_PARAMETERS` holds each model's parameter count as
its Hub page prints it (three significant figures); tests/training/test_presets.py checks
``training.model.shapes.param_count`` of every preset against it.
"""

from __future__ import annotations

from typing import Any

_LLAMA: dict[str, Any] = {"mlp": "swiglu", "norm_eps": 1e-5}
_LLAMA_2: dict[str, Any] = _LLAMA | {"vocab_size": 32_000, "rope_theta": 10_000.0}
_LLAMA_3: dict[str, Any] = _LLAMA | {"vocab_size": 128_256, "rope_theta": 500_000.0}

#: Preset name -> ModelConfig keys. ``byte`` is empty: the ModelConfig defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "byte": {},
    "smollm2-135m": _LLAMA
    | {
        "d_model": 576,
        "n_layers": 30,
        "n_heads": 9,
        "n_kv_heads": 3,
        "d_ff": 1536,
        "vocab_size": 49_152,
        "tie_embeddings": True,
        "rope_theta": 10_000.0,
    },
    "llama-3.2-1b": _LLAMA_3
    | {"d_model": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "d_ff": 8192, "tie_embeddings": True},
    "llama-3.2-3b": _LLAMA_3
    | {"d_model": 3072, "n_layers": 28, "n_heads": 24, "n_kv_heads": 8, "d_ff": 8192, "tie_embeddings": True},
    "llama-2-7b": _LLAMA_2 | {"d_model": 4096, "n_layers": 32, "n_heads": 32, "d_ff": 11_008},
    "llama-3.1-8b": _LLAMA_3 | {"d_model": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8, "d_ff": 14_336},
    "llama-2-13b": _LLAMA_2 | {"d_model": 5120, "n_layers": 40, "n_heads": 40, "d_ff": 13_824},
    "llama-2-70b": _LLAMA_2 | {"d_model": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "d_ff": 28_672},
    "llama-3.1-70b": _LLAMA_3 | {"d_model": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8, "d_ff": 28_672},
}

#: Parameter counts as the models' Hugging Face Hub pages print them ("Model size"), for the
#: test that counts each preset's parameters from its shapes; ``byte`` has no published figure.
PUBLISHED_PARAMETERS: dict[str, float] = {
    "smollm2-135m": 135e6,
    "llama-3.2-1b": 1.24e9,
    "llama-3.2-3b": 3.21e9,
    "llama-2-7b": 6.74e9,
    "llama-3.1-8b": 8.03e9,
    "llama-2-13b": 13.0e9,
    "llama-2-70b": 69.0e9,
    "llama-3.1-70b": 70.6e9,
}


def expand(data: Any) -> Any:
    """``data`` (a ModelConfig mapping) with its ``preset``'s keys under its own: a key the
    mapping sets wins. Anything else is returned unchanged.

    Raises:
      KeyError: an unknown preset name (the caller lists :data:`PRESETS`).
    """
    if not isinstance(data, dict) or data.get("preset") is None:
        return data
    name = data["preset"]
    if not isinstance(name, str) or name not in PRESETS:
        raise KeyError(name)
    return PRESETS[name] | data

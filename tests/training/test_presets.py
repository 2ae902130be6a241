"""training.model.presets: named model shapes, selected by ``model.preset`` and overridden key by key;
each Llama-architecture preset's parameter count, computed from training.model.shapes, is the one its
model page publishes (within 0.5 %: the pages print three significant figures)."""

from __future__ import annotations

import pytest

from training.config import ModelConfig, TrainConfig, load_train_config
from training.model import presets, shapes

#: The exact counts of the published checkpoints (the sum of their tensors' elements, as
#: ``transformers`` counts them), recomputed here by hand from each config.json: embedding
#: V·D (twice when untied) + L·(D·H·K + 2·D·G·K + H·K·D + 3·D·F + 2·D) + D.
EXACT = {
    "smollm2-135m": 134_515_008,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-2-7b": 6_738_415_616,
    "llama-3.1-8b": 8_030_261_248,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-3.1-70b": 70_553_706_496,
}


def count(name: str) -> int:
    model = ModelConfig(preset=name)
    return shapes.param_count(model, model.resolve_vocab(256))


@pytest.mark.parametrize("name", list(presets.PUBLISHED_PARAMETERS))
def test_each_presets_parameter_count_is_the_published_one(name):
    assert count(name) == pytest.approx(presets.PUBLISHED_PARAMETERS[name], rel=0.005)
    assert count(name) == EXACT[name]


def test_the_presets_span_125m_to_70b_and_byte_is_the_default_model():
    assert set(presets.PRESETS) == {"byte", *presets.PUBLISHED_PARAMETERS}
    assert ModelConfig(preset="byte").architecture(256) == ModelConfig().architecture(256)
    assert TrainConfig().model == ModelConfig()
    sizes = sorted(count(name) for name in presets.PUBLISHED_PARAMETERS)
    assert 100e6 < sizes[0] < 150e6 and 65e9 < sizes[-1] < 75e9


def test_a_stack_overrides_a_preset_key_by_key():
    cfg = load_train_config({"model": {"preset": "llama-3.2-1b", "n_layers": 2, "vocab_size": None}})
    model = cfg.model
    assert (model.preset, model.n_layers, model.d_model, model.n_kv_heads, model.mlp) == (
        "llama-3.2-1b",
        2,
        2048,
        8,
        "swiglu",
    )
    assert cfg.vocab_size == 256  # null: the data's vocabulary (bytes)
    # Written out and read back (train_config.json, the startup script's config.json): the same.
    assert load_train_config(cfg.model_dump_json()) == cfg


def test_an_unknown_preset_is_one_line_listing_the_presets():
    with pytest.raises(ValueError) as err:
        load_train_config({"model": {"preset": "llama-9b"}})
    assert str(err.value) == (
        "invalid trainer config:\n  model.preset: unknown preset 'llama-9b'; presets: byte, smollm2-135m, "
        "llama-3.2-1b, llama-3.2-3b, llama-2-7b, llama-3.1-8b, llama-2-13b, llama-2-70b, llama-3.1-70b"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"model": {"n_heads": 4, "n_kv_heads": 3}},
            "model.n_kv_heads: 3 must divide n_heads=4 (each key/value head serves a group of query heads)",
        ),
        (
            {"model": {"vocab_size": 200}},
            "model.vocab_size: 200 is smaller than the data's vocabulary 256: token ids up to 255 would have no "
            "embedding; use at least 256 or null (the data's)",
        ),
        (
            {"model": {"n_heads": 4, "n_kv_heads": 1}, "parallelism": {"ici": {"tensor": 2}}},
            "model.n_kv_heads: 1 is not divisible by the tensor mesh axis size 2",
        ),
        (
            {"model": {"vocab_size": 257}, "parallelism": {"ici": {"tensor": 2}}},
            "model.vocab_size: 257 is not divisible by the tensor mesh axis size 2",
        ),
        (
            {"global_batch_size": 8, "microbatches": 3, "parallelism": {"ici": {"data": 2}}},
            "microbatches: 3 does not divide the per-replica batch 4 (global_batch_size 8 ÷ data-parallel size 2); "
            "use a divisor of 4",
        ),
        ({"model": {"mlp": "relu"}}, "model.mlp: got 'relu'; allowed: 'gelu' or 'swiglu'"),
        (
            {"model": {"remat": "some"}},
            "model.remat: got 'some'; allowed: 'none', 'full', 'dots_saveable' or 'dots_with_no_batch_dims_saveable'",
        ),
    ],
)
def test_bad_model_input_is_one_line_naming_the_key(data, message):
    with pytest.raises(ValueError) as err:
        load_train_config(data)
    assert str(err.value) == f"invalid trainer config:\n  {message}"

"""training.checkpoint.manager.check_run_config: what an existing run directory lets a config
change (parallelism, slice count, steps, schedule, checkpoint policy) and what it refuses
(model, global batch, sequence length, data, seed) with one line naming both sides; the
trainer turns a refusal into exit 78 (EXIT_CONFIG) before it builds a mesh or restores."""

from __future__ import annotations

import json
import logging

import pytest

from training import train
from training.checkpoint import manager as checkpointing
from training.checkpoint.manager import RunConfigMismatch, check_run_config, record_run_config
from training.cluster import ClusterIdentity
from training.config import TrainConfig
from training.model.shapes import param_count
from training.run_dir import RunDir

RECORDED = TrainConfig.model_validate(
    {
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "compute_dtype": "float32"},
        "sequence_length": 32,
        "global_batch_size": 8,
        "steps": 12,
        "parallelism": {"ici": {"data": 2, "fsdp": 2, "tensor": 2}},
    }
)


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    run = RunDir(str(tmp_path / "run"))
    record_run_config(run, RECORDED)
    return run


def changed(**update) -> TrainConfig:
    """RECORDED with ``update`` applied (nested dicts merged), validated."""
    data = json.loads(RECORDED.model_dump_json())
    for key, value in update.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and isinstance(data.get(key), dict) else value
    return TrainConfig.model_validate(data)


@pytest.mark.parametrize(
    "update",
    [
        {"parallelism": {"ici": {"data": 1, "fsdp": 8, "tensor": 1}, "dcn": {"data": 1, "fsdp": 1, "tensor": 1}}},
        {"parallelism": {"ici": {"data": 1, "fsdp": 4, "tensor": 1}, "dcn": {"data": 2, "fsdp": 1, "tensor": 1}}},
        {"steps": 40},
        {"optimizer": {"peak_learning_rate": 1e-3, "warmup_steps": 3}},
        {"checkpoint": {"interval_steps": 3, "keep": 5, "async_save": False}},
        {"log_every_steps": 1, "eval_every_steps": 4},
        {"microbatches": 2},
        {"model": {"attention": "reference", "remat": "full"}},
        {"model": {"preset": "byte", "d_model": 32, "n_layers": 1, "n_heads": 2}},  # the same shape, named
        {"model": {"n_kv_heads": 2, "d_ff": 128, "vocab_size": 256}},  # the defaults, written out
    ],
)
def test_what_may_change_between_attempts(run_dir, update):
    check_run_config(run_dir, changed(**update))  # no exception


def model_line(model) -> str:
    return (
        f"d_model={model.d_model} n_layers={model.n_layers} n_heads={model.n_heads} n_kv_heads={model.kv_heads} "
        f"d_ff={model.ff_width} mlp={model.mlp} vocab_size={model.vocab_size or 256} "
        f"tie_embeddings={model.tie_embeddings} compute_dtype={model.compute_dtype}, "
        f"{param_count(model, model.vocab_size or 256):,} parameters"
    )


@pytest.mark.parametrize(
    "model",
    [
        {"d_model": 64},
        {"n_layers": 3},
        {"n_heads": 4},
        {"d_ff": 64},
        {"d_model": 48, "n_layers": 2, "n_heads": 4, "d_ff": 96},
        {"mlp": "swiglu"},
        {"n_heads": 4, "n_kv_heads": 2},
        {"tie_embeddings": True},
        {"vocab_size": 512},
    ],
)
def test_another_model_is_refused_with_both_shapes(run_dir, model):
    asked = changed(model=model)
    with pytest.raises(RunConfigMismatch) as err:
        check_run_config(run_dir, asked)
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        f"run directory {run_dir} holds a run with different training.model: "
        f"training.model: the run directory has {model_line(RECORDED.model)}, "
        f"the config asks {model_line(asked.model)}; "
        "use a new multislice:runName (or `multislice local up --fresh`) to start a new run"
    )
    assert model_line(RECORDED.model) != model_line(asked.model)


@pytest.mark.parametrize(
    ("key", "value"),
    [("global_batch_size", 16), ("sequence_length", 64), ("seed", 3), ("data", {"source": "/corpus/*.txt"})],
)
def test_what_identifies_the_run_is_refused_with_both_values(run_dir, key, value):
    asked = changed(**{key: value})
    with pytest.raises(RunConfigMismatch) as err:
        check_run_config(run_dir, asked)
    recorded_value = json.dumps(json.loads(RECORDED.model_dump_json())[key], sort_keys=True)
    asked_value = json.dumps(json.loads(asked.model_dump_json())[key], sort_keys=True)
    assert f"training.{key}: the run directory has {recorded_value}, the config asks {asked_value}" in str(err.value)


def test_every_difference_is_named_in_one_line(run_dir):
    asked = changed(model={"n_layers": 2}, global_batch_size=16)
    with pytest.raises(RunConfigMismatch) as err:
        check_run_config(run_dir, asked)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"run directory {run_dir} holds a run with different training.model, training.global_batch_size: "
    )
    assert "training.global_batch_size: the run directory has 8, the config asks 16" in message


def test_a_new_run_directory_accepts_any_config(tmp_path):
    check_run_config(RunDir(str(tmp_path / "new")), changed(model={"d_model": 64}))


def test_the_trainer_exits_78_with_the_message_before_any_work(run_dir, caplog, monkeypatch):
    def no_mesh(*args, **kwargs):
        raise AssertionError("the trainer built a mesh for a run directory of another model")

    monkeypatch.setattr(train.mesh_lib, "build_mesh", no_mesh)
    asked = changed(model={"d_model": 64})
    with caplog.at_level(logging.ERROR, logger="training"):
        code = train.main(asked, str(run_dir), ClusterIdentity.single_process())
    assert code == train.EXIT_CONFIG == 78
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage().startswith("configuration error: run directory ")
    assert (
        f"the run directory has {model_line(RECORDED.model)}, the config asks {model_line(asked.model)}"
        in record.getMessage()
    )
    assert json.loads(run_dir.read(checkpointing.RUN_CONFIG_FILE))["model"]["d_model"] == 32  # record kept


def test_a_record_written_before_the_model_options_existed_still_matches(tmp_path):
    # train_config.json as the trainer wrote it before presets, GQA, SwiGLU, tied embeddings,
    # vocab_size, rope_theta, norm_eps, attention, remat and microbatches existed.
    run = RunDir(str(tmp_path / "run"))
    old = json.loads(RECORDED.model_dump_json())
    old["model"] = {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": None, "compute_dtype": "float32"}
    del old["microbatches"]
    run.write(checkpointing.RUN_CONFIG_FILE, json.dumps(old).encode())
    check_run_config(run, RECORDED)  # no exception
    with pytest.raises(RunConfigMismatch, match="the config asks d_model=32 n_layers=1 n_heads=4 n_kv_heads=2 "):
        check_run_config(run, changed(model={"n_heads": 4, "n_kv_heads": 2}))

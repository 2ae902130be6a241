"""infra.planner.compiled and training.aot: the planner's per-chip estimate against XLA's
compiled memory of the real train step, on virtual CPU meshes (abstract shapes: nothing is
allocated).

The presets walked are those whose step compiles here in seconds: ``byte`` (the default
model), ``smollm2-135m`` (the ~125M preset, all 30 layers) and ``llama-3.2-1b`` with 2 of its
16 layers (the layers run in one ``lax.scan``, so the compile does not grow with depth, but 16
layers of float32 state and activations make a compile on this 2-core machine take no longer,
only the figures larger; 2 keep the test quick while every per-layer term is exercised). The
3B-70B presets differ from these only in sizes. Each is compared in float32 and in bfloat16
(the default compute dtype).
"""

from __future__ import annotations

import jax
import pytest
from typer.testing import CliRunner

from infra.cli import app
from infra.planner import compiled
from infra.planner.memory import memory_per_chip
from training import aot
from training.config import TrainConfig

CASES = {
    "byte-fsdp2-tensor2": {"model": {}, "parallelism": {"ici": {"fsdp": 2, "tensor": 2}}},
    "smollm2-135m-fsdp4-remat-full": {
        "model": {"preset": "smollm2-135m", "remat": "full"},
        "global_batch_size": 8,
        "parallelism": {"ici": {"fsdp": 4}},
    },
    "llama-3.2-1b-2-layers-microbatches-2": {
        "model": {"preset": "llama-3.2-1b", "n_layers": 2},
        "global_batch_size": 2,
        "microbatches": 2,
    },
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("keys", CASES.values(), ids=CASES.keys())
def test_estimate_is_within_a_quarter_of_xla(keys, dtype):
    train = TrainConfig.model_validate(keys | {"model": keys["model"] | {"compute_dtype": dtype}})
    xla = aot.compiled_memory(train, jax.devices())
    estimate = memory_per_chip(train, 2**40, "cpu")
    assert xla.platform == "cpu" and xla.devices == aot.mesh_devices(train)
    assert xla.total == xla.argument + xla.output - xla.alias + xla.temp
    state = estimate.parameters + estimate.optimizer_state  # float32 params, mu and nu, sharded
    assert xla.alias >= state  # donated: the new state reuses the old one's buffers, counted once
    assert abs(estimate.total / xla.total - 1) <= compiled.AGREEMENT, (estimate, xla)


@pytest.mark.slow  # a subprocess: jax's start-up and a compile
def test_plan_compile_prints_xla_beside_the_estimate():
    result = CliRunner().invoke(app, ["plan", "--stack", "dev", "--compile"])
    assert result.exit_code == 0, result.output
    assert "compiled (XLA, cpu, 8 virtual devices)" in result.output
    assert "planner estimate for the same step on cpu" in result.output and "agrees within ±25%" in result.output


def test_plain_plan_and_preview_never_compile(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("compiled without --compile")

    monkeypatch.setattr(compiled, "compiled_memory", refuse)
    result = CliRunner().invoke(app, ["plan", "--stack", "dev"])
    assert result.exit_code == 0 and "compiled (XLA" not in result.output


def test_a_mesh_too_large_to_compile_is_one_error():
    train = TrainConfig.model_validate({"global_batch_size": 8192, "parallelism": {"ici": {"data": 8192}}})
    with pytest.raises(compiled.CompileError, match="8192 devices"):
        compiled.compiled_memory(train)

"""The planner's estimate against XLA's: compile the real train step for the stack's mesh on a
virtual CPU mesh and compare (``multislice plan --compile``).

:func:`compiled_memory` starts ``python -m training.aot`` (:mod:`training.aot`) in a fresh
process with ``JAX_PLATFORMS=cpu`` and ``JAX_NUM_CPU_DEVICES`` = the mesh's device count (jax
fixes its CPU device count when it starts, so the count cannot be chosen inside an
already-running process), hands it the stack's ``TrainConfig`` as JSON and reads XLA's
per-device figure back: the train step is lowered from ``jax.ShapeDtypeStruct`` arguments and
compiled ahead of time; nothing is allocated. The figure is ``argument + output − alias +
temp`` of XLA's ``CompiledMemoryStats`` (the formula and its source: :mod:`training.aot`).

:func:`compare` sets it beside :func:`infra.planner.memory.memory_per_chip` for the same
config on the platform the compile ran on (``cpu``: ``model.attention: auto`` runs ``xla`` there,
materializing the scores, where a TPU runs splash). Measured agreement (docs/model.md): within
±25 % in float32 and in bfloat16.

Never called by ``pulumi preview``/``up`` or by a plain ``multislice plan``: a compile takes
seconds to minutes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from infra.planner.memory import MemoryEstimate, memory_per_chip
from training.config import TrainConfig

__all__ = ["AGREEMENT", "MAX_COMPILE_DEVICES", "CompileError", "CompiledComparison", "compare", "compiled_memory"]

#: The agreement the planner's estimate is held to (tests/planner/test_compiled.py): within
#: ±25 % of XLA's compiled figure.
AGREEMENT = 0.25

#: Largest mesh compiled on virtual CPU devices: one process holds one CPU device per chip.
MAX_COMPILE_DEVICES = 4096

_ROOT = Path(__file__).resolve().parents[2]


class CompileError(RuntimeError):
    """The ahead-of-time compile failed or took too long (the message says which)."""


def compiled_memory(train: TrainConfig, timeout_s: float = 600.0) -> dict[str, int | str]:
    """XLA's per-device memory of ``train``'s train step on a virtual CPU mesh of its size:
    ``training.aot.CompiledMemory.to_json()`` (bytes: ``argument``, ``output``, ``alias``,
    ``temp``, ``generated_code``, ``total``; ``devices``; ``platform``).

    Raises:
      CompileError: more than :data:`MAX_COMPILE_DEVICES` devices, a failed compile (its last
        stderr line) or one over ``timeout_s`` seconds.
    """
    devices = math.prod(train.parallelism.mesh_shape.values())
    if devices > MAX_COMPILE_DEVICES:
        raise CompileError(f"the mesh has {devices} devices; compiling on more than {MAX_COMPILE_DEVICES} is not tried")
    env = os.environ | {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": str(devices)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "training.aot"],
            input=train.model_dump_json(),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise CompileError(f"the compile took longer than {timeout_s:g} s") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise CompileError(f"the compile failed: {lines[-1]}")
    return json.loads(done.stdout)


@dataclasses.dataclass(frozen=True)
class CompiledComparison:
    """XLA's compiled bytes per device beside the planner's estimate for the same config.

    ``xla``: :func:`compiled_memory`'s document; ``estimate``: ``memory_per_chip`` on
    ``xla["platform"]``; ``ratio`` = estimate ÷ XLA's total; ``agrees``: within
    :data:`AGREEMENT`."""

    xla: dict[str, int | str]
    estimate: MemoryEstimate
    ratio: float
    agrees: bool

    def to_json(self) -> dict:
        return {
            "xla_bytes_per_device": self.xla,
            "estimated_bytes_per_device": self.estimate.total,
            "ratio": self.ratio,
            "agrees": self.agrees,
        }


def compare(train: TrainConfig, hbm_capacity_bytes: int, timeout_s: float = 600.0) -> CompiledComparison:
    """Compile ``train`` (:func:`compiled_memory`) and set the planner's estimate beside it.

    Raises:
      CompileError: see :func:`compiled_memory`.
    """
    xla = compiled_memory(train, timeout_s)
    estimate = memory_per_chip(train, hbm_capacity_bytes, str(xla["platform"]))
    ratio = estimate.total / int(xla["total"])
    return CompiledComparison(xla=xla, estimate=estimate, ratio=ratio, agrees=abs(ratio - 1) <= AGREEMENT)

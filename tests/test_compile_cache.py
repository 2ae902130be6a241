"""training.compile_cache: a second process with the same run directory loads the compiled
executable from the cache instead of compiling it (what a restarted trainer does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from training import compile_cache

ROOT = Path(__file__).resolve().parents[1]

PROGRAM = """
import json, sys
import jax, jax.numpy as jnp
from training import compile_cache
compile_cache.enable(sys.argv[1])
step = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0))
step(jnp.ones((32, 32))).block_until_ready()
stats = compile_cache.stats()
print(json.dumps({"hits": stats.hits, "seconds_saved": stats.seconds_saved}))
"""


def _process(run_dir: str, **extra: str) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "JAX_PLATFORMS": "cpu",
    }
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop(compile_cache.SHARED_DIR_ENV, None)
    env.update(extra)
    done = subprocess.run([sys.executable, "-c", PROGRAM, run_dir], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_restarted_process_loads_the_executable_from_the_run_directory(tmp_path):
    run_dir = str(tmp_path / "runs" / "r1")
    first = _process(run_dir)
    assert first["hits"] == 0
    entries = list(Path(compile_cache.cache_dir(run_dir)).iterdir())
    assert entries, "the first process wrote nothing to the cache"
    second = _process(run_dir)
    assert second["hits"] >= 1
    assert second["seconds_saved"] >= 0.0
    # Another run directory starts cold: the cache is the run's, not the machine's.
    assert _process(str(tmp_path / "runs" / "r2"))["hits"] == 0


def test_the_cache_lives_in_the_run_directory():
    assert compile_cache.cache_dir("gs://b/runs/r1/") == "gs://b/runs/r1/compilation_cache"
    assert compile_cache.cache_dir("/tmp/run") == "/tmp/run/compilation_cache"


def test_a_shared_cache_directory_serves_every_run_directory(tmp_path):
    shared = {compile_cache.SHARED_DIR_ENV: str(tmp_path / "shared")}
    assert _process(str(tmp_path / "runs" / "r1"), **shared)["hits"] == 0
    assert list((tmp_path / "shared").iterdir())
    assert _process(str(tmp_path / "runs" / "r2"), **shared)["hits"] >= 1  # another run, same program
    assert not Path(compile_cache.cache_dir(str(tmp_path / "runs" / "r1"))).exists()

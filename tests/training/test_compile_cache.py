"""training.compile_cache: a second process with the same run directory loads the compiled
executable from the cache instead of compiling it (what a restarted trainer does)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from training import compile_cache

ROOT = Path(__file__).resolve().parents[2]

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


def _env(**extra: str) -> dict[str, str]:
    """A CPU JAX process's environment that uses the run directory's cache, not a shared one."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop(compile_cache.SHARED_DIR_ENV, None)
    return env | extra


def _process(run_dir: str, **extra: str) -> dict:
    env = _env(**extra)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, run_dir], env=env, capture_output=True, text=True, timeout=300
    )
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


JOB = """
import json, sys
import numpy as np
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from training import compile_cache

run_dir, process_id, port, result = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
compile_cache.enable(run_dir)
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "fsdp"))
sharding = NamedSharding(mesh, P("data", "fsdp"))
x = jax.make_array_from_callback((8, 4), sharding, lambda index: np.arange(32.0).reshape(8, 4)[index])
step = jax.jit(lambda x: (x @ x.T).sum(axis=0), out_shardings=NamedSharding(mesh, P()))
y = np.asarray(step(x).addressable_data(0)).tolist()
with open(result, "w") as out:
    json.dump({"hits": compile_cache.stats().hits, "y": y}, out)
jax.distributed.shutdown()
"""


def _job(run_dir: str) -> list[dict]:
    """A 2-process CPU job (2 devices each) that jits one sharded program: each process's
    cache hits and result, from a file of its own (gloo's threads write to the processes' stdout
    in pieces, which may land in the middle of a printed line)."""
    from tests.trainer_process import free_port

    env = _env(JAX_NUM_CPU_DEVICES="2")
    port = str(free_port())
    results = [Path(run_dir).with_name(f"result-{i}.json") for i in range(2)]
    for result in results:
        result.unlink(missing_ok=True)  # the previous job's
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", JOB, run_dir, str(i), port, str(results[i])],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [proc.communicate(timeout=300) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], [err[-3000:] for _, err in outs]
    return [json.loads(result.read_text()) for result in results]


def test_every_process_of_a_restarted_cpu_job_loads_what_process_0_wrote(tmp_path):
    # JAX writes entries from process 0 only; on CPU the other processes find them only
    # because compile_cache keys CPU devices alike in every process.
    run_dir = str(tmp_path / "run")
    first = _job(run_dir)
    # Cold: process 0 finds nothing (it alone writes). Process 1 may already find an entry
    # process 0 wrote a moment before, if it compiles later.
    assert first[0]["hits"] == 0
    second = _job(run_dir)
    assert all(p["hits"] >= 1 for p in second), second
    expected = (np.arange(32.0).reshape(8, 4) @ np.arange(32.0).reshape(8, 4).T).sum(axis=0).tolist()
    assert [p["y"] for p in first + second] == [expected] * 4


CHECKED = """
import json, sys
import jax, jax.numpy as jnp
from training import compile_cache
compile_cache.enable(sys.argv[1])
step = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0))
y = step(jnp.arange(1024.0).reshape(32, 32) / 1024).block_until_ready()
print(json.dumps({"hits": compile_cache.stats().hits, "y": [float(v) for v in y]}))
"""


def _checked_process(run_dir: str) -> tuple[dict, list[str]]:
    """One process of CHECKED: its result and the compilation cache's warnings (stderr lines)."""
    done = subprocess.run(
        [sys.executable, "-c", CHECKED, run_dir], env=_env(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("compilation cache ")]
    return json.loads(done.stdout.strip().splitlines()[-1]), warnings


def test_damaged_entries_and_entries_of_another_jax_version_are_compiled_again_with_one_warning(tmp_path):
    run_dir = str(tmp_path / "run")
    cold, warnings = _checked_process(run_dir)
    assert cold["hits"] == 0 and warnings == []
    entries = sorted(Path(compile_cache.cache_dir(run_dir)).glob("*-cache"))
    assert len(entries) >= 2
    for n, entry in enumerate(entries):
        data = bytearray(entry.read_bytes())
        if n % 2:  # a flipped byte in the executable
            data[-len(data) // 3] ^= 0xFF
        else:  # the same bytes, framed as another JAX version wrote them
            data = data.replace(compile_cache._versions(), b"jax 0.0.1 jaxlib 0.0.1\n", 1)
        entry.write_bytes(bytes(data))
    damaged, warnings = _checked_process(run_dir)
    assert damaged["hits"] == 0 and damaged["y"] == cold["y"]  # compiled again, never loaded
    assert len(warnings) == 1 and "ignoring entry" in warnings[0], warnings
    rewritten, warnings = _checked_process(run_dir)  # process 0 replaced every bad entry
    assert rewritten["hits"] >= 1 and rewritten["y"] == cold["y"] and warnings == []


def test_a_cache_directory_that_cannot_be_created_leaves_the_run_uncached_with_one_warning(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    result, warnings = _checked_process(str(tmp_path / "file" / "run"))
    assert result["hits"] == 0 and len(result["y"]) == 32
    assert len(warnings) == 1 and "cannot be used" in warnings[0] and "continuing without it" in warnings[0], warnings


class _Entries:
    """JAX's cache interface over a dict; ``fail`` makes reads or writes raise."""

    def __init__(self, fail: str = ""):
        self.entries: dict[str, bytes] = {}
        self.fail = fail

    def get(self, key: str) -> bytes | None:
        if self.fail == "read":
            raise OSError("read failed")
        return self.entries.get(key)

    def put(self, key: str, value: bytes) -> None:
        if self.fail == "write":
            raise PermissionError("read-only")
        self.entries.setdefault(key, value)


def test_an_entry_comes_back_only_as_written_by_this_jax(caplog):
    base = _Entries()
    cache = compile_cache.CheckedCache(base, "gs://b/compilation-cache")
    cache.put("k", b"executable")
    assert cache.get("k") == b"executable" and cache.get("missing") is None
    framed = base.entries["k"]
    assert framed.startswith(compile_cache.ENTRY_MAGIC + compile_cache._versions())
    base.entries["truncated"] = framed[:-3]
    base.entries["unframed"] = b"what JAX alone writes"
    base.entries["other"] = framed.replace(compile_cache._versions(), b"jax 0.4.1 jaxlib 0.4.1\n")
    with caplog.at_level("WARNING", logger=compile_cache.__name__):
        assert [cache.get(k) for k in ("other", "truncated", "unframed")] == [None, None, None]
    assert len(caplog.records) == 1  # one warning per process, whatever the number of entries
    assert "written by jax 0.4.1 jaxlib 0.4.1, this is jax " in caplog.records[0].getMessage()


def test_a_failed_write_ends_the_writes_with_one_warning_and_a_failed_read_is_a_miss(caplog):
    unwritable = compile_cache.CheckedCache(_Entries(fail="write"), "/read-only")
    with caplog.at_level("WARNING", logger=compile_cache.__name__):
        unwritable.put("a", b"x")
        unwritable.put("b", b"y")
        assert compile_cache.CheckedCache(_Entries(fail="read"), "/gone").get("a") is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "/read-only cannot be written (read-only); continuing without writing to it" in messages[0]
    assert "/gone: cannot read an entry (read failed); compiling" in messages[1]

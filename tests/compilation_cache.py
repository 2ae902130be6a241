"""One JAX persistent compilation cache for the trainer processes the tests start.

The suite runs the same tiny models many times, in emulated VMs and in trainer subprocesses,
each a fresh process that would compile every program again. With
``MULTISLICE_COMPILATION_CACHE_DIR`` (training.compile_cache) pointing here, each program is
compiled once per session. The cache key covers the program, its devices and the compile
options, so results are those of a fresh compile. Tests of the cache itself
(tests/test_compile_cache.py, the cache assertions in tests/test_train.py) use the run
directory's cache instead: they never add this to their environment.

The directory is removed at the end of the session (tests/conftest.py).
"""

from __future__ import annotations

import tempfile

DIR = tempfile.mkdtemp(prefix="multislice-tests-compilation-cache-")


def env() -> dict[str, str]:
    """The environment variable that makes a trainer (or an emulated VM's) use the shared cache."""
    return {"MULTISLICE_COMPILATION_CACHE_DIR": DIR}

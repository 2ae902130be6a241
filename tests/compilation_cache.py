"""One JAX persistent compilation cache for the trainer processes the tests start.

The suite runs the same tiny models many times, in emulated VMs and in trainer subprocesses,
each a fresh process that would compile every program again. With
``MULTISLICE_COMPILATION_CACHE_DIR`` (training.compile_cache) pointing here, each program is
compiled once per session. The cache key covers the program, its devices and the compile
options, so results are those of a fresh compile. Tests of the cache itself
(tests/training/test_compile_cache.py, the cache assertions in tests/training/test_train.py) use the run
directory's cache instead: they never add this to their environment.

One directory per session, shared by every pytest-xdist worker: the session's main process
imports this module first (tests/conftest.py) and records the directory in
``TESTS_COMPILATION_CACHE_DIR``, which the workers it starts, and the processes they start,
inherit. The main process removes it at the end of the session (tests/conftest.py).
"""

from __future__ import annotations

import os
import tempfile

#: Names the session's directory for the workers and their processes.
DIR_ENV = "TESTS_COMPILATION_CACHE_DIR"


def _session_dir() -> str:
    if not os.environ.get(DIR_ENV):
        os.environ[DIR_ENV] = tempfile.mkdtemp(prefix="multislice-tests-compilation-cache-")
    return os.environ[DIR_ENV]


DIR = _session_dir()


def env() -> dict[str, str]:
    """The environment variable that makes a trainer (or an emulated VM's) use the shared cache."""
    return {"MULTISLICE_COMPILATION_CACHE_DIR": DIR}

"""Test-session setup: JAX runs on CPU with 8 emulated devices in the test process.

Set before anything imports jax (the device count is fixed at import: docs/jax-on-cpu.md).
Subprocesses (the local emulation) get their own JAX environment from the emulator. XLA's CPU
backend generates code without LLVM's optimizations (tests/compile_flags.py), in the emulated
VMs too: much of the suite's time is compiling.
"""

import json
import os
import shutil
import sys
import tempfile
import uuid

import pytest

from tests import compile_flags

#: Keeps the tests that share a module-scoped fixture on one pytest-xdist worker.
pytest_plugins = ["tests.xdist_groups"]
# The helpers the test modules share assert as a test module does (pytest explains a failure).
pytest.register_assert_rewrite("tests.helpers")

#: The user's own MULTISLICE_* settings (a stacks or state folder of theirs, a log level) are not the
#: suite's: the session drops them before anything reads them (its xdist workers inherit what the
#: session then sets: the compilation cache, the API traffic file).
if os.environ.get("PYTEST_XDIST_WORKER") is None:
    for _name in [name for name in os.environ if name.startswith("MULTISLICE_")]:
        del os.environ[_name]
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
os.environ["XLA_FLAGS"] = compile_flags.with_fast_compile(os.environ.get("XLA_FLAGS"))
os.environ.setdefault("MULTISLICE_EMULATED_XLA_FLAGS", compile_flags.EMULATED_VM_FLAGS)


def _share_bytecode() -> str | None:
    """With ``PYTHONDONTWRITEBYTECODE`` set (some CI images and sandboxes set it), every Python
    process compiles each module it imports from source: each CLI run and each emulated VM's
    trainer pays ~5 s of CPU for jax, orbax and gcsfs again. Instead, this process and every
    subprocess the tests start (they inherit the environment) keep their bytecode in one
    temporary directory (``PYTHONPYCACHEPREFIX``, https://docs.python.org/3/using/cmdline.html),
    removed at the end of the session: nothing is written into the source tree or the
    virtualenv, as the variable asked. Returns that directory (None: the variable is not set,
    Python caches bytecode as usual)."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return None
    prefix = tempfile.mkdtemp(prefix="multislice-tests-pycache-")
    os.environ.pop("PYTHONDONTWRITEBYTECODE")
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.dont_write_bytecode = False  # this process: the test modules' imports write it for all
    sys.pycache_prefix = prefix
    return prefix


_BYTECODE_DIR = _share_bytecode()

#: Names the session's temporary directory for the workers and the processes the tests start.
TMPDIR_ENV = "TESTS_TMPDIR"


def _contain_temporary_files() -> str | None:
    """The processes the tests start (trainers, emulations, CLIs) and the pytest-xdist workers get
    a temporary directory of the session's (``TMPDIR``), removed at its end: what a process the
    tests kill on purpose leaves there (a trainer's TensorBoard spool, Orbax's or a script's
    temporary files) does not pile up in this machine's ``/tmp`` run after run. This process
    keeps the machine's (it was read first: ``tempfile.gettempdir`` caches it), and so does
    pytest's ``tmp_path``, whose directories outlive the session for a look at a failure.
    Returns the directory in the session's main process, None in its workers."""
    if os.environ.get(TMPDIR_ENV):
        return None
    tempfile.gettempdir()
    directory = tempfile.mkdtemp(prefix="multislice-tests-tmp-")
    os.environ[TMPDIR_ENV] = os.environ["TMPDIR"] = directory
    return directory


_TMPDIR = _contain_temporary_files()


def _record_api_traffic() -> str:
    """Every exchange with an emulated Google API, in this process or a process it starts (an
    emulation's), goes to a file of this process's (:mod:`infra.emulated.api_traffic`), which
    :func:`google_api_schemas` judges after each test."""
    path = os.path.join(tempfile.gettempdir() if _TMPDIR is None else _TMPDIR, f"api-traffic-{os.getpid()}.jsonl")
    os.environ["MULTISLICE_API_TRAFFIC"] = path
    return path


_API_TRAFFIC = _record_api_traffic()

# Before the xdist workers start: they inherit the session's compilation cache directory.
from tests import compilation_cache  # noqa: E402 (once the bytecode directory above is set)

#: pytest-timeout's bound for a test marked ``slow`` (a multi-process emulation run) that names none
#: of its own: the suite's 300 s is a hang detector for the rest, but an emulation on a 2-core
#: machine with two CPU-bound processes beside the suite took longer than that (a module fixture's
#: run with a kill and a preemption, measured 2026-12-04: benchmarks/suite_under_load.py).
SLOW_TIMEOUT_S = 900


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))


def pytest_unconfigure(config):
    if _BYTECODE_DIR is not None:
        shutil.rmtree(_BYTECODE_DIR, ignore_errors=True)
    if not hasattr(config, "workerinput"):  # the session's main process: the workers have ended
        shutil.rmtree(compilation_cache.DIR, ignore_errors=True)
        if _TMPDIR is not None:
            shutil.rmtree(_TMPDIR, ignore_errors=True)


def pytest_report_header(config):
    from tests.fakes import discovery

    return "Google discovery documents judging the fakes: " + ", ".join(discovery.revisions())


_traffic_read = 0


@pytest.fixture(autouse=True)
def google_api_schemas(request):
    """Every request to an emulated Google API is vetted by Google's discovery document while the
    test runs (a refused one is answered with Google's error), and after it every exchange since the
    last test's (a module fixture's emulation included) is judged, request and response: what the
    document refuses fails the test. A test marked ``schema_refusals`` sends refused requests on
    purpose: only their answers are judged."""
    global _traffic_read
    from infra.emulated import api_traffic
    from tests.fakes import discovery

    previous = api_traffic.set_vetter(discovery.vetter)
    try:
        yield
    finally:
        api_traffic.set_vetter(previous)
    exchanges = []
    if os.path.exists(_API_TRAFFIC):
        with open(_API_TRAFFIC, "rb") as traffic:
            traffic.seek(_traffic_read)
            data = traffic.read()
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits for the next test
        _traffic_read += len(complete)
        exchanges = [json.loads(line) for line in complete.decode("utf-8").splitlines() if line.strip()]
    problems = discovery.traffic_problems(
        exchanges, requests=request.node.get_closest_marker("schema_refusals") is None
    )
    if problems:
        pytest.fail("Google's discovery documents refuse this test's API traffic:\n  " + "\n  ".join(problems))


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """One emulated Cloud Storage (fake-gcs-server, infra.emulated.gcs) for the whole session,
    started by the first test that asks for it; this process's gcsfs and tensorstore are
    pointed at it (their settings are read before their first gs:// request)."""
    from infra.emulated.gcs import GcsServer, client_env
    from tests.fakes.gcs_server import JudgedProxy

    root = tmp_path_factory.mktemp("gcs")
    server = GcsServer(root / "data", root / "fake-gcs-server.log")
    server.start()
    proxy = JudgedProxy(server.url)  # the clients' requests judged by Cloud Storage's discovery document
    saved = {key: os.environ.get(key) for key in server.client_env()}
    os.environ.update(client_env(proxy.endpoint))
    yield server
    proxy.stop()
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def bucket(gcs_server) -> str:
    """A new, empty bucket on the session's emulated Cloud Storage."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    assert gcs_server.create_bucket(name)
    return name


@pytest.fixture(autouse=True)
def main_thread_has_an_event_loop():
    """Orbax runs its I/O with ``asyncio.run``, which leaves the main thread with no current
    event loop; Pulumi's runtime (the program and policy tests) asks for one and would fail
    with "There is no current event loop" in whichever test runs after an in-process trainer
    test. Put one back after every test, as the interpreter starts with."""
    yield
    import asyncio

    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())


@pytest.fixture(autouse=True)
def logging_as_it_was():
    """A command run in this process (typer's CliRunner: `python -m training run`, `data
    prepare`) configures the root logger with a handler on the runner's stderr, closed once the
    command returns: put the root logger back after every test (tests.helpers.logging_state)."""
    from tests.helpers.logging_state import root_logger_kept

    with root_logger_kept():
        yield


#: The hints already checked in this process, with the state directory they were printed for.
_HINTS_CHECKED: set[tuple[str, str | None]] = set()


@pytest.fixture(autouse=True)
def printed_hints_work(monkeypatch, request):
    """Every command a CLI run of any test prints as a hint (``see: multislice plan …``, ``resume
    with: …``) is checked right after the run, in its environment: it names a command that
    exists with options that parse and a stack that resolves, and a reading one (``plan``,
    ``local status``, ``local logs``, ``render``) runs as printed (tests/helpers/hints.py). A test
    marked ``hints_unchecked`` prints a hint that cannot work on purpose."""
    from typer.testing import CliRunner

    from tests.helpers import hints

    original = CliRunner.invoke
    marked = request.node.get_closest_marker("hints_unchecked") is not None

    def invoke(self, app, args=None, *rest, **kwargs):
        result = original(self, app, args, *rest, **kwargs)
        env = kwargs.get("env") or {}
        state = env.get("MULTISLICE_STATE_DIR")
        text = result.output
        found = [line for line in hints.printed(text) if (line, state) not in _HINTS_CHECKED]
        if found and not marked:
            saved = {key: os.environ.get(key) for key in env}

            def run(more):
                again = original(self, app, more, env=env)
                return again.exit_code, again.output

            try:
                os.environ.update({key: value for key, value in env.items() if value is not None})
                hints.check_output("\n".join(f"`{line}`" for line in found), run)
            finally:
                for key, value in saved.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
            _HINTS_CHECKED.update((line, state) for line in found)
        return result

    monkeypatch.setattr(CliRunner, "invoke", invoke)
    yield


@pytest.fixture(autouse=True)
def own_state_dir(tmp_path_factory, monkeypatch):
    """Each test's local runs live in a folder of its own (``MULTISLICE_STATE_DIR``), never in the
    clone's ``.multislice/local``, where the README's day one leaves runs of its own (stack ``long``)
    that a test naming that stack would otherwise find. A test that names a state folder still does."""
    monkeypatch.setenv("MULTISLICE_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(autouse=True)
def stacks_named_afresh():
    """Which file each stack was read from (infra.stack_naming) is a process's memory, as
    one command's: a test starts with none, whatever files the tests before it read."""
    from infra import stack_naming

    stack_naming._LOADED_FROM.clear()
    yield

"""Every place ``infra/`` and ``training/`` read bytes or values from outside the process, found by
reading each module's syntax tree (:func:`read_sites`), and each classified in :data:`INVENTORY`:

* ``reader``: the site is one of the readers of outside bytes
  (docs/development.md, "Readers of outside bytes") or its bytes go through one, which the reason
  names (``module.function``);
* ``own-bytes``: bytes this program wrote (in this run, or a child process it started, or a peer of
  the same job) or ships in the repository (templates, ``uv.lock``, ``Pulumi.yaml``);
* ``trusted-api``: an answer of a Google service or of the Pulumi engine, as its client hands it over;
* ``bounded-elsewhere``: bounded or checked, where the reason says;
* ``passed-on``: environment handed on unread to a child process (read where it is used);
* ``gap``: read without a bound: the follow-ups, listed last in docs/outside-bytes.md.

A read the inventory does not list fails (classify it here, or read it through ``infra/readers``),
and so does an entry whose read is gone. docs/outside-bytes.md shows the inventory; its tables
are checked against it (``python -m tests.readers.test_outside_bytes`` prints them).

What the scan counts as a read: a file's bytes (``read_text``, ``read_bytes``, ``open`` or
``os.open`` for reading, ``tarfile.open`` and other ``….open`` in a read mode, a Cloud Storage
``download_as_*``), a parser of text (``json.load(s)``, ``yaml``'s loads and a loader's
``get_single_node``, ``tomllib.load(s)``: a subprocess's output or an HTTP body parsed is one of
these), the environment (``os.environ[…]``, ``os.environ.get``, ``os.getenv``, ``os.environ`` used
otherwise than written), ``sys.stdin``, ``input()``, ``os.read``/``os.pread``, a connection's
``recv()``, another process's ``environ()``, an ``urlopen`` whose response is kept, an HTTP
response's ``.json()`` (and ``.content``/``.text`` of a name ending in ``response``), an HTTP
server's ``rfile.read``. Not counted: command-line arguments (typer parses them), a subprocess's
output used as text without a parser.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import sys
from pathlib import Path

import pytest

from tests.helpers.repo import ROOT

READER, OWN, TRUSTED, ELSEWHERE, PASSED, GAP = (
    "reader",
    "own-bytes",
    "trusted-api",
    "bounded-elsewhere",
    "passed-on",
    "gap",
)
#: The categories in the page's order, each with its section's heading (the gaps last: the follow-ups).
CATEGORIES = {
    READER: "Through a reader",
    OWN: "The program's own bytes",
    TRUSTED: "Answers of a trusted API",
    ELSEWHERE: "Bounded or checked elsewhere",
    PASSED: "Passed on unread",
    GAP: "Gaps: the follow-ups",
}
#: The readers of outside bytes (docs/development.md): a ``reader`` entry names a function of one.
READER_MODULES = (
    "infra.readers.files",
    "infra.readers.stack_file",
    "infra.readers.engine_config",
    "infra.readers.state_records",
    "infra.readers.environment",
    "training.run_objects",
    "training.redaction",
)
PAGE = ROOT / "docs" / "outside-bytes.md"

#: Methods that return a file's or an object's bytes, whatever their receiver (``Path``, ``epath.Path``,
#: a GCS ``Blob``).
FILE_METHODS = {"read_text", "read_bytes", "download_as_bytes", "download_as_text", "download_as_string"}
#: PyYAML's functions that parse a document.
YAML_PARSERS = {"load", "safe_load", "full_load", "unsafe_load", "compose"} | {
    f"{name}_all" for name in ("load", "safe_load", "full_load", "unsafe_load", "compose")
}
#: A PyYAML loader's methods that parse the text it was made with.
LOADER_METHODS = {"get_single_node", "get_single_data", "get_node", "get_data"}
#: Functions whose answer is parsed outside bytes, by their dotted name after the module's imports.
PARSERS = {"json.load", "json.loads", "tomllib.load", "tomllib.loads"} | {f"yaml.{name}" for name in YAML_PARSERS}
#: What ``os.environ`` is used for that writes it, reads nothing.
ENV_WRITES = {"update", "pop", "clear", "__setitem__", "__delitem__"}
#: What ``sys.stdin`` is asked that reads none of its bytes.
STDIN_QUERIES = {"isatty", "fileno"}
#: Methods that read bytes another process sent: a connection's message, another process's environment.
FILE_STREAMS = {"recv", "environ"}
#: Longest argument or receiver written in a site's name; past it, ``…``.
SHOWN = 40


def read_sites(root: Path = ROOT, folders: tuple[str, ...] = ("infra", "training")) -> list[str]:
    """Every site in the modules of ``folders`` that reads bytes or values from outside the process, as
    ``path::function::call`` (``<module>`` for module level; a call seen again in the same function
    gets `` #2``, `` #3``)."""
    sites: list[str] = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            found = _Scan(path.read_text(encoding="utf-8"))
            seen: dict[str, int] = {}
            for function, call in found.sites:
                key = f"{path.relative_to(root).as_posix()}::{function}::{call}"
                seen[key] = seen.get(key, 0) + 1
                sites.append(key if seen[key] == 1 else f"{key} #{seen[key]}")
    return sites


def _shown(node: ast.AST | None) -> str:
    if node is None:
        return ""
    text = ast.unparse(node)
    return text if len(text) <= SHOWN else "…"


def _first_argument(call: ast.Call) -> str:
    if call.args:
        return _shown(call.args[0])
    if call.keywords:
        first = call.keywords[0]
        return f"{first.arg}={_shown(first.value)}" if first.arg else f"**{_shown(first.value)}"
    return ""


def _modes(node: ast.expr | None) -> set[str] | None:
    """The modes an ``open`` may be given (None: not known here)."""
    if node is None:
        return {"r"}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        body, orelse = _modes(node.body), _modes(node.orelse)
        return None if body is None or orelse is None else body | orelse
    return None


def _reads(call: ast.Call, mode_index: int) -> bool:
    """Whether an ``open(file, mode)``-shaped call may open for reading."""
    mode = call.args[mode_index] if len(call.args) > mode_index else None
    mode = next((k.value for k in call.keywords if k.arg == "mode"), mode)
    modes = _modes(mode)
    return modes is None or any("r" in m or "+" in m for m in modes)


class _Scan(ast.NodeVisitor):
    def __init__(self, source: str) -> None:
        tree = ast.parse(source)
        self.aliases = _aliases(tree)
        self.parents: dict[ast.AST, ast.AST] = {
            child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)
        }
        self.scope: list[str] = []
        self.sites: list[tuple[str, str]] = []
        self.visit(tree)

    def _add(self, call: str) -> None:
        self.sites.append((".".join(self.scope) or "<module>", call))

    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def visit_Call(self, node: ast.Call) -> None:
        call = self._call(node)
        if call:
            self._add(call)
        self.generic_visit(node)

    def _call(self, node: ast.Call) -> str | None:
        name = _dotted(node.func, self.aliases)
        argument = _first_argument(node)
        if name in PARSERS or name in ("os.getenv", "os.environ.get", "os.read", "os.pread", "input"):
            return f"{name}({argument})"
        if name in ("open", "io.open") and _reads(node, 1):
            return f"open({argument})"
        if name == "os.open" and not (len(node.args) > 1 and "O_WRONLY" in ast.unparse(node.args[1])):
            return f"os.open({argument})"
        if name == "urllib.request.urlopen" and self._body_kept(node):
            return f"urlopen({argument})"
        if not isinstance(node.func, ast.Attribute) or name in ("os.open", "io.open"):
            return None
        method, shown = node.func.attr, ast.unparse(node.func)
        shown = shown if len(shown) <= SHOWN + len(method) else f"….{method}"
        if method in FILE_METHODS and not self._parsed(node) or method in LOADER_METHODS or method in FILE_STREAMS:
            return f"{shown}()"
        if method == "json" and not node.args and not node.keywords:
            return f"{shown}()"
        if method == "read" and shown.endswith("rfile.read"):
            return f"{shown}()"
        if method == "open" and _reads(node, 1):
            return f"{shown}({argument})"
        return None

    def _parsed(self, node: ast.Call) -> bool:
        """Whether a file's bytes go straight into a parser (``json.loads(path.read_text())``: one site)."""
        parent = self.parents.get(node)
        return isinstance(parent, ast.Call) and _dotted(parent.func, self.aliases) in PARSERS

    def _body_kept(self, node: ast.Call) -> bool:
        """Whether an ``urlopen``'s response is kept to be read (``with … as response``, assigned)."""
        parent = self.parents.get(node)
        return isinstance(parent, ast.withitem) and parent.optional_vars is not None or isinstance(parent, ast.Assign)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        name = _dotted(node, self.aliases)
        parent = self.parents.get(node)
        if name == "os.environ" and isinstance(node.ctx, ast.Load):
            self._environ(node, parent)
        elif name == "sys.stdin":
            if not (isinstance(parent, ast.Attribute) and parent.attr in STDIN_QUERIES):
                self._add(f"sys.stdin.{parent.attr}" if isinstance(parent, ast.Attribute) else "sys.stdin")
        elif node.attr in ("content", "text") and isinstance(node.value, ast.Name):
            if node.value.id.endswith("response") or node.value.id == "resp":
                self._add(f"{node.value.id}.{node.attr}")
        self.generic_visit(node)

    def _environ(self, node: ast.Attribute, parent: ast.AST | None) -> None:
        if isinstance(parent, ast.Subscript) and parent.value is node:
            if isinstance(parent.ctx, ast.Load):
                self._add(f"os.environ[{_shown(parent.slice)}]")
        elif isinstance(parent, ast.Attribute):
            if parent.attr not in ENV_WRITES and parent.attr != "get":
                self._add(f"os.environ.{parent.attr}")
        elif isinstance(parent, ast.Compare):
            self._add("in os.environ")
        else:
            self._add("os.environ")


def _aliases(tree: ast.Module) -> dict[str, str]:
    """The module's imported names (anywhere in it): local name → dotted name."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                names[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {alias.asname or alias.name: f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """``a.b.c`` of a chain of names, its first name resolved through the imports (None otherwise)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


#: Every read of outside bytes: ``path::function::call`` → (category, what it reads, its bound or why none).
INVENTORY: dict[str, tuple[str, str, str]] = {
    # infra/backends ---------------------------------------------------------------------------
    "infra/backends/capacity.py::status_credentials::os.environ": (
        ELSEWHERE,
        "the environment's credential settings",
        "`infra/credentials.py` `problem()` checks them, one line naming what to set",
    ),
    "infra/backends/compute_engine/emulated_api.py::ComputeApi.__init__.Handler._answer::self.rfile.read()": (
        OWN,
        "a request body the emulated Compute API gets from this program's own clients",
        "loopback test double; Content-Length bytes, decoded by `api_traffic.parse_json` (None when not JSON)",
    ),
    "infra/backends/gke/kubectl.py::kubectl_executable::os.environ.get('MULTISLICE_KUBECTL')": (
        ELSEWHERE,
        "`MULTISLICE_KUBECTL`, kubectl's path",
        "run as a command: one that does not start is a `KubectlError` (`infra/backends/gke/kubectl.py`)",
    ),
    "infra/backends/queued_resource/capacity.py::endpoint::os.environ.get(ENDPOINT_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_TPU_API_ENDPOINT`",
        "`TpuApi.client_for` refuses a plain-http endpoint that is not loopback (`provider/api.py`)",
    ),
    "infra/backends/queued_resource/capacity.py::_get::response.json()": (
        TRUSTED,
        "the Cloud TPU API's error body",
        "Google's answer, decoded by requests; a body without `error` falls back to its first 200 characters",
    ),
    "infra/backends/queued_resource/capacity.py::_get::response.json() #2": (
        TRUSTED,
        "the Cloud TPU API's queued resource",
        "Google's answer (or the loopback fake's), decoded by requests; read by key",
    ),
    "infra/backends/queued_resource/capacity.py::_get::response.text": (
        ELSEWHERE,
        "an HTTP error body of the Cloud TPU API",
        "cut to 200 characters for the message",
    ),
    "infra/backends/queued_resource/emulated_api.py::EmulatedTpuApi.__init__.Handler._serve::self.rfile.read()": (
        OWN,
        "a request body the emulated TPU API gets from this program's own clients",
        "loopback test double; Content-Length bytes, decoded by `api_traffic.parse_json` (None when not JSON)",
    ),
    "infra/backends/queued_resource/provider/__init__.py::QueuedResourceProvider._credential_settings::os.environ": (
        ELSEWHERE,
        "the environment's credential settings",
        "`infra/credentials.py` `problem()` checks them (`check` below)",
    ),
    "infra/backends/queued_resource/provider/__init__.py::QueuedResourceProvider._endpoint::os.environ.get(TPU_API_ENDPOINT_ENV)": (  # noqa: E501 (a site is one string, to be found by search)
        ELSEWHERE,
        "`MULTISLICE_TPU_API_ENDPOINT`",
        "`TpuApi.client_for` refuses a plain-http endpoint that is not loopback (`provider/api.py`)",
    ),
    "infra/backends/queued_resource/provider/__init__.py::QueuedResourceProvider._setting::os.environ.get(env)": (
        ELSEWHERE,
        "the provider's timing variables (poll, timeouts)",
        "checked here: a positive finite number, else one line naming the variable",
    ),
    "infra/backends/queued_resource/provider/__init__.py::QueuedResourceProvider._deleted_on_complete::os.environ.get(STORAGE_ENDPOINT_ENV)": (  # noqa: E501 (a site is one string, to be found by search)
        ELSEWHERE,
        "`STORAGE_EMULATOR_HOST`, whether it is set",
        "only tested for being set (anonymous requests to the emulator)",
    ),
    "infra/backends/queued_resource/provider/__init__.py::QueuedResourceProvider.check::os.environ": (
        ELSEWHERE,
        "the environment's credential settings",
        "`infra/credentials.py` `problem()` checks them, one line naming what to set",
    ),
    "infra/backends/queued_resource/provider/completion.py::storage_endpoint::os.environ": (
        ELSEWHERE,
        "`STORAGE_EMULATOR_HOST`",
        "a URL base; a request to a wrong one is `CompletionUnknown`, one line",
    ),
    "infra/backends/queued_resource/provider/completion.py::run_completion::response.content": (
        READER,
        "the run's `COMPLETE` marker from Cloud Storage",
        "decoded by `training.run_objects.json_record` in `completed_step`",
    ),
    "infra/backends/queued_resource/provider/completion.py::run_completion::response.text": (
        ELSEWHERE,
        "an HTTP error body of Cloud Storage",
        "cut to 120 characters, quoted with `repr`",
    ),
    "infra/backends/queued_resource/reset.py::client_for_stack::os.environ": (
        ELSEWHERE,
        "the environment's credential settings",
        "`infra/credentials.py` `problem()` checks them, one line naming what to set",
    ),
    "infra/backends/queued_resource/reset.py::client_for_stack::os.environ #2": (
        ELSEWHERE,
        "the environment's credential settings",
        "`infra/credentials.py` `problem()` checks them, one line naming what to set",
    ),
    "infra/backends/spec.py::BackendSpec.package_text::resources.files(package).joinpath(file).read_text()": (
        OWN,
        "a backend's package data (its shell templates)",
        "shipped in the repository beside the backend's code",
    ),
    # infra/cli ----------------------------------------------------------------------------------
    "infra/cli/logs.py::logs::os.environ.get(cloud.ENDPOINT_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_LOGGING_ENDPOINT`",
        "an endpoint for the Logging client; `is_loopback` decides anonymous access (`infra/logs/cloud.py`)",
    ),
    # infra/config -------------------------------------------------------------------------------
    "infra/config/dataset.py::read_manifest_bytes::os.environ": (
        ELSEWHERE,
        "`STORAGE_EMULATOR_HOST` and the credential settings",
        "`infra/credentials.py` `problem()` checks them, offline",
    ),
    "infra/config/dataset.py::read_manifest_bytes::bucket.blob(name).download_as_bytes()": (
        READER,
        "a dataset manifest in Cloud Storage",
        "decoded by `training.run_objects.json_record` (64 MiB, once fetched) in `training/data/manifest.py`",
    ),
    "infra/config/structured.py::parse::json.loads(text)": (
        ELSEWHERE,
        "a structured config value (the engine's JSON text)",
        "from the stack file's reader (1 MiB) or the Pulumi engine's map; no nesting bound of its own",
    ),
    "infra/config/vm_python.py::read_python_version::path.read_text()": (
        OWN,
        "`.python-version` of the checkout",
        "shipped in the repository; each line checked as `X.Y[.Z]`",
    ),
    "infra/config/workload.py::WorkloadSettings._pinned_requirements::path.read_text()": (
        ELSEWHERE,
        "`multislice:workload.requirements`, a requirements file",
        "checked first in this validator: a regular file of at most `MAX_REQUIREMENTS_BYTES`",
    ),
    # infra/credentials.py -------------------------------------------------------------------------
    "infra/credentials.py::_delegates::json.loads(setting.value)": (
        ELSEWHERE,
        "a credential setting's delegate list",
        "from the stack file (1 MiB reader) or an environment variable; non-JSON, or JSON nested past the "
        "parser's depth, is split on commas",
    ),
    "infra/credentials.py::_metadata_server_expected::PRODUCT_NAME_FILE.read_text()": (
        ELSEWHERE,
        "the SMBIOS product name, `/sys/class/dmi/id/product_name`",
        "a sysfs attribute: the kernel serves at most a page",
    ),
    # infra/emulated -----------------------------------------------------------------------------
    "infra/emulated/api_traffic.py::record::os.environ.get(TRAFFIC_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_API_TRAFFIC`, a file the emulated APIs append to",
        "a path appended to, never read; set by the test suite (`tests/conftest.py`)",
    ),
    "infra/emulated/api_traffic.py::parse_json::json.loads(data)": (
        OWN,
        "a request body to an emulated API, from this program's clients",
        "loopback test double; not JSON is None",
    ),
    "infra/emulated/gcs.py::find_binary::os.environ.get(BINARY_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_FAKE_GCS_SERVER`",
        "checked here: an executable file, else one line",
    ),
    "infra/emulated/gcs.py::answers::urlopen(f'{url}/storage/v1/b')": (
        OWN,
        "the status of the emulated Cloud Storage this program started",
        "only the status code is read, not the body",
    ),
    "infra/emulated/gcs.py::GcsServer.start::os.environ": (
        PASSED,
        "this process's environment",
        "handed to the fake-gcs-server it starts",
    ),
    "infra/emulated/gcs.py::GcsServer._last_log_line::open(self.log_path)": (
        OWN,
        "the log of the fake-gcs-server this process started",
        "from this start's offset; shown as text (errors replaced)",
    ),
    "infra/emulated/gcs_clients.py::point_clients_at::os.environ.get(key)": (
        PASSED,
        "the storage variables, saved to restore them",
        "written back as they were, not interpreted",
    ),
    "infra/emulated/gcs_clients.py::bucket_served::os.environ[STORAGE_ENDPOINT_ENV]": (
        OWN,
        "`STORAGE_EMULATOR_HOST`",
        "set by `clients_pointed_at` just above",
    ),
    "infra/emulated/lifeline.py::inherited_fd::os.environ": (
        ELSEWHERE,
        "the lifeline descriptor's variable",
        "checked here: digits, and an open descriptor (`fstat`), else none",
    ),
    "infra/emulated/lifeline.py::watch.wait::os.read(fd)": (
        OWN,
        "the lifeline pipe of the emulator that started this process",
        "one byte at a time; only its end (EOF) counts",
    ),
    "infra/emulated/lifeline.py::main::os.environ.items": (
        PASSED,
        "this process's environment",
        "handed to the command it runs, less the lifeline variable",
    ),
    "infra/emulated/node_mounts.py::noexec_problem::os.environ": (
        PASSED,
        "this process's environment",
        "handed to the probe it runs",
    ),
    "infra/emulated/ports.py::ephemeral_low::EPHEMERAL_RANGE_FILE.read_text()": (
        ELSEWHERE,
        "`/proc/sys/net/ipv4/ip_local_port_range`",
        "a procfs file of two numbers; anything else gives the default",
    ),
    "infra/emulated/service_manager.py::Manager._read::path.read_text()": (
        OWN,
        "a unit file the emulated VM's boot wrote (`infra/startup/boot.sh.in`)",
        "`parse_service` refuses what it does not know, in one line",
    ),
    "infra/emulated/supervisor.py::start_ticks::Path(f'/proc/{pid}/stat').read_bytes()": (
        ELSEWHERE,
        "a process's `/proc/PID/stat`",
        "a procfs line the kernel writes (proc_pid_stat(5))",
    ),
    "infra/emulated/systemctl.py::main::os.environ.get(ADDRESS_ENV)": (
        OWN,
        "the emulated systemd's address",
        "set by `infra/emulated/systemd.py` for its VM",
    ),
    "infra/emulated/systemctl.py::main::os.environ.get(AUTHKEY_ENV)": (
        OWN,
        "the emulated systemd's key",
        "set by `infra/emulated/systemd.py` for its VM",
    ),
    "infra/emulated/systemctl.py::answer_of::json.loads(line)": (
        OWN,
        "the emulated systemd's answer",
        "one line of at most `LINE_LIMIT` bytes from the manager the key names; `[int, str]` or an error line",
    ),
    "infra/emulated/systemd.py::_request::json.loads(line)": (
        OWN,
        "a `systemctl` request of the VM's own processes",
        "one line of at most `LINE_LIMIT` bytes; run only with the key this process made (`hmac.compare_digest`)",
    ),
    "infra/emulated/systemd.py::boot::os.environ": (
        PASSED,
        "this process's environment",
        "handed to the VM's startup script and units",
    ),
    "infra/emulated/systemd.py::_booting::os.open(Path(home) / BOOT_LOCK_FILE)": (
        OWN,
        "the VM's boot lock file",
        "only locked (`flock`), never read",
    ),
    "infra/emulated/vm.py::EmulatedVM.boot::urlopen(request)": (
        OWN,
        "the startup script from the emulated metadata server",
        "the script this program rendered and serves on loopback",
    ),
    "infra/emulated/vm_site/sitecustomize.py::lock_path::os.environ.get(HOME_ENV)": (
        OWN,
        "`MULTISLICE_HOME` of an emulated VM",
        "set by the emulator for its VMs (`infra/local/topology.py`)",
    ),
    "infra/emulated/vm_site/sitecustomize.py::acquire_chips::os.open(path)": (
        OWN,
        "the emulated VM's chip lock file",
        "locked; its holder's pid is read below",
    ),
    "infra/emulated/vm_site/sitecustomize.py::acquire_chips::os.pread(fd)": (
        OWN,
        "the pid another process of the VM wrote into the lock file",
        "32 bytes at most, shown in the message",
    ),
    "infra/emulated/vm_site/sitecustomize.py::acquire_chips::os.environ.get('MULTISLICE_LOCAL_DOWN')": (
        OWN,
        "the command that stops the run, for the message",
        "set by the emulator for its VMs (`infra/local/topology.py`)",
    ),
    "infra/emulated/vm_site/sitecustomize.py::register_cluster.EmulatedGkeTpuCluster.is_env_present::os.environ.get(EMULATED_TPU_ENV)": (  # noqa: E501 (a site is one string, to be found by search)
        OWN,
        "`MULTISLICE_EMULATED_TPU`",
        "set by the emulator for its VMs; only tested for being set",
    ),
    "infra/emulated/vm_site/sitecustomize.py::register_cluster.EmulatedTpuCluster.is_env_present::os.environ.get(EMULATED_TPU_ENV)": (  # noqa: E501 (a site is one string, to be found by search)
        OWN,
        "`MULTISLICE_EMULATED_TPU`",
        "set by the emulator for its VMs; only tested for being set",
    ),
    "infra/emulated/vm_site/sitecustomize.py::emulated_slice_index::os.environ.get(SLICES_ENV)": (
        OWN,
        "`MULTISLICE_EMULATED_SLICES`",
        "set by the emulator for its VMs (`infra/local/topology.py`)",
    ),
    "infra/emulated/vm_site/sitecustomize.py::<module>::os.environ.get(EMULATED_TPU_ENV)": (
        OWN,
        "`MULTISLICE_EMULATED_TPU`",
        "set by the emulator for its VMs; only tested for being set",
    ),
    # infra/invocation.py ---------------------------------------------------------------------------
    "infra/invocation.py::invocation::os.environ": (
        ELSEWHERE,
        "`PATH` and uv's variables",
        "only to word a suggested command line (`shutil.which`, shell-quoted)",
    ),
    # infra/local --------------------------------------------------------------------------------
    "infra/local/bench_slices.py::_child_env::os.environ.items": (
        PASSED,
        "this process's environment",
        "handed to the benchmark's children, less `JAX_`, `XLA_`, `TPU_`, `MEGASCALE_`",
    ),
    "infra/local/bench_slices.py::run_emulated::json.loads(out.read_text())": (
        OWN,
        "`bench.json` the benchmark's child wrote",
        "in a temporary directory this process made",
    ),
    "infra/local/bench_slices.py::_child::os.environ.get(_CPUS_ENV)": (
        OWN,
        "`MULTISLICE_BENCH_CPUS`",
        "set by the parent in `_child_env`",
    ),
    "infra/local/bench_slices.py::<module>::json.loads(sys.argv[1])": (
        OWN,
        "the task its parent passes on the command line",
        "written by `run_emulated`",
    ),
    "infra/local/boot_watch.py::default_boot_timeout::os.environ.get(BOOT_TIMEOUT_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_BOOT_TIMEOUT`",
        "checked here: a positive finite number, else one line naming it",
    ),
    "infra/local/boot_watch.py::_has_marker::open(log)": (
        OWN,
        "the console log of a VM this command booted",
        "from this boot's offset; only searched for a marker",
    ),
    "infra/local/progress.py::BootLines.poll::open(self.path)": (
        OWN,
        "the console log of a VM this command booted",
        "from the last offset; shown as text (errors replaced)",
    ),
    "infra/local/tails.py::last_lines::os.pread(fd)": (
        READER,
        "the end of a log (a VM's console, a benchmark's child), for an error message's last lines",
        "a regular file (`infra.readers.files.open_regular`); its last `MAX_TAIL_BYTES` (256 KiB)",
    ),
    "infra/local/topology.py::vm_environment::os.environ.items": (
        PASSED,
        "this process's environment",
        "handed to the emulated VMs, less the host-only prefixes",
    ),
    "infra/local/topology.py::vm_environment::os.environ.get('PYTHONPATH')": (
        PASSED,
        "`PYTHONPATH`",
        "handed to the emulated VMs after the VM site folder",
    ),
    "infra/local/topology.py::vm_environment::os.environ.get(VM_XLA_FLAGS_ENV)": (
        PASSED,
        "`MULTISLICE_EMULATED_XLA_FLAGS`",
        "handed to the emulated VMs as `XLA_FLAGS`",
    ),
    "infra/local/topology.py::vm_environment::os.environ.get(SHARED_COMPILATION_CACHE_ENV)": (
        PASSED,
        "`MULTISLICE_COMPILATION_CACHE_DIR`",
        "handed to the emulated VMs",
    ),
    "infra/local/topology.py::python3_dir::open(found)": (
        ELSEWHERE,
        "the first bytes of the `python3` on `PATH`",
        "two bytes (`#!`) of the executable `shutil.which` found",
    ),
    # infra/logs ---------------------------------------------------------------------------------
    "infra/logs/cloud.py::credentials_for::os.environ": (
        ELSEWHERE,
        "the environment's credential settings",
        "`infra/credentials.py` `problem()` checks them, one line naming what to set",
    ),
    "infra/logs/cloud.py::credentials_for::os.environ #2": (
        ELSEWHERE,
        "the environment's credential settings",
        "`infra/credentials.py` `problem()` checks them, one line naming what to set",
    ),
    "infra/logs/local.py::_read_to::os.pread(fd)": (
        READER,
        "a VM's console log in the state directory (`local logs`)",
        "a regular file (`infra.readers.files.open_regular`); at most `MAX_POLL_BYTES` (32 MiB) a poll, the newest",
    ),
    # infra/planner ------------------------------------------------------------------------------
    "infra/planner/compiled.py::compiled_memory::os.environ": (
        PASSED,
        "this process's environment",
        "handed to `python -m training.aot` with a CPU mesh set",
    ),
    "infra/planner/compiled.py::compiled_memory::json.loads(done.stdout)": (
        OWN,
        "the answer of `python -m training.aot`, this program's own child",
        "`training/aot.py` writes it (`json.dump`)",
    ),
    # infra/policy -------------------------------------------------------------------------------
    "infra/policy/data_source.py::list_gs_source::os.environ": (
        ELSEWHERE,
        "`STORAGE_EMULATOR_HOST` and the credential settings",
        "`infra/credentials.py` `problem()` checks them, offline",
    ),
    "infra/policy/release_contents.py::tar_files::tarfile.open(fileobj=io.BytesIO(data))": (
        ELSEWHERE,
        "a release's tar, for the secrets check",
        "members read until `MAX_READ_BYTES` in all; a broken tar is `{}`",
    ),
    "infra/policy/release_contents.py::asset_files::Path(path).read_bytes()": (
        OWN,
        "a release file a `BucketObject` uploads",
        "the program wrote it (`infra/components/release.py`, its content cache)",
    ),
    "infra/policy/release_grants.py::grants_of::json.loads(str(props.get('policyData') or '{}'))": (
        TRUSTED,
        "an IAM resource's `policyData` input",
        "the program's declaration as the Pulumi engine hands it to the policy",
    ),
    "infra/policy/value_secrets.py::_env_lines::json.loads(spec or b'{}')": (
        OWN,
        "a release's `workload.json`",
        "written by `infra/startup/workload.py` (`json.dumps`)",
    ),
    # infra/readers ------------------------------------------------------------------------------
    "infra/readers/environment.py::stacks_dir::os.environ[STACKS_DIR_ENV]": (
        READER,
        "`MULTISLICE_STACKS_DIR`, quoted in its refusal",
        "`infra.readers.environment.stacks_dir`",
    ),
    "infra/readers/environment.py::log_level::os.environ.get(LOG_LEVEL_ENV)": (
        READER,
        "`MULTISLICE_LOG_LEVEL`",
        "`infra.readers.environment.log_level`",
    ),
    "infra/readers/environment.py::_directory::os.environ.get(name)": (
        READER,
        "`MULTISLICE_STACKS_DIR`, `MULTISLICE_STATE_DIR`",
        "`infra.readers.environment.stacks_dir`, `infra.readers.environment.state_dir`",
    ),
    "infra/readers/files.py::open_regular::os.open(path)": (
        READER,
        "any file a reader is given",
        "`infra.readers.files.open_regular` (for `infra.readers.files.read_bounded` too)",
    ),
    "infra/readers/files.py::read_bounded::os.read(fd)": (
        READER,
        "any file a reader is given",
        "`infra.readers.files.read_bounded`",
    ),
    "infra/readers/stack_file.py::load_yaml::loader.get_single_node()": (
        READER,
        "a stack file's YAML",
        "`infra.readers.stack_file.load_yaml`",
    ),
    "infra/readers/state_records.py::emulator_state::json.loads(data.decode('utf-8'))": (
        READER,
        "`emulator.json` of a local run",
        "`infra.readers.state_records.emulator_state`",
    ),
    "infra/readers/state_records.py::deletion_record::json.loads(…)": (
        READER,
        "`deleted.json` of a local run",
        "`infra.readers.state_records.deletion_record`",
    ),
    # infra/remote -------------------------------------------------------------------------------
    "infra/remote/emulated.py::vm_environment::psutil.Process(pid).environ()": (
        OWN,
        "the environment of an emulated VM's process",
        "the emulator set it; taken only when it names this run's emulation id",
    ),
    "infra/remote/gcloud.py::gcloud_executable::os.environ.get(GCLOUD_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_GCLOUD`",
        "checked here: `shutil.which` finds it, else one line",
    ),
    "infra/remote/gcloud.py::_key_lock::os.open(lock)": (
        OWN,
        "the SSH key's lock file",
        "only locked (`flock`), never read",
    ),
    "infra/remote/gcloud.py::_key_file_state::os.read(fd)": (
        READER,
        "gcloud's SSH key file, its first line",
        "a regular file (`infra.readers.files.open_regular`); its first `KEY_LINE_BYTES` (4,096)",
    ),
    "infra/remote/gcloud.py::rerun_refused::open(outcome.log_path)": (
        OWN,
        "a worker's log this command's fan-out wrote",
        "written by `infra/remote/fanout.py` in this run; searched line by line",
    ),
    # infra/review -------------------------------------------------------------------------------
    "infra/review/program_mocks.py::_plain::json.loads(json.dumps(value, default=_wire))": (
        OWN,
        "a value this process just serialized",
        "`json.dumps` of the program's own value",
    ),
    "infra/review/program_mocks.py::decoded::json.loads(value)": (
        ELSEWHERE,
        "the engine's config values, as text",
        "made from the stack file read through `infra/readers/engine_config.py`",
    ),
    "infra/review/program_mocks.py::program_directory::yaml.safe_load((project / 'Pulumi.yaml').read_text())": (
        OWN,
        "`Pulumi.yaml` of the checkout",
        "shipped in the repository beside `infra/`",
    ),
    "infra/review/revision_diff.py::_revision_tree::tarfile.open(fileobj=io.BytesIO(archive.stdout))": (
        ELSEWHERE,
        "`git archive` of a revision of this repository",
        "extracted with tarfile's `data` filter (no links out, no special files)",
    ),
    "infra/review/revision_diff.py::trainer_file_changes.digests::p.read_bytes()": (
        OWN,
        "the trainer's modules in the checkout or in a revision of it",
        "`training/*.py` of this repository (`bundle_files`), hashed",
    ),
    "infra/review/stack_paths.py::with_absolute_workload_paths::json.loads(workload)": (
        ELSEWHERE,
        "the workload map as the engine's JSON text",
        "a value of the stack file, read through `infra/readers/stack_file.py` (1 MiB)",
    ),
    # infra/startup ------------------------------------------------------------------------------
    "infra/startup/bundle.py::trainer_files::p.read_bytes()": (
        OWN,
        "the trainer's modules (`training/`)",
        "shipped in the repository",
    ),
    "infra/startup/bundle.py::cached_bundle::Path(__file__).read_bytes()": (
        OWN,
        "this module's source, for a cache key",
        "shipped in the repository",
    ),
    "infra/startup/bundle.py::cached_bundle::path.read_bytes()": (
        OWN,
        "the trainer's modules (`training/`), for a cache key",
        "shipped in the repository",
    ),
    "infra/startup/bundle.py::cached_stripper::Path(shipped_source.__file__).read_bytes()": (
        OWN,
        "the source of `infra/startup/shipped_source.py`, for a cache key",
        "shipped in the repository",
    ),
    "infra/startup/bundle.py::cached_compress::Path(__file__).read_bytes()": (
        OWN,
        "this module's source, for a cache key",
        "shipped in the repository",
    ),
    "infra/startup/content_cache.py::ContentCache.get::self._path(namespace, key).read_bytes()": (
        OWN,
        "an entry of the content cache (`.multislice/cache`)",
        "written by `ContentCache.put`; its SHA-256 line is checked, a mismatch is a miss",
    ),
    "infra/startup/content_cache.py::for_project::os.environ.get(CACHE_DIR_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_CACHE_DIR`",
        "a folder; what cannot be read or written there is a cache miss",
    ),
    "infra/startup/lockfile.py::vm_pins::json.loads(compute())": (
        OWN,
        "pins this process just serialized",
        "`json.dumps` in `compute`",
    ),
    "infra/startup/lockfile.py::vm_pins::json.loads(…)": (
        OWN,
        "pins from the content cache",
        "written by `compute`, checked by its SHA-256 line (`ContentCache.get`)",
    ),
    "infra/startup/lockfile.py::vm_pins::….read_bytes()": (
        OWN,
        "this package's modules, for a cache key",
        "shipped in the repository",
    ),
    "infra/startup/lockfile.py::vm_pins::path.read_bytes()": (
        OWN,
        "`uv.lock` and `.python-version` of the checkout, for a cache key",
        "shipped in the repository",
    ),
    "infra/startup/templates.py::_part::….read_text()": (
        OWN,
        "a startup template (`infra/startup/*.sh.in`)",
        "package data shipped in the repository",
    ),
    "infra/startup/uv_lock.py::Lock.__init__::tomllib.loads(self.path.read_text())": (
        OWN,
        "`uv.lock` of the checkout",
        "shipped in the repository; its `[[package]]` entries checked",
    ),
    "infra/startup/workload.py::source_archive::path.read_bytes()": (
        ELSEWHERE,
        "the files of `multislice:workload.source`",
        "`source_files` (`infra/config/workload.py`): regular files, no links, `MAX_SOURCE_BYTES` in all",
    ),
    # infra/status -------------------------------------------------------------------------------
    "infra/status/reader.py::cloud_reader::os.environ": (
        ELSEWHERE,
        "the environment's credential settings",
        "`infra/credentials.py` `problem()` checks them (`infra/backends/capacity.py`)",
    ),
    "infra/status/reader.py::cloud_reader::os.environ.get(STORAGE_ENDPOINT_ENV)": (
        ELSEWHERE,
        "`STORAGE_EMULATOR_HOST`, whether it is set",
        "only tested for being set (anonymous requests to the emulator)",
    ),
    "infra/status/store.py::storage_url::os.environ.get(STORAGE_ENDPOINT_ENV)": (
        ELSEWHERE,
        "`STORAGE_EMULATOR_HOST`",
        "a URL base; a request to a wrong one is a `StoreError`, one line",
    ),
    "infra/status/store.py::RunStore._get::response.json()": (
        TRUSTED,
        "Cloud Storage's error body",
        "Google's answer, decoded by requests; one without `error.message` falls back to 200 characters",
    ),
    "infra/status/store.py::RunStore._get::response.text": (
        ELSEWHERE,
        "an HTTP error body of Cloud Storage",
        "cut to 200 characters for the message",
    ),
    "infra/status/store.py::RunStore.list::response.json()": (
        TRUSTED,
        "Cloud Storage's listing of the run directory",
        "Google's answer, decoded by requests: 1,000 items a page, the fields asked for",
    ),
    "infra/status/store.py::RunStore._read_one::response.content": (
        READER,
        "an object of the run directory",
        "decoded by `training.run_objects.json_record` (`infra/status/progress.py`, `training/metrics/run_log.py`)",
    ),
    # training -----------------------------------------------------------------------------------
    "training/__main__.py::run::config.read_bytes()": (
        OWN,
        "the `TrainConfig` JSON of the release",
        "written by the program into the release; `load_train_config` validates it",
    ),
    "training/__main__.py::run::os.environ.get('GLIBC_TUNABLES')": (
        OWN,
        "`GLIBC_TUNABLES`, for a log line",
        "set by `training/host_allocator.py` before it re-ran this process",
    ),
    "training/aot.py::main::sys.stdin.read": (
        OWN,
        "a `TrainConfig` on stdin",
        "written by its parent, `infra/planner/compiled.py`; `load_train_config` validates it",
    ),
    "training/bench/shardings.py::run::in os.environ": (
        ELSEWHERE,
        "whether `JAX_NUM_CPU_DEVICES` is set",
        "only tested for being set (JAX reads its value)",
    ),
    "training/bench/shardings.py::run::os.environ.get('XLA_FLAGS')": (
        ELSEWHERE,
        "`XLA_FLAGS`",
        "only searched for one flag's name (XLA reads the value)",
    ),
    "training/checkpoint/fallback.py::fall_back_once::json.loads(…)": (
        OWN,
        "process 0's list of set-aside steps",
        "`json.dumps` of a peer of the same job (`training.agreement.all_gather`)",
    ),
    "training/checkpoint/manager.py::check_run_config::json.loads(config.model_dump_json())": (
        OWN,
        "this process's own `TrainConfig`",
        "pydantic's JSON of the model in memory",
    ),
    "training/checkpoint/restore.py::agree_on_steps::json.loads(listings[0])": (
        OWN,
        "process 0's checkpoint steps",
        "`json.dumps` of a peer of the same job (`training.agreement.all_gather`)",
    ),
    "training/checkpoint/restore.py::restore::json.loads(…)": (
        OWN,
        "process 0's checkpoint steps",
        "`json.dumps` of a peer of the same job (`training.agreement.all_gather`)",
    ),
    "training/cluster.py::metadata_host::os.environ.get('GCE_METADATA_IP')": (
        ELSEWHERE,
        "`GCE_METADATA_IP`, the metadata server's host",
        "a host for the request: one that does not answer is a `MetadataError`",
    ),
    "training/cluster.py::get_metadata::urlopen(request)": (
        TRUSTED,
        "a key of the VM's metadata server",
        "Google's answer on the VM (Cloud TPU's keys); each parsed and checked in `training/cluster.py`",
    ),
    "training/cluster.py::identity_from_environment::os.environ": (
        ELSEWHERE,
        "`TPU_WORKER_ID`, `TPU_WORKER_HOSTNAMES`, `TPU_PROCESS_ADDRESSES`, `MEGASCALE_*`",
        "checked in this function: a `MetadataError` naming the variable",
    ),
    "training/cluster.py::identity_in_environment::os.environ.get(IDENTITY_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_IDENTITY`",
        "checked here: one of `IDENTITY_SOURCES`, else a `MetadataError` naming it",
    ),
    "training/cluster.py::identity_in_environment::in os.environ": (
        ELSEWHERE,
        "whether `TPU_WORKER_HOSTNAMES` is set",
        "only tested for being set",
    ),
    "training/cluster.py::identity_in_environment::in os.environ #2": (
        ELSEWHERE,
        "whether `TPU_PROCESS_ADDRESSES` is set",
        "only tested for being set",
    ),
    "training/compile_cache.py::enable::os.environ.get(SHARED_DIR_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_COMPILATION_CACHE_DIR`",
        "a folder for JAX's cache; its entries are checked (`CheckedCache`)",
    ),
    "training/data/storage.py::Storage._pread::os.pread(fd)": (
        ELSEWHERE,
        "a byte range of a shard",
        "the range the checked manifest gives, of a regular file (`training.run_objects.open_regular`)",
    ),
    "training/data/text.py::ByteCorpus._file_bytes::epath.Path(path).read_bytes()": (
        ELSEWHERE,
        "a file of a byte corpus",
        "a file the source listing found with its size; another size is a `DataError`",
    ),
    "training/fault_gate.py::FaultGate.from_env::os.environ": (
        ELSEWHERE,
        "`MULTISLICE_FAULT_GATE`, `MULTISLICE_FAULT_STEPS` (the emulator's)",
        "checked here: step numbers, else one line naming the variable",
    ),
    "training/heartbeats.py::interval_s::os.environ.get(INTERVAL_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_ELASTIC_HEARTBEAT_S`",
        "checked here: a number in (0, 3600), else the default",
    ),
    "training/knobs.py::log_level::os.environ": (
        ELSEWHERE,
        "`MULTISLICE_LOG_LEVEL`",
        "checked here: one of Python's level names, else one line naming it (`python -m training run`: first)",
    ),
    "training/knobs.py::_parsed::os.environ": (
        ELSEWHERE,
        "`MULTISLICE_*_TIMEOUT_S`, `MULTISLICE_COORDINATOR_PORT`, `MULTISLICE_PREEMPTION_GRACE_S`",
        "checked here: a number in the knob's range, else one line naming it (`python -m training run`: all first)",
    ),
    "training/host_allocator.py::reexec_with_tunable::os.environ": (
        PASSED,
        "this process's environment",
        "handed to its re-run with `GLIBC_TUNABLES` added",
    ),
    "training/standby.py::_become_attempt::os.environ.get('GLIBC_TUNABLES')": (
        OWN,
        "`GLIBC_TUNABLES` of the standby itself",
        "set by `training/host_allocator.py` before it re-ran the standby; kept for the attempt it forks",
    ),
    "training/standby.py::_end_with_handoff::conn.recv()": (
        ELSEWHERE,
        "the handoff's side of the attempt's connection",
        "only its end is read (the handoff is gone); the bytes are dropped, 4 KiB at a time",
    ),
    "training/standby.py::main::os.environ.get(DIR_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_STANDBY_DIR`, the standby's folder (boot.sh sets it in the unit)",
        "unset: one line and exit 2; a folder that cannot be written fails the standby's first record",
    ),
    "training/standby.py::_serve_one::os.read(gate)": (
        OWN,
        "the gate pipe the standby opens before forking an attempt",
        "one byte, written by the standby once the attempt's pid is sent; anything else (its end closed "
        "first) ends the attempt unstarted",
    ),
    "training/standby.py::serve::os.environ": (
        ELSEWHERE,
        "the standby's own environment",
        "only compared with an attempt's (`standby_handoff.env_difference`): a difference is a refusal naming it",
    ),
    "training/standby.py::serve::wake_r.recv()": (
        OWN,
        "the standby's own signal wake-up socket (`signal.set_wakeup_fd`)",
        "bytes Python writes per signal; dropped",
    ),
    "training/standby_handoff.py::_hand_over::os.environ": (
        PASSED,
        "the attempt's environment",
        "sent unread to the standby, which compares it with its own and gives it to the attempt it forks",
    ),
    "training/standby_handoff.py::main::os.environ.get(DIR_ENV)": (
        ELSEWHERE,
        "`MULTISLICE_STANDBY_DIR`, the standby's folder",
        "unset: a cold start; its record is read through `training.run_objects.file_bytes` (64 KiB) and `json_record`",
    ),
    "training/start.py::start_kind::os.environ.get('MULTISLICE_START')": (
        OWN,
        "`MULTISLICE_START`, set by the handoff (cold) or the standby (warm)",
        "one of three forms; anything else records nothing, a reason is cut at 300 characters",
    ),
    "training/log_shipping.py::metadata::os.environ.get('GCE_METADATA_IP')": (
        ELSEWHERE,
        "`GCE_METADATA_IP`, the metadata server's host",
        "a host for the request: a failed one ships nothing (`OSError`, `ValueError` caught)",
    ),
    "training/log_shipping.py::metadata::urlopen(request)": (
        TRUSTED,
        "a key of the VM's metadata server (project, zone, ids)",
        "Google's answer on the VM; used as labels",
    ),
    "training/log_shipping.py::target::os.environ.get(LOG_RESOURCE_ENV)": (
        OWN,
        "`MULTISLICE_LOG_RESOURCE`",
        "written by the boot (`boot.sh.in`); another value ships nothing",
    ),
    "training/log_shipping.py::ship::os.environ.get('MULTISLICE_LOGGING_ENDPOINT')": (
        ELSEWHERE,
        "`MULTISLICE_LOGGING_ENDPOINT`",
        "an endpoint for the Logging client, with anonymous credentials; failures ship nothing",
    ),
    "training/log_shipping.py::main::os.environ.get('MULTISLICE_SLICE')": (
        OWN,
        "`MULTISLICE_SLICE`, for the lines' prefix",
        "written by the boot into the trainer's unit (`infra/vm_contract.py`)",
    ),
    "training/log_shipping.py::main::os.environ.get('MULTISLICE_WORKER')": (
        OWN,
        "`MULTISLICE_WORKER`, for the lines' prefix",
        "written by the boot into the trainer's unit (`infra/vm_contract.py`)",
    ),
    "training/log_shipping.py::main.work::os.environ.get('MULTISLICE_EMULATED_TPU')": (
        OWN,
        "`MULTISLICE_EMULATED_TPU`",
        "set by the emulator for its VMs; only tested for being set",
    ),
    "training/log_shipping.py::main::sys.stdin.buffer": (
        ELSEWHERE,
        "the trainer's output lines, piped in",
        "lines of at most `MAX_LINE_BYTES` (64 KiB; a longer one goes on in pieces), 10,000 queued (more are dropped)",
    ),
    "training/membership_gate.py::enter::os.environ.get(MEGASCALE_COORDINATOR_ENV)": (
        ELSEWHERE,
        "`MEGASCALE_COORDINATOR_ADDRESS` before the gate sets it",
        "kept to be set again as it was (`set_megascale_environment`)",
    ),
    "training/metrics/goodput.py::process_start_time::os.environ.get('MULTISLICE_ATTEMPT_STARTED')": (
        OWN,
        "`MULTISLICE_ATTEMPT_STARTED`, set by the warm standby in the attempt it forked",
        "the handoff's process start, from its own `/proc/self/stat`; a value that is no number is ignored",
    ),
    "training/metrics/goodput.py::process_start_time::open('/proc/self/stat')": (
        ELSEWHERE,
        "this process's `/proc/self/stat`",
        "a procfs line the kernel writes (proc(5)); anything else gives None",
    ),
    "training/metrics/run_log.py::TensorBoardLog.sync::path.read_bytes()": (
        OWN,
        "a TensorBoard event file this process's writer spooled",
        "in its own spool folder, uploaded as it is",
    ),
    "training/preemption.py::Notice._wait_for_notice::os.read(self._pipe[0])": (
        OWN,
        "this process's signal wake-up pipe",
        "512 bytes at most, the signal numbers Python wrote",
    ),
    "training/prepare/shards.py::make_plan::json.loads(json.dumps(plan))": (
        OWN,
        "a plan this process just serialized",
        "`json.dumps` of its own value",
    ),
    "training/prepare/text_stream.py::open_binary::fs.open(inner)": (
        ELSEWHERE,
        "the source text (`data prepare`), or a tokenizer file, in Cloud Storage",
        "text read in segments; a tokenizer file up to `MAX_OBJECT_BYTES` (`shards.py`); a local file: `open_regular`",
    ),
    "training/run_dir.py::RunDir.read::(self.path / name).read_bytes()": (
        READER,
        "an object of a `gs://` run directory",
        "decoded by `training.run_objects.json_record` (64 MiB once fetched); local: `training.run_objects.file_bytes`",
    ),
    "training/run_objects.py::json_record::json.loads(data.decode('utf-8'))": (
        READER,
        "a run-directory object's bytes",
        "`training.run_objects.json_record`",
    ),
    "training/run_objects.py::open_regular::os.open(path)": (
        READER,
        "a local object, shard, source text or tokenizer file",
        "`training.run_objects.open_regular` (for `training.run_objects.file_bytes` too)",
    ),
    "training/run_objects.py::file_bytes::os.read(fd)": (
        READER,
        "a local object of a run directory or a prepared dataset",
        "`training.run_objects.file_bytes`",
    ),
    "training/workload.py::megascale_values::os.environ.items": (
        PASSED,
        "`MEGASCALE_*` of the environment",
        "handed to the stack's own command as they are",
    ),
    "training/workload.py::read_spec::json.loads(path.read_text(encoding='utf-8'))": (
        OWN,
        "the release's `workload.json`",
        "written by `infra/startup/workload.py`; each field checked, one line",
    ),
    "training/workload.py::run::os.environ": (
        PASSED,
        "this process's environment",
        "handed to the stack's own command (`command_environment`)",
    ),
}


def test_every_read_site_is_in_the_inventory():
    unlisted = sorted(set(read_sites()) - set(INVENTORY))
    assert not unlisted, (
        "reads of outside bytes that INVENTORY (tests/readers/test_outside_bytes.py) does not list: "
        + ", ".join(unlisted)
        + "; classify it here or read it through infra/readers"
    )


def test_no_inventory_entry_is_stale():
    stale = sorted(set(INVENTORY) - set(read_sites()))
    assert not stale, f"INVENTORY lists reads that are no longer there: {', '.join(stale)}"


def test_each_entry_is_a_category_and_two_short_lines():
    for site, (category, what, why) in INVENTORY.items():
        assert category in CATEGORIES, site
        for text in (site, what, why):
            assert text.strip() and "|" not in text and "\n" not in text and len(text) <= 200, (site, text)


def test_each_reader_entry_names_a_function_of_the_readers():
    for site, (category, _, why) in INVENTORY.items():
        if category != READER:
            continue
        named = re.findall(r"`([a-z_.]+)\.([a-z_]+)`", why)
        found = [
            (module, name)
            for module, name in named
            if module in READER_MODULES and callable(getattr(importlib.import_module(module), name, None))
        ]
        assert found, f"{site}: a reader entry names its reader as `module.function` of {READER_MODULES}"


def page_tables(inventory: dict[str, tuple[str, str, str]] = INVENTORY) -> str:
    """The page's tables: one section per category, a row per site, sorted."""
    parts = []
    for category, heading in CATEGORIES.items():
        rows = sorted((site, what, why) for site, (kind, what, why) in inventory.items() if kind == category)
        parts += [f"## {heading} (`{category}`)", "", "| site | what it reads | bound, or why none is needed |"]
        parts += ["| --- | --- | --- |", *(f"| `{site}` | {what} | {why} |" for site, what, why in rows), ""]
    return "\n".join(parts)


def page_inventory(text: str) -> dict[str, tuple[str, str, str]]:
    """The rows of the page's tables, site → (its section's category, what, why)."""
    found: dict[str, tuple[str, str, str]] = {}
    category = None
    for line in text.splitlines():
        if heading := re.fullmatch(r"## .* \(`([a-z-]+)`\)", line):
            category = heading[1]
        elif line.startswith("| `") and category is not None:
            site, what, why = (cell.strip() for cell in line.strip().strip("|").split(" | "))
            assert site.strip("`") not in found, f"{site} is on the page twice"
            found[site.strip("`")] = (category, what, why)
    return found


def test_the_page_lists_the_inventory():
    on_page = page_inventory(PAGE.read_text(encoding="utf-8"))
    assert on_page == INVENTORY, (
        "docs/outside-bytes.md and INVENTORY differ; print the tables with "
        "`.venv/bin/python -m tests.readers.test_outside_bytes` and paste them in: "
        + ", ".join(sorted(site for site in set(on_page) | set(INVENTORY) if on_page.get(site) != INVENTORY.get(site)))
    )
    assert page_inventory(page_tables()) == INVENTORY  # the printed tables read back as they were


SAMPLE = """
import json as j, os, sys, tarfile, yaml
from pathlib import Path
from urllib.request import urlopen

CONFIG = j.loads(Path("x").read_text())

def f(path, env):
    open(path, "w").write("a")
    open(path, "ab" if env else "wb")
    os.environ["A"] = "1"
    os.environ.update({})
    tarfile.open(fileobj=path, mode="w")
    os.open(path, os.O_WRONLY)
    sys.stdin.isatty()
    urlopen("http://x")
    return open(path), os.environ["B"], os.getenv("C"), env.read_bytes(), yaml.safe_load(path)

class C:
    def g(self):
        with urlopen("http://x") as response:
            return response.content, response.json(), sys.stdin.read(), dict(os.environ), "D" in os.environ
"""


def test_the_scan_finds_each_kind_of_read_and_no_write(tmp_path):
    (tmp_path / "infra").mkdir()
    (tmp_path / "infra" / "sample.py").write_text(SAMPLE)
    assert read_sites(tmp_path, ("infra",)) == [
        "infra/sample.py::<module>::json.loads(Path('x').read_text())",
        "infra/sample.py::f::open(path)",
        "infra/sample.py::f::os.environ['B']",
        "infra/sample.py::f::os.getenv('C')",
        "infra/sample.py::f::env.read_bytes()",
        "infra/sample.py::f::yaml.safe_load(path)",
        "infra/sample.py::C.g::urlopen('http://x')",
        "infra/sample.py::C.g::response.content",
        "infra/sample.py::C.g::response.json()",
        "infra/sample.py::C.g::sys.stdin.read",
        "infra/sample.py::C.g::os.environ",
        "infra/sample.py::C.g::in os.environ",
    ]


# Reads moved onto the readers (each its bound, refused in one line) -----------------------------


def test_a_completion_marker_is_decoded_by_the_run_objects_reader():
    from infra.backends.queued_resource.provider.completion import completed_step
    from training.run_objects import MAX_OBJECT_BYTES

    assert completed_step(b'{"step": 10}', 10) == 10
    assert completed_step(b"[" * 100_000, 10) is None  # nested past the parser: not a RecursionError
    assert completed_step(b'{"step": 10}' + b" " * MAX_OBJECT_BYTES, 10) is None  # over 64 MiB: not decoded


def test_a_requirements_file_swapped_since_validation_is_refused_unread(tmp_path):
    from infra.config.workload import MAX_REQUIREMENTS_BYTES, WorkloadSettings
    from infra.readers.files import UnreadableFile
    from infra.startup.lockfile import install_target
    from infra.startup.workload import workload_files

    def release(requirements: Path):  # validated when the file was a small one: then it changed
        settings = WorkloadSettings.model_construct(command=("true",), steps=1, requirements=requirements, env={})
        return workload_files("dev", settings, install_target(), None)

    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    with pytest.raises(UnreadableFile, match="^a FIFO, not a regular file$"):  # read_text would wait for a writer
        release(fifo)
    grown = tmp_path / "grown.txt"
    grown.write_bytes(b"#\n" * (MAX_REQUIREMENTS_BYTES // 2 + 1))
    with pytest.raises(UnreadableFile, match="over the 1,048,576 read"):
        release(grown)


if __name__ == "__main__":
    sys.stdout.write(page_tables())

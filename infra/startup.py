"""The TPU VM startup script, rendered from ``infra/startup.sh.in`` for a stack.

:func:`render` turns a :class:`~infra.config.StackConfig` into one bash script that every TPU
VM of the stack boots with (metadata key ``startup-script``). The same bytes run in the local
emulator (``infra/local``), so the script is byte-identical for a given checkout on every
machine and every run: no timestamps, no absolute local paths, sorted everything. A change of
the trainer code, the trainer config or the pinned requirements changes the script, and only
such a change does (the queued resource converges by updating metadata and resetting).

The bash lives in ``infra/startup.sh.in`` (package data, shellchecked by
tests/test_startup.py); :func:`render` fills its ``@@NAME@@`` placeholders in one pass. The
script carries three payloads:

* the trainer bundle (:func:`infra.bundle.build_bundle`): ``training/*.py`` as a tar.gz,
  base64 in a quoted heredoc; its sha256 is checked on the VM before unpacking;
* the trainer config: ``config.training.model_dump_json()`` (a :class:`TrainConfig`);
* the pinned requirements of the VM environment (``infra.lockfile``) and the pinned ``uv``
  wheel that installs them.

Runtime contract (the emulator and ``training/__main__.py`` rely on it):

* environment inputs, all optional (defaults are a real TPU VM):
  ``GCE_METADATA_IP`` (metadata server ``host[:port]``, default ``metadata.google.internal``),
  ``MULTISLICE_HOME`` (VM-local state, default ``/var/lib/multislice``),
  ``MULTISLICE_PYTHON`` (a Python that already has the trainer's dependencies; then no
  environment is built and nothing is installed),
  ``MULTISLICE_RESTART_BACKOFF_S`` / ``MULTISLICE_RESTART_BACKOFF_MAX_S`` (first restart delay
  and its cap in seconds, decimals allowed; default 1 and 60; tests make them small).
  Every other variable passes through to the trainer unchanged; the script adds
  ``PYTHONPATH=<app>`` and ``PYTHONUNBUFFERED=1`` (unless already set).
* metadata (``instance/attributes/``): ``agent-worker-number`` (absent → 0, with a warning),
  ``tpu-env`` (``MEGASCALE_SLICE_ID: '<n>'``; absent → slice 0), ``multislice-run-dir``
  (required: the run directory, local path or ``gs://`` URI).
* every output line, the script's and the trainer's, starts with ``[slice S worker W] ``.
* idempotent: the environment ``$MULTISLICE_HOME/venv`` is rebuilt only when its stored
  requirements sha256 differs; the bundle unpacks once into
  ``$MULTISLICE_HOME/app/<bundle_sha256>/`` (completion marker ``.complete``).
* supervision: ``$PY -m training run --config <app>/config.json --run-dir <run_dir>`` with
  cwd and ``PYTHONPATH`` = ``<app>``. Exit 0 → exit 0. Non-zero → restart after 1, 2, 4, …
  (capped 60) seconds, at most :data:`MAX_RESTARTS` times, then exit 1; status
  :data:`CONFIG_ERROR_STATUS` (78) is never restarted: the script exits with it. SIGTERM/SIGINT →
  SIGTERM to the trainer, wait, exit with the trainer's status, no restart (exit 128+signal
  if the signal comes while no trainer runs, i.e. during a restart delay).
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from infra import content_cache, lockfile
from infra.bundle import BUNDLE_PACKAGE, cached_bundle
from infra.config import StackConfig

#: GCE limit on one metadata value: "less than or equal to 262144 bytes (256 KiB)"
#: (https://cloud.google.com/compute/docs/reference/rest/v1/Metadata, ``items[].value``).
METADATA_VALUE_LIMIT_BYTES = 256 * 1024

#: What we aim for (and what tests/test_startup.py checks for the checked-in stacks).
TARGET_SIZE_BYTES = 64 * 1024

#: Restarts of a failing trainer before the script gives up (exit 1).
MAX_RESTARTS = 10

#: Trainer exit status for a configuration that can never work (EX_CONFIG from sysexits.h;
#: ``training.train.EXIT_CONFIG``): restarting would only repeat the error, so the script
#: exits with it at once.
CONFIG_ERROR_STATUS = 78

#: First restart delay and its cap, seconds (overridable on the VM through the environment).
RESTART_BACKOFF_S = 1
RESTART_BACKOFF_MAX_S = 60

#: Default VM-local state directory and metadata host.
DEFAULT_HOME = "/var/lib/multislice"
DEFAULT_METADATA_HOST = "metadata.google.internal"

#: Metadata attribute that holds the run directory (set by the queued resource).
RUN_DIR_ATTRIBUTE = "multislice-run-dir"


class StartupScriptTooLarge(ValueError):
    """The rendered script does not fit in one GCE metadata value (256 KiB)."""


@dataclass(frozen=True)
class RenderedScript:
    """A rendered startup script.

    Attributes:
      text: the whole bash script (UTF-8, ``\\n`` line ends).
      sha256: hex sha256 of ``text`` encoded as UTF-8.
      bundle_sha256: hex sha256 of the decoded trainer bundle (the tar.gz bytes).
      requirements_sha256: hex sha256 of the embedded requirements text.
      size_bytes: ``len(text.encode())``, what counts against the metadata limit.
    """

    text: str
    sha256: str
    bundle_sha256: str
    requirements_sha256: str
    size_bytes: int


#: The script's bash, with ``@@NAME@@`` placeholders: package data of :mod:`infra`.
TEMPLATE_RESOURCE = "startup.sh.in"

_PLACEHOLDER = re.compile(r"@@([A-Z0-9_]+)@@")


def template() -> str:
    """The bash of the startup script, placeholders unfilled (``infra/startup.sh.in``).

    Everything but the ``@@NAME@@`` placeholders is literal bash. A payload placeholder has a
    line of its own, followed by the line that ends its quoted heredoc, so that the template
    itself is a well-formed script that shellcheck can lint.
    """
    return resources.files("infra").joinpath(TEMPLATE_RESOURCE).read_text(encoding="utf-8")


def fill(text: str, values: dict[str, str]) -> str:
    """``text`` with every ``@@NAME@@`` replaced by ``values[NAME]``, in one pass (a value
    that happens to contain ``@@NAME@@`` is never substituted again).

    Raises:
      ValueError: a placeholder has no value, or a value has no placeholder (the template
        and the renderer disagree; the message names them).
    """
    used = set(_PLACEHOLDER.findall(text))
    if used != set(values):
        missing, unused = sorted(used - set(values)), sorted(set(values) - used)
        raise ValueError(
            f"{TEMPLATE_RESOURCE} and infra/startup.py disagree: placeholders without a value {missing}, "
            f"values without a placeholder {unused}"
        )
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


def _heredoc_body(text: str, delimiter: str) -> str:
    """``text`` for a payload placeholder, whose next template line is ``delimiter``: the
    body is ``text`` with a final newline (added if missing), so the value is ``text``
    without it. Refuses text that holds the delimiter as a line."""
    if any(line == delimiter for line in text.splitlines()):
        raise ValueError(f"payload contains the heredoc delimiter line {delimiter!r}")
    return text.removesuffix("\n")


def render(config: StackConfig, *, project_root: Path | None = None) -> RenderedScript:
    """Render the startup script of a stack.

    Args:
      config: the validated stack (its ``training`` is embedded as config.json).
      project_root: checkout with ``training/``, ``uv.lock``, ``.python-version``; default:
        the one this module lives in. The output does not depend on where it is.

    Returns:
      RenderedScript; ``text`` is identical for identical inputs.

    Raises:
      StartupScriptTooLarge: the script exceeds :data:`METADATA_VALUE_LIMIT_BYTES` (256 KiB,
        the GCE limit on one metadata value).
      infra.uv_lock.LockfileError: the lock cannot give the VM's pinned requirements.
      FileNotFoundError: no ``training/*.py`` under ``project_root``.
    """
    root = Path(project_root) if project_root is not None else lockfile.default_project_root()
    cache = content_cache.for_project(root)  # bundle and pins: computed once per content
    bundle = cached_bundle(root / BUNDLE_PACKAGE, cache)
    bundle_sha256 = hashlib.sha256(bundle).hexdigest()
    pins = lockfile.vm_pins(root, cache)
    values = {
        "STACK": config.stack,
        "ACCELERATOR": config.accelerator_type,
        "SLICES": str(config.slices),
        "BUNDLE_SHA256": bundle_sha256,
        "REQUIREMENTS_SHA256": pins.requirements_sha256,
        "PYTHON_VERSION": shlex.quote(pins.python_version),
        "UV_VERSION": pins.uv_version,
        "MAX_RESTARTS": str(MAX_RESTARTS),
        "CONFIG_ERROR_STATUS": str(CONFIG_ERROR_STATUS),
        "BACKOFF": str(RESTART_BACKOFF_S),
        "BACKOFF_MAX": str(RESTART_BACKOFF_MAX_S),
        "DEFAULT_HOME": DEFAULT_HOME,
        "DEFAULT_METADATA_HOST": DEFAULT_METADATA_HOST,
        "RUN_DIR_ATTRIBUTE": RUN_DIR_ATTRIBUTE,
        "REQUIREMENTS": _heredoc_body(pins.requirements_text, "MULTISLICE_REQUIREMENTS"),
        "UV_REQUIREMENT": _heredoc_body(pins.uv_requirement_text, "MULTISLICE_UV"),
        "BUNDLE_BASE64": _heredoc_body(base64.encodebytes(bundle).decode("ascii"), "MULTISLICE_BUNDLE"),
        "CONFIG_JSON": _heredoc_body(config.training.model_dump_json(), "MULTISLICE_CONFIG"),
    }
    text = fill(template(), values)
    data = text.encode("utf-8")
    if len(data) > METADATA_VALUE_LIMIT_BYTES:
        raise StartupScriptTooLarge(
            f"startup script of stack {config.stack!r} is {len(data)} bytes ({len(data) / 1024:.1f} KiB), "
            f"over the GCE metadata value limit of {METADATA_VALUE_LIMIT_BYTES} bytes "
            f"({METADATA_VALUE_LIMIT_BYTES // 1024} KiB); shrink training/ or the requirements"
        )
    return RenderedScript(
        text=text,
        sha256=hashlib.sha256(data).hexdigest(),
        bundle_sha256=bundle_sha256,
        requirements_sha256=pins.requirements_sha256,
        size_bytes=len(data),
    )


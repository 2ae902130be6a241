"""The TPU VM startup script: rendering and the reproducible trainer bundle.

:func:`render` turns a :class:`~infra.config.StackConfig` into one bash script that every TPU
VM of the stack boots with (metadata key ``startup-script``). The same bytes run in the local
emulator (``infra/local``), so the script is byte-identical for a given checkout on every
machine and every run: no timestamps, no absolute local paths, sorted everything. A change of
the trainer code, the trainer config or the pinned requirements changes the script, and only
such a change does (the queued resource converges by updating metadata and resetting).

The script carries three payloads:

* the trainer bundle (:func:`build_bundle`): ``training/*.py`` as a tar.gz, base64 in a
  quoted heredoc; its sha256 is checked on the VM before unpacking;
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
import gzip
import hashlib
import io
import re
import shlex
import tarfile
from dataclasses import dataclass
from pathlib import Path

from infra import lockfile
from infra.config import StackConfig

#: GCE limit on one metadata value (DESIGN.md "Cloud TPU API": 256 KiB per value).
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

#: Name of the trainer package inside the bundle (``python -m training``).
BUNDLE_PACKAGE = "training"


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


# Bundle ---------------------------------------------------------------------------------------


def bundle_files(training_dir: Path) -> list[Path]:
    """The files that go into the bundle: ``*.py`` under ``training_dir`` (recursively, no
    ``__pycache__``), sorted by their POSIX path relative to it."""
    training_dir = Path(training_dir)
    files = [
        p
        for p in training_dir.rglob("*.py")
        if p.is_file() and "__pycache__" not in p.relative_to(training_dir).parts
    ]
    return sorted(files, key=lambda p: p.relative_to(training_dir).as_posix())


def build_bundle(training_dir: Path) -> bytes:
    """A reproducible ``tar.gz`` of the trainer package.

    Entries are ``training/<relative path>`` for :func:`bundle_files`, sorted, regular files
    only, with mtime 0, uid/gid 0, empty user/group names and mode 0644 (PAX format); the
    gzip header has mtime 0 and no file name. Equal sources give equal bytes on a machine;
    across machines the bytes also depend on the deflate implementation (zlib; a zlib-ng
    build of Python would compress differently).

    Raises:
      FileNotFoundError: ``training_dir`` is missing or holds no ``*.py`` file.
    """
    training_dir = Path(training_dir)
    files = bundle_files(training_dir) if training_dir.is_dir() else []
    if not files:
        raise FileNotFoundError(f"no *.py files under {training_dir}: nothing to bundle")
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{BUNDLE_PACKAGE}/{path.relative_to(training_dir).as_posix()}")
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    gz_buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=gz_buffer, compresslevel=9, mtime=0) as gz:
        gz.write(tar_buffer.getvalue())
    return gz_buffer.getvalue()


# Rendering ------------------------------------------------------------------------------------

# Placeholders are @@NAME@@; everything else is literal bash. Heredocs are quoted, so their
# bodies are never expanded by bash.
_TEMPLATE = r"""#!/bin/bash
# multislice startup script for stack @@STACK@@: @@ACCELERATOR@@ x @@SLICES@@ slice(s)
# bundle sha256:       @@BUNDLE_SHA256@@
# requirements sha256: @@REQUIREMENTS_SHA256@@
# rendered by infra/startup.py — do not edit
#
# Runs the bundled trainer (python -m training run) under a restarting supervisor.
# Environment (all optional): GCE_METADATA_IP (metadata host[:port]), MULTISLICE_HOME
# (state dir, default @@DEFAULT_HOME@@), MULTISLICE_PYTHON (a Python that already has the
# trainer's dependencies: skip building the environment), MULTISLICE_RESTART_BACKOFF_S and
# MULTISLICE_RESTART_BACKOFF_MAX_S (first restart delay and cap, seconds; default
# @@BACKOFF@@ and @@BACKOFF_MAX@@). Metadata: agent-worker-number, tpu-env (MEGASCALE_SLICE_ID),
# @@RUN_DIR_ATTRIBUTE@@ (required). Safe to re-run: finished steps are skipped.
set -euo pipefail

readonly BUNDLE_SHA256=@@BUNDLE_SHA256@@
readonly REQUIREMENTS_SHA256=@@REQUIREMENTS_SHA256@@
readonly PYTHON_VERSION=@@PYTHON_VERSION@@
readonly MAX_RESTARTS=@@MAX_RESTARTS@@
readonly CONFIG_ERROR_STATUS=@@CONFIG_ERROR_STATUS@@
readonly METADATA_URL="http://${GCE_METADATA_IP:-@@DEFAULT_METADATA_HOST@@}/computeMetadata/v1/instance/attributes"
backoff=${MULTISLICE_RESTART_BACKOFF_S:-@@BACKOFF@@}
backoff_max=${MULTISLICE_RESTART_BACKOFF_MAX_S:-@@BACKOFF_MAX@@}
home_dir=${MULTISLICE_HOME:-@@DEFAULT_HOME@@}

log_prefix='[slice ? worker ?] '
log() { printf '%s%s\n' "$log_prefix" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# metadata KEY: print the attribute; status 3 if it does not exist (HTTP 404), 2 on failure.
metadata() {
  local url="$METADATA_URL/$1" response status=0 code
  response=$(curl -s --connect-timeout 5 --max-time 10 --retry 5 --retry-delay 1 --retry-connrefused \
    -H 'Metadata-Flavor: Google' -w '\n%{http_code}' "$url") || status=$?
  if ((status != 0)); then
    log "error: cannot read metadata $url (curl exit status $status)"
    return 2
  fi
  code=${response##*$'\n'}
  case $code in
    200) printf '%s' "${response%$'\n'*}" ;;
    404) return 3 ;;
    *) log "error: metadata $url answered HTTP $code"; return 2 ;;
  esac
}

is_number() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
is_number "$backoff" || die "MULTISLICE_RESTART_BACKOFF_S=$backoff is not a number of seconds"
is_number "$backoff_max" || die "MULTISLICE_RESTART_BACKOFF_MAX_S=$backoff_max is not a number of seconds"
min_delay() { awk -v a="$1" -v b="$2" 'BEGIN { print (a + 0 < b + 0) ? a + 0 : b + 0 }'; }

# --- identity: worker in the slice and slice id (recomputed at every start) ---------------
status=0
worker=$(metadata agent-worker-number) || status=$?
case $status in
  0) ;;
  3) log "warning: metadata agent-worker-number is absent; assuming worker 0"; worker=0 ;;
  *) exit 1 ;;
esac
[[ $worker =~ ^[0-9]+$ ]] || die "metadata agent-worker-number is not a number: '$worker'"
status=0
tpu_env=$(metadata tpu-env) || status=$?
case $status in
  0) ;;
  3) tpu_env='' ;;
  *) exit 1 ;;
esac
slice=0
slice_re="^MEGASCALE_SLICE_ID:[[:space:]]*'?([0-9]+)'?[[:space:]]*$"
while IFS= read -r line || [[ -n $line ]]; do
  line=${line%$'\r'}
  if [[ $line =~ $slice_re ]]; then slice=$((10#${BASH_REMATCH[1]})); fi
done <<<"$tpu_env"
worker=$((10#$worker))

# From here on every line (ours, uv's, the trainer's) goes through the prefixer, which
# ignores SIGTERM/SIGINT so that the last lines of a stopping trainer still come out.
readonly LINE_PREFIX="[slice $slice worker $worker] "
prefix_lines() {
  trap '' TERM INT HUP
  local text
  while IFS= read -r text || [[ -n $text ]]; do printf '%s%s\n' "$LINE_PREFIX" "$text"; done
}
exec > >(prefix_lines) 2>&1
log_prefix=''

status=0
run_dir=$(metadata @@RUN_DIR_ATTRIBUTE@@) || status=$?
case $status in
  0) ;;
  3) die "metadata attribute @@RUN_DIR_ATTRIBUTE@@ is missing: set it on the TPU VM (the run directory, a local path or gs:// URI)" ;;
  *) exit 1 ;;
esac
[[ -n $run_dir ]] || die "metadata attribute @@RUN_DIR_ATTRIBUTE@@ is empty"
case $run_dir in
  *://* | /*) ;;
  *) run_dir="$PWD/$run_dir" ;;
esac
log "stack @@STACK@@, @@ACCELERATOR@@ x @@SLICES@@, run dir $run_dir, bundle ${BUNDLE_SHA256:0:12}"

mkdir -p "$home_dir"
home_dir=$(cd "$home_dir" && pwd -P)
if command -v flock >/dev/null 2>&1; then
  exec 9>"$home_dir/.setup.lock"
  flock 9
fi

# --- environment: Python + pinned requirements (skipped with MULTISLICE_PYTHON) -----------
write_requirements() {
  cat <<'MULTISLICE_REQUIREMENTS'
@@REQUIREMENTS@@MULTISLICE_REQUIREMENTS
}

write_uv_requirement() {
  cat <<'MULTISLICE_UV'
@@UV_REQUIREMENT@@MULTISLICE_UV
}

build_environment() {
  local venv="$home_dir/venv" envs="$home_dir/envs" target="$home_dir/envs/$REQUIREMENTS_SHA256" tmp uv old
  if [[ -x $venv/bin/python && -f $venv/requirements.sha256 ]] &&
    [[ $(<"$venv/requirements.sha256") == "$REQUIREMENTS_SHA256" ]]; then
    log "environment $venv is up to date (requirements ${REQUIREMENTS_SHA256:0:12})"
    return 0
  fi
  log "building the environment for requirements ${REQUIREMENTS_SHA256:0:12} (Python $PYTHON_VERSION, uv @@UV_VERSION@@)"
  command -v python3 >/dev/null 2>&1 || die "python3 is needed to install uv and is not on PATH"
  mkdir -p "$envs"
  rm -rf "$envs"/.build.*
  tmp=$(mktemp -d "$envs/.build.XXXXXX")
  write_uv_requirement >"$tmp/uv-requirements.txt"
  write_requirements >"$tmp/requirements.txt"
  python3 -m pip install --disable-pip-version-check --no-input --no-deps --require-hashes \
    --target "$tmp/uv" -r "$tmp/uv-requirements.txt"
  uv="$tmp/uv/bin/uv"
  [[ -x $uv ]] || die "pip did not install the uv binary at $uv"
  export UV_PYTHON_INSTALL_DIR="$home_dir/python" UV_CACHE_DIR="$home_dir/cache/uv"
  "$uv" --no-config python install "$PYTHON_VERSION"
  "$uv" --no-config venv --no-project --managed-python --relocatable --python "$PYTHON_VERSION" "$tmp/venv"
  "$uv" --no-config pip install --python "$tmp/venv/bin/python" --require-hashes -r "$tmp/requirements.txt"
  unset UV_PYTHON_INSTALL_DIR UV_CACHE_DIR
  printf '%s\n' "$REQUIREMENTS_SHA256" >"$tmp/venv/requirements.sha256"
  rm -rf "$target"
  mv "$tmp/venv" "$target"
  if [[ -e $venv && ! -L $venv ]]; then rm -rf "$venv"; fi
  ln -sfn "envs/$REQUIREMENTS_SHA256" "$home_dir/.venv.new"
  mv -Tf "$home_dir/.venv.new" "$venv"
  rm -rf "$tmp"
  for old in "$envs"/*; do
    if [[ $old != "$target" ]]; then rm -rf "$old"; fi
  done
  log "environment ready: $venv -> envs/${REQUIREMENTS_SHA256:0:12}"
}

if [[ -n ${MULTISLICE_PYTHON:-} ]]; then
  py=$MULTISLICE_PYTHON
  command -v "$py" >/dev/null 2>&1 || die "MULTISLICE_PYTHON=$py is not an executable"
  log "using MULTISLICE_PYTHON=$py; not building an environment"
else
  build_environment
  py="$home_dir/venv/bin/python"
fi

# --- trainer bundle (content-addressed) and config -----------------------------------------
app="$home_dir/app/$BUNDLE_SHA256"
if [[ -f $app/.complete ]]; then
  log "trainer bundle ${BUNDLE_SHA256:0:12} already unpacked"
else
  mkdir -p "$home_dir/app"
  tmp=$(mktemp -d "$home_dir/app/.unpack.XXXXXX")
  base64 -d >"$tmp/bundle.tar.gz" <<'MULTISLICE_BUNDLE'
@@BUNDLE_BASE64@@MULTISLICE_BUNDLE
  read -r actual _ < <(sha256sum "$tmp/bundle.tar.gz")
  [[ $actual == "$BUNDLE_SHA256" ]] || die "trainer bundle is corrupt: sha256 $actual, expected $BUNDLE_SHA256"
  mkdir "$tmp/app"
  tar -xzf "$tmp/bundle.tar.gz" -C "$tmp/app"
  touch "$tmp/app/.complete"
  rm -rf "$app"
  mv "$tmp/app" "$app"
  rm -rf "$tmp"
  log "trainer bundle ${BUNDLE_SHA256:0:12} unpacked into $app"
fi
cat >"$app/config.json.new" <<'MULTISLICE_CONFIG'
@@CONFIG_JSON@@MULTISLICE_CONFIG
if cmp -s "$app/config.json.new" "$app/config.json"; then
  rm -f "$app/config.json.new"
else
  mv -f "$app/config.json.new" "$app/config.json"
fi
exec 9>&- # setup done: release the lock (the trainer must not inherit it)

# --- supervise the trainer -------------------------------------------------------------------
cd "$app"
child=''
stop_signal=''
on_signal() {
  stop_signal=$1
  if [[ -n $child ]]; then
    log "received SIG$1: sending SIGTERM to the trainer (pid $child); it will not be restarted"
    kill -TERM "$child" 2>/dev/null || true
  else
    log "received SIG$1 while no trainer is running"
  fi
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

restarts=0
delay=$(min_delay "$backoff" "$backoff_max")
while true; do
  log "starting trainer (attempt $((restarts + 1))/$((MAX_RESTARTS + 1))): $py -m training run --config $app/config.json --run-dir $run_dir"
  PYTHONPATH="$app" PYTHONUNBUFFERED="${PYTHONUNBUFFERED:-1}" \
    "$py" -m training run --config "$app/config.json" --run-dir "$run_dir" &
  child=$!
  if [[ -n $stop_signal ]]; then kill -TERM "$child" 2>/dev/null || true; fi
  status=0
  wait "$child" || status=$?
  if [[ -n $stop_signal ]]; then
    # The trap interrupted wait (or the trainer ended meanwhile): collect its real status.
    while kill -0 "$child" 2>/dev/null; do wait "$child" || true; done
    status=0
    wait "$child" || status=$?
    log "trainer exited with status $status after SIG$stop_signal; exiting without restart"
    exit "$status"
  fi
  child=''
  if ((status == 0)); then
    log "trainer completed"
    exit 0
  fi
  if ((status == CONFIG_ERROR_STATUS)); then
    log "error: the trainer's configuration cannot work here (status $status); not restarting"
    exit "$status"
  fi
  if ((restarts >= MAX_RESTARTS)); then
    log "error: trainer exited with status $status; giving up after $MAX_RESTARTS restarts"
    exit 1
  fi
  restarts=$((restarts + 1))
  log "trainer exited with status $status; restart $restarts/$MAX_RESTARTS in ${delay}s"
  sleep "$delay" &
  sleep_pid=$!
  wait "$sleep_pid" || true
  if [[ -n $stop_signal ]]; then
    kill "$sleep_pid" 2>/dev/null || true
    log "stopping during the restart delay (SIG$stop_signal)"
    if [[ $stop_signal == INT ]]; then exit 130; fi
    exit 143
  fi
  delay=$(min_delay "$(awk -v d="$delay" 'BEGIN { print d * 2 }')" "$backoff_max")
done
"""


_PLACEHOLDER = re.compile(r"@@([A-Z0-9_]+)@@")


def _quote(value: str) -> str:
    return shlex.quote(value)


def _heredoc_body(text: str, delimiter: str) -> str:
    """``text`` as a heredoc body ending in a newline; refuses text that holds the delimiter."""
    if any(line == delimiter for line in text.splitlines()):
        raise ValueError(f"payload contains the heredoc delimiter line {delimiter!r}")
    return text if text.endswith("\n") else text + "\n"


def default_project_root() -> Path:
    """The checkout this module lives in (training/, uv.lock, pyproject.toml, .python-version)."""
    return lockfile.default_project_root()


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
      infra.lockfile.LockfileError: the lock cannot give the VM's pinned requirements.
      FileNotFoundError: no ``training/*.py`` under ``project_root``.
    """
    root = Path(project_root) if project_root is not None else default_project_root()
    bundle = build_bundle(root / BUNDLE_PACKAGE)
    bundle_sha256 = hashlib.sha256(bundle).hexdigest()
    requirements = lockfile.pinned_requirements(root)
    uv = lockfile.pinned_uv(root, target=requirements.target)
    values = {
        "STACK": config.stack,
        "ACCELERATOR": config.accelerator_type,
        "SLICES": str(config.slices),
        "BUNDLE_SHA256": bundle_sha256,
        "REQUIREMENTS_SHA256": requirements.sha256,
        "PYTHON_VERSION": _quote(requirements.target.python_version),
        "UV_VERSION": uv.version,
        "MAX_RESTARTS": str(MAX_RESTARTS),
        "CONFIG_ERROR_STATUS": str(CONFIG_ERROR_STATUS),
        "BACKOFF": str(RESTART_BACKOFF_S),
        "BACKOFF_MAX": str(RESTART_BACKOFF_MAX_S),
        "DEFAULT_HOME": DEFAULT_HOME,
        "DEFAULT_METADATA_HOST": DEFAULT_METADATA_HOST,
        "RUN_DIR_ATTRIBUTE": RUN_DIR_ATTRIBUTE,
        "REQUIREMENTS": _heredoc_body(requirements.text, "MULTISLICE_REQUIREMENTS"),
        "UV_REQUIREMENT": _heredoc_body(uv.requirement_text, "MULTISLICE_UV"),
        "BUNDLE_BASE64": base64.encodebytes(bundle).decode("ascii"),
        "CONFIG_JSON": _heredoc_body(config.training.model_dump_json(), "MULTISLICE_CONFIG"),
    }
    # One pass: a payload that happens to contain "@@NAME@@" is never substituted again.
    text = _PLACEHOLDER.sub(lambda m: values[m.group(1)], _TEMPLATE)
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
        requirements_sha256=requirements.sha256,
        size_bytes=len(data),
    )


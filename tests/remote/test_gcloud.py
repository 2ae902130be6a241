"""infra.remote.gcloud's key pair: made under a lock file beside the key, so that a process that
finds another one's pair half written waits for it instead of calling the pair broken; a pair
that is broken with no one making it is still refused."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.remote import gcloud
from infra.remote.selection import RemoteError
from tests.helpers.repo import ROOT

PRIVATE = "-----BEGIN OPENSSH PRIVATE KEY-----\nstand-in\n-----END OPENSSH PRIVATE KEY-----\n"
PUBLIC = "ssh-rsa AAAAstandin stand-in@workstation\n"

#: A stand-in ``ssh-keygen`` (``-f <key>`` last): records its call, writes the private key, says
#: so in ``$KEYGEN_WROTE_PRIVATE``, then waits for the test's ``flock`` of ``$KEYGEN_GATE``
#: before it writes the public key (as OpenSSH's writes one file, then the other).
KEYGEN = f"""#!{sys.executable}
import fcntl, os, sys
key = sys.argv[-1]
with open(os.environ["KEYGEN_CALLS"], "a") as calls:
    calls.write(" ".join(sys.argv[1:]) + "\\n")
with open(key, "w") as f:
    f.write({PRIVATE!r})
open(os.environ["KEYGEN_WROTE_PRIVATE"], "w").close()
with open(os.environ["KEYGEN_GATE"]) as gate:
    fcntl.flock(gate, fcntl.LOCK_EX)
with open(key + ".pub", "w") as f:
    f.write({PUBLIC!r})
"""

#: One ``multislice exec``'s key step, in a process of its own; with ``tell`` it prints
#: ``waiting`` when it first finds the key's lock held by another process.
ENSURE = """
import sys
from infra.remote import gcloud
from infra.remote.selection import RemoteError
if sys.argv[2] == "tell":
    told, wait = [], gcloud._wait_for_holder
    def tell(lock):
        if not told:
            told.append(lock)
            print("waiting", flush=True)
        wait(lock)
    gcloud._wait_for_holder = tell
try:
    print(gcloud.ensure_ssh_key(sys.argv[1]), flush=True)
except RemoteError as err:
    print(f"error: {err}", flush=True)
    sys.exit(err.exit_code)
"""


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def hold(lock: Path) -> int:
    """A descriptor of ``lock`` of this test's own, holding its exclusive ``flock`` (another
    descriptor of the same file, even in this process, cannot take it)."""
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def half_pair() -> tuple[Path, Path]:
    """The private key written, its ``.pub`` not yet: what another process's ``ssh-keygen``
    leaves between its two files."""
    private, public = gcloud.key_paths()
    private.parent.mkdir(mode=0o700)
    private.write_text(PRIVATE)
    return private, public


def test_a_pair_another_process_is_making_is_waited_for_not_called_broken(home, monkeypatch):
    private, public = half_pair()
    lock = hold(gcloud.key_lock_path(private))
    waits = []

    def other_process_finishes(lock_path: Path) -> None:
        # Called while this process waits for the lock: nothing was reported yet. The other
        # process writes the .pub and releases the lock.
        waits.append(lock_path)
        public.write_text(PUBLIC)
        os.close(lock)

    monkeypatch.setattr(gcloud, "_wait_for_holder", other_process_finishes)
    # No ssh-keygen may run: the pair is the other process's.
    assert gcloud.ensure_ssh_key(str(home / "no-ssh-keygen")) is None
    assert waits == [private.with_name("google_compute_engine.lock")]
    assert private.read_text() == PRIVATE and public.read_text() == PUBLIC


def test_a_pair_left_half_made_once_the_lock_is_free_is_broken(home, monkeypatch):
    # The other process held the lock and ended without the .pub (its ssh-keygen was killed):
    # once the lock is free, the pair is broken.
    private, public = half_pair()
    lock = hold(gcloud.key_lock_path(private))
    waits = []

    def other_process_ends(lock_path: Path) -> None:
        waits.append(lock_path)
        os.close(lock)

    monkeypatch.setattr(gcloud, "_wait_for_holder", other_process_ends)
    with pytest.raises(RemoteError) as raised:
        gcloud.ensure_ssh_key(str(home / "no-ssh-keygen"))
    assert str(raised.value).startswith(
        f"gcloud's SSH key files are broken ({private} exists, {public} is missing); gcloud --quiet will not replace"
    )
    assert raised.value.exit_code == 2 and len(waits) == 1
    assert private.read_text() == PRIVATE and not public.exists()


@pytest.mark.parametrize(
    ("private_text", "public_text", "described"),
    [
        (PRIVATE, None, "{private} exists, {public} is missing"),
        (None, PUBLIC, "{private} is missing, {public} exists"),
        ("", PUBLIC, "{private} is empty or unreadable, {public} exists"),
    ],
)
def test_a_broken_pair_no_one_is_making_is_refused_at_once(home, monkeypatch, private_text, public_text, described):
    private, public = gcloud.key_paths()
    private.parent.mkdir(mode=0o700)
    for path, text in ((private, private_text), (public, public_text)):
        if text is not None:
            path.write_text(text)
    monkeypatch.setattr(gcloud, "_wait_for_holder", lambda lock: pytest.fail(f"waited for {lock}, held by no one"))
    with pytest.raises(RemoteError) as raised:
        gcloud.ensure_ssh_key(str(home / "no-ssh-keygen"))
    message = described.format(private=private, public=public)
    assert str(raised.value) == (
        f"gcloud's SSH key files are broken ({message}); gcloud --quiet will not replace them: restore the "
        "missing one, or remove both so that a new pair is made, then exec"
    )
    assert raised.value.exit_code == 2


def test_a_fifo_in_place_of_a_key_is_broken_not_waited_on(home, monkeypatch):
    private, public = gcloud.key_paths()
    private.parent.mkdir(mode=0o700)
    os.mkfifo(private)  # opening it for reading would wait for a writer: refused on its descriptor
    public.write_text(PUBLIC.strip() + "x" * (1 << 20))  # one long line: only its first KEY_LINE_BYTES are read
    monkeypatch.setattr(gcloud, "_wait_for_holder", lambda lock: pytest.fail(f"waited for {lock}, held by no one"))
    with pytest.raises(RemoteError) as raised:
        gcloud.ensure_ssh_key(str(home / "no-ssh-keygen"))
    assert str(raised.value).startswith(
        f"gcloud's SSH key files are broken ({private} is empty or unreadable, {public} exists); "
    )


def test_the_wait_for_the_lock_is_bounded_and_names_the_lock_file(home, monkeypatch):
    assert gcloud.KEY_LOCK_TIMEOUT_S > gcloud.KEYGEN_TIMEOUT_S  # outlasts the holder's ssh-keygen
    private, public = half_pair()
    lock_path = gcloud.key_lock_path(private)
    lock = hold(lock_path)
    monkeypatch.setattr(gcloud, "KEY_LOCK_TIMEOUT_S", 0.0)
    try:
        with pytest.raises(RemoteError) as raised:
            gcloud.ensure_ssh_key(str(home / "no-ssh-keygen"))
    finally:
        os.close(lock)
    assert str(raised.value) == (
        f"another process (a multislice exec making gcloud's SSH key) held {lock_path} for 0 s; nothing was run: "
        "let it end, then exec"
    )
    assert raised.value.exit_code == 1 and not public.exists()


def test_two_processes_at_once_on_a_fresh_workstation_make_the_pair_once(home, tmp_path):
    keygen = tmp_path / "ssh-keygen"
    keygen.write_text(KEYGEN)
    keygen.chmod(0o755)
    gate_path, wrote_private = tmp_path / "gate", tmp_path / "wrote-private"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "KEYGEN_CALLS": str(tmp_path / "keygen-calls"),
        "KEYGEN_WROTE_PRIVATE": str(wrote_private),
        "KEYGEN_GATE": str(gate_path),
    }
    private, public = gcloud.key_paths()

    def start(mode: str) -> subprocess.Popen[str]:
        argv = [sys.executable, "-c", ENSURE, str(keygen), mode]
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    gate = hold(gate_path)  # the first process's ssh-keygen stops between its two files
    first = second = None
    try:
        first = start("quiet")
        deadline = time.monotonic() + 30
        while not wrote_private.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)  # polls for the file; the outcome does not depend on the interval
        assert wrote_private.exists(), first.communicate(timeout=30)[0]
        assert private.exists() and not public.exists()
        # The second process finds half a pair, and the lock held: it waits (it says so first).
        second = start("tell")
        assert second.stdout is not None
        assert second.stdout.readline() == "waiting\n", second.communicate(timeout=30)[0]
        os.close(gate)
        gate = None
        first_out, _ = first.communicate(timeout=30)
        second_out, _ = second.communicate(timeout=30)
        ended = [(first.returncode, first_out), (second.returncode, second_out)]
    finally:
        if gate is not None:
            os.close(gate)
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    # The first made the pair; the second, once the first was done, found it whole.
    assert ended == [(0, f"{private}\n"), (0, "None\n")]
    assert (tmp_path / "keygen-calls").read_text() == f"-N  -t rsa -f {private}\n"
    assert private.read_text() == PRIVATE and public.read_text() == PUBLIC

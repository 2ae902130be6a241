"""Direct references in a workload's requirements (``name @ URL``): which URLs the VMs can install
hash-checked, and what to write instead of one they cannot (the rule and its reasons:
:mod:`infra.config.workload`'s docstring, and docs/workloads.md under "Requirements pinned by URL").

Every pattern here meets user text and runs in time linear in it (tests/config/test_hostile_input.py
tries each on long runs of every kind of character).
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from infra.config.vm_python import compile_command
from training.redaction import redacted

#: The VCS schemes of PEP 440 direct references (``name @ git+https://…``): a checkout, never hash-checked.
VCS_PREFIXES = ("git+", "hg+", "svn+", "bzr+")
#: GitHub's archive URLs: ``github.com/OWNER/REPO/archive/<ref>.zip|.tar.gz`` and codeload's
#: ``codeload.github.com/OWNER/REPO/<format>/<ref>``, where the ref is a commit, tag or branch.
_GITHUB_ARCHIVES = {
    "github.com": ("archive",),
    "www.github.com": ("archive",),
    "codeload.github.com": ("zip", "tar.gz"),
}
#: ``git+https://github.com/OWNER/REPO(.git)@REF``: the archive URL of REF can be named.
_GITHUB_GIT = re.compile(r"^git\+https://github\.com/([^/@#]+)/([^/@#]+?)(?:\.git)?/?(?:@([^#]+))?(?:#.*)?$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
#: What an abbreviated commit looks like (GitHub also serves ``…/archive/<7+ hex>.zip``).
_SHORT_COMMIT = re.compile(r"^[0-9a-f]{7,39}$")
#: The largest port number a URL may name (a TCP port: RFC 6335, section 6; 0 is reserved).
MAX_PORT = 65535


def hash_how(url: str = "URL") -> str:
    """How to get the sha256 of ``url``'s archive: by hand, or with the whole file compiled for the VMs."""
    return f"its sha256 is `curl -fsSL {url} | sha256sum`, or write the file for the VMs with `{compile_command()}`"


def local_path_problem(shown: str) -> str:
    """Why the requirement ``shown``, a local path, cannot be installed, and what to write instead."""
    return (
        f"{shown!r} is a local path: the VMs do not have your files. Put the code in `source` (the command runs "
        "in that directory, so it imports from there), or install an https archive of it with its "
        f"--hash=sha256:… ({hash_how()})"
    )


def url_problem(name: str | None, url: str, hashes: list[str]) -> str | None:
    """Why a direct reference cannot be installed hash-checked on the VM, or None (the rule:
    :mod:`infra.config.workload`'s docstring). The URL is shown without its user information or a
    token (:func:`training.redaction.redacted`)."""
    shown = redacted(f"{name} @ {url}" if name else url)
    shown = shown if len(shown) <= 120 else shown[:117] + "..."
    lower = url.lower()
    if lower.startswith(VCS_PREFIXES):
        github = _GITHUB_GIT.fullmatch(url)
        ref = github[3] if github else None
        archive = (
            f"https://github.com/{github[1]}/{github[2]}/archive/"
            f"{ref if ref and _COMMIT.fullmatch(ref) else '<40-hex commit>'}.zip"
            if github
            else "the https archive of one commit (GitHub: https://github.com/OWNER/REPO/archive/<40-hex commit>.zip)"
        )
        return (
            f"{shown!r} is a {lower.split('+', 1)[0]} checkout, which cannot be hash-checked (uv pip install "
            f"--require-hashes on the VM refuses it); install {archive} instead, as "
            f"`{name or 'NAME'} @ <that URL> --hash=sha256:<its sha256>` ({hash_how()})"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file" or len(scheme) <= 1:  # a path (one letter: a Windows drive)
        return local_path_problem(shown)
    if scheme == "http":
        return f"{shown!r} is plain http; write its https URL (with its --hash=sha256:…)"
    if scheme != "https":
        return f"{shown!r}: only https URLs are installed (with their --hash=sha256:…)"
    if not parts.netloc:
        return f"{shown!r} is not an https URL with a host"
    if not _valid_port(parts):
        safe = f"{name} @ {redacted(url)}" if name else redacted(url)
        safe = safe if len(safe) <= 120 else safe[:117] + "..."
        return f"{safe!r}: its port is not a TCP port (1 to {MAX_PORT}: RFC 6335, section 6)"
    if not name:
        return f"{shown!r} has no name; write `NAME @ {redacted(url)}` with its --hash=sha256:…"
    ref = _github_ref(parts)
    if "/archive/refs/heads/" in lower or (ref or "").startswith("refs/heads/"):
        return (
            f"{shown!r} is the archive of a branch, which changes with every push (its hash then stops "
            "matching and the VMs cannot install it): use the archive of a commit, …/archive/<40-hex commit>.zip"
        )
    if ref is not None and _SHORT_COMMIT.fullmatch(ref.lower()):
        return (
            f"{shown!r} names {ref!r}, an abbreviated commit or a branch of that name, which GitHub resolves when "
            "the archive is downloaded: write the full commit, …/archive/<40-hex commit>.zip"
        )
    if ref is not None and not _COMMIT.fullmatch(ref.lower()) and not ref.startswith("refs/tags/"):
        return (
            f"{shown!r} names {ref[:60]!r}, a branch or a tag, which GitHub resolves when the archive is downloaded, "
            "and a branch changes with every push (its hash then stops matching and the VMs cannot install it): use "
            "the archive of a commit, …/archive/<40-hex commit>.zip, or write a tag as "
            f"…/archive/refs/tags/{ref[:60]}.zip"
        )
    if not hashes:
        return (
            f"{shown!r} has no --hash=sha256:… option; a URL requirement needs the sha256 of the archive, as every "
            f"requirement does (uv pip install --require-hashes on the VM): {hash_how(redacted(url))}"
        )
    return None


def _valid_port(parts: SplitResult) -> bool:
    """Whether the URL names no port, or a TCP port 1 to :data:`MAX_PORT` (``urlsplit`` reads any run of
    digits, and ``SplitResult.port`` refuses only past 65535)."""
    try:
        port = parts.port
    except ValueError:  # "Port out of range 0-65535", or not a number
        return False
    return port is None or port >= 1


def _github_ref(parts: SplitResult) -> str | None:
    """The commit, tag or branch a GitHub archive URL names (:data:`_GITHUB_ARCHIVES`), or None."""
    kinds = _GITHUB_ARCHIVES.get((parts.hostname or "").lower(), ())
    segments = parts.path.split("/")  # "", OWNER, REPO, kind, ref…
    if len(segments) < 5 or segments[3] not in kinds or not all(segments[1:5]):
        return None
    ref = "/".join(segments[4:])
    if segments[3] == "archive":
        suffix = next((s for s in (".zip", ".tar.gz") if ref.endswith(s)), None)
        return ref.removesuffix(suffix) if suffix else None
    return ref

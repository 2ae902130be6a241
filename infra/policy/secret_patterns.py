"""Credential patterns a startup script must not carry.

Node metadata is readable by every process on the VM (``curl metadata.google.internal``) and
by anyone with ``tpu.nodes.get`` on the project, so a credential in the startup script is a
leaked credential. The VMs authenticate as their service account through the metadata server
and need none. The patterns are the documented shapes of each credential:

* PEM private keys (RFC 7468 §10 ``-----BEGIN PRIVATE KEY-----`` and the RSA/EC/DSA/OpenSSH
  variants) and the ``"private_key"`` field of a Google service-account key file
  (https://cloud.google.com/iam/docs/keys-create-delete);
* Google OAuth 2.0 access tokens, which start ``ya29.``
  (https://developers.google.com/identity/protocols/oauth2), and Google API keys, ``AIza``
  followed by 35 characters (https://cloud.google.com/docs/authentication/api-keys);
* AWS access key ids, ``AKIA``/``ASIA`` + 16 upper-case letters or digits
  (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_identifiers.html);
* GitHub tokens, ``ghp_``/``gho_``/``ghu_``/``ghs_``/``ghr_`` + 36 characters
  (https://github.blog/engineering/platform-security/behind-githubs-new-authentication-token-formats/),
  and fine-grained personal access tokens, ``github_pat_`` + 22 or more word characters
  (GitHub's "Managing your personal access tokens");
* Hugging Face user access tokens, ``hf_`` + 30 or more letters and digits (Hugging Face's "User
  access tokens": "start with hf_");
* Slack tokens, ``xoxb-``/``xoxp-``/``xoxa-``/``xoxr-``/``xoxs-``/``xapp-`` (Slack's "Token types"), and
  Slack incoming-webhook URLs, ``https://hooks.slack.com/services/`` + the workspace, channel and secret
  (Slack's "Sending messages using incoming webhooks": "Keep it secret, keep it safe");
* a quoted literal assigned to a name that says password, secret, token or API key
  (``PASSWORD="hunter22"``, ``api_key: 'abc…'``, ``"AWS_SECRET_ACCESS_KEY": "…"`` as JSON writes a
  workload's ``env``), at least 8 characters, the way secret scanners flag hard-coded passwords;
  ``token`` and ``api_key`` count as whole words of the name only (``HF_TOKEN``, not
  ``TOKENIZER_FILE`` or ``num_tokens``).
  A value taken from a variable or a command (``TOKEN="$(curl …)"``) is not a literal and is not
  flagged;
* a password in a URL's user-info part, ``scheme://user:password@host`` (RFC 3986 §3.2.1 calls
  that form deprecated: a requirement fetched from a private index this way carries it).

The startup-script policy scans the script's text and everything its release carries (the
embedded tar, and a command's source when it travels through the bucket:
:mod:`infra.policy.release_contents`), with these same patterns. Each pattern runs in time
linear in the text (no nested or adjacent unbounded repetitions of overlapping characters).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["PATTERNS", "SecretMatch", "find_secrets", "find_secrets_in_files"]

#: (what it is, pattern); each is searched over the whole text.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a PEM private key", re.compile(r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED )?PRIVATE KEY-----")),
    ("a service-account key file's private_key", re.compile(r"\"private_key\"\s*:\s*\"")),
    ("a Google OAuth access token", re.compile(r"\bya29\.[0-9A-Za-z_-]{20,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("an AWS access key id", re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b")),
    ("a GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36}\b|\bgithub_pat_[A-Za-z0-9_]{22,255}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,64}\b")),
    ("a Slack token", re.compile(r"\bxox[baprs]-[A-Za-z0-9-]{10,255}|\bxapp-[A-Za-z0-9-]{10,255}")),
    ("a Slack webhook URL", re.compile(r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]{1,64}/B[A-Za-z0-9_]{1,64}/")),
    (
        "a hard-coded password or token",
        re.compile(
            r"(?i)\b(?:[a-z0-9_]{0,40}(?:password|passwd|secret)|(?:[a-z0-9]{1,40}_){0,6}(?:token|api[_-]?key))"
            r"(?:_[a-z0-9]{1,40}){0,6}[\"']?[ \t]*[:=][ \t]*([\"'])[^\"'\s$`]{8,}\1"
        ),
    ),
    ("a password in a URL", re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,20}://[^/\s:@\"']{1,256}:[^/\s@\"']{1,256}@")),
)


@dataclass(frozen=True)
class SecretMatch:
    """One finding: what it looks like and its 1-based line number (the value is not kept)."""

    kind: str
    line: int


def find_secrets_in_files(files: Mapping[str, bytes]) -> list[tuple[str, SecretMatch]]:
    """Every credential-shaped string in each file (read as Latin-1: every byte is a character),
    as ``(path, match)`` in path order."""
    return [(path, match) for path in sorted(files) for match in find_secrets(files[path].decode("latin-1"))]


def find_secrets(text: str) -> list[SecretMatch]:
    """Every credential-shaped string in ``text``, in order of position.

    Args:
      text: a script or any other text.

    Returns:
      One :class:`SecretMatch` per match; empty when none.
    """
    found: list[tuple[int, SecretMatch]] = []
    for kind, pattern in PATTERNS:
        for match in pattern.finditer(text):
            found.append((match.start(), SecretMatch(kind, text.count("\n", 0, match.start()) + 1)))
    return [m for _, m in sorted(found, key=lambda item: item[0])]

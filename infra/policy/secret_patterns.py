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
* Slack tokens, ``xoxb-``/``xoxp-``/``xoxa-``/``xoxe-``/``xoxo-``/``xoxr-``/``xoxs-``/``xapp-`` (Slack's "Token
  types"; ``xoxe-``/``xoxe.xoxp-``: the refresh and configuration tokens of token rotation; ``xoxo-``/``xoxs-``:
  the legacy tokens of the ``slack-legacy-token`` rule of gitleaks and Checkmarx 2ms, ``xox[os]-``), and
  Slack incoming-webhook URLs, ``https://hooks.slack.com/services/`` + the workspace, channel and secret
  (Slack's "Sending messages using incoming webhooks": "Keep it secret, keep it safe");
* a quoted literal assigned to a name that says password, secret, token or API key
  (``PASSWORD="hunter22"``, ``api_key: 'abc…'``, ``"AWS_SECRET_ACCESS_KEY": "…"`` as JSON writes a
  workload's ``env``), at least 8 characters, the way secret scanners flag hard-coded passwords;
  ``token`` and ``api_key`` count as whole words of the name only (``HF_TOKEN``, not
  ``TOKENIZER_FILE`` or ``num_tokens``).
  A value taken from a variable or a command (``TOKEN="$(curl …)"``) is not a literal, and a path,
  a Secret Manager name or a URL without user information names where the secret is: none is
  flagged (a ``$`` inside a literal is, ``"pa$$word"``);
* a password in a URL's user-info part, ``scheme://user:password@host``, whatever the scheme
  (``git+https``, ``postgres``, ``s3``…; RFC 3986 §3.2.1 calls that form deprecated: a requirement
  fetched from a private index this way carries it);
* an AWS secret access key, 40 characters of base64's alphabet in mixed case, within 200 characters
  of an access key id (the pair the AWS CLI's ``aws_access_key_id``/``aws_secret_access_key`` hold:
  https://docs.aws.amazon.com/IAM/latest/UserGuide/id_credentials_access-keys.html);
* a private key's body in base64 without its PEM lines (``MIIEvQIBADAN…``): at least 64 characters
  (one PEM line, RFC 7468 §2; an Ed25519 PKCS#8 key is exactly 64) that decode to a DER SEQUENCE
  (``0x30``, its length in the short form or the long form ``0x81 n``/``0x82 n n``: X.690 §8.1.3)
  whose first element is the version INTEGER 0, 1 or 2 (``02 01 0v``), as every private-key structure
  begins: PKCS#1 ``RSAPrivateKey`` (RFC 8017 A.1.2, version 0), PKCS#8 ``PrivateKeyInfo`` and
  ``OneAsymmetricKey`` (RFC 5208 §5, RFC 5958 §2: version 0 or 1) and SEC 1 ``ECPrivateKey``
  (RFC 5915 §3: version 1). In base64 that is ``MII??[AQgw]IBA``, ``MI[GH]?AgE[ABC]`` or
  ``M[A-H]?CAQ[AEI]``. A certificate (``MIIDXTCC…``) or a public key (``MIIBIjAN…``,
  ``MFkwEwYH…``), whose first element is a SEQUENCE, is not a secret and does not match.

Besides the shapes, a value is a credential by the **name it is stored under**
(:func:`value_kinds`, for the workload's ``env``, labels, container ``env`` and the stack file's
provider settings, where names and values are apart): a name with a word containing ``password``,
``passwd``, ``passphrase``, ``secret`` or ``credential``, or whose last word is ``token``, ``key``,
``apikey`` or ``pass`` (words split at ``_``, ``-``, ``.`` and camelCase: ``HF_TOKEN``,
``db-password``, ``accessToken``; not ``TOKENIZER``, ``num_tokens`` or ``token-budget``: in a
training stack a token is often text, and a key a field), unless its last word says
the value is about the secret rather than the secret (``KEY_FILE``, ``TOKEN_PATH``, ``SECRET_NAME``,
``AWS_ACCESS_KEY_ID``, ``KEY_SIZE``: :data:`ABOUT_A_SECRET`). Any non-empty value under such a name
is a finding, whatever its characters (``DB_PASSWORD: "pa$$ word'x"``), unless it is a reference to
where the secret is kept: ``$NAME``/``${NAME}``/``$(command)``, a path (``/…``, ``~/…``, ``./…``),
a Secret Manager name (``projects/P/secrets/S[/versions/V]``,
https://cloud.google.com/secret-manager/docs/reference/rest/v1/projects.secrets), a URL without
user information, or a switch (``0``, ``1``, ``true``, ``false``, ``yes``, ``no``, ``on``, ``off``:
one bit is no credential).

The startup-script policy scans the script's text and everything its release carries (the
embedded tar, and a command's source when it travels through the bucket:
:mod:`infra.policy.release_contents`), with these same patterns. Each pattern runs in time
linear in the text (no nested or adjacent unbounded repetitions of overlapping characters).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ABOUT_A_SECRET",
    "NAMED_SECRET",
    "PATTERNS",
    "SecretMatch",
    "find_secrets",
    "find_secrets_in_files",
    "is_reference",
    "names_a_secret",
    "value_kinds",
]

#: 40 characters of the AWS secret access key's alphabet, in mixed case, as one run.
_AWS_SECRET = (
    r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])(?=[A-Za-z0-9/+]{0,39}[0-9/+])"
    r"[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
)
_AWS_KEY_ID = r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"

#: (what it is, pattern); each is searched over the whole text.
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("a PEM private key", re.compile(r"-----BEGIN (?:RSA |EC |DSA |OPENSSH |ENCRYPTED )?PRIVATE KEY-----")),
    (
        "a private key's base64 body",
        re.compile(
            r"(?<![A-Za-z0-9+/])(?=[A-Za-z0-9+/]{64})"
            r"(?:MII[A-Za-z0-9+/]{2}[AQgw]IBA|MI[GH][A-Za-z0-9+/]AgE[ABC]|M[A-H][A-Za-z0-9+/]CAQ[AEI])"
        ),
    ),
    ("a service-account key file's private_key", re.compile(r"\"private_key\"\s*:\s*\"")),
    ("a Google OAuth access token", re.compile(r"\bya29\.[0-9A-Za-z_-]{20,}")),
    ("a Google API key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}\b")),
    ("an AWS access key id", re.compile(_AWS_KEY_ID)),
    (
        "an AWS secret access key",
        re.compile(rf"{_AWS_KEY_ID}[\s\S]{{0,200}}?{_AWS_SECRET}|{_AWS_SECRET}[\s\S]{{0,200}}?{_AWS_KEY_ID}"),
    ),
    ("a GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36}\b|\bgithub_pat_[A-Za-z0-9_]{22,255}")),
    ("a Hugging Face token", re.compile(r"\bhf_[A-Za-z0-9]{30,64}\b")),
    ("a Slack token", re.compile(r"\bxox[abeoprs]-[A-Za-z0-9-]{10,255}|\bxapp-[A-Za-z0-9-]{10,255}")),
    ("a Slack webhook URL", re.compile(r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]{1,64}/B[A-Za-z0-9_]{1,64}/")),
    (
        "a hard-coded password or token",
        re.compile(
            r"(?i)\b(?:[a-z0-9_]{0,40}(?:password|passwd|secret)|(?:[a-z0-9]{1,40}_){0,6}(?:token|api[_-]?key))"
            r"(?:_[a-z0-9]{1,40}){0,6}[\"']?[ \t]*[:=][ \t]*([\"'])(?![$`/~]|\.\.?/|projects/|[a-z][a-z0-9+.-]{0,30}://)"
            r"[^\"'\s`]{8,}\1"
        ),
    ),
    ("a password in a URL", re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,20}://[^/\s:@\"']{1,256}:[^/\s@\"']{1,256}@")),
)

#: The kind of a value that is a credential by the name it is stored under (module docstring).
NAMED_SECRET = "a value under a name that says it is a secret"
#: Parts of a word of a name that say its value is a secret...
_SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "credential")
#: ...and last words that do (``HF_TOKEN``, ``API_KEY``; not ``TOKEN_BUDGET``, ``KEY_FIELD``).
_SECRET_WORDS = frozenset({"token", "key", "apikey", "pass"})
#: A name's last word that says its value is about a secret, not the secret itself.
ABOUT_A_SECRET = frozenset(
    "algorithm arn bits count dir endpoint env file format header host id kind length len limit location mode name "
    "path port prefix project ref region scope scopes size timeout ttl type uri url var version".split()
)
#: The words of a name: ``HF_TOKEN`` → HF, TOKEN; ``accessToken`` → access, Token; ``db-password``.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")
#: Values that say where a secret is kept, or are one bit (module docstring).
_SWITCHES = frozenset({"0", "1", "true", "false", "yes", "no", "on", "off"})
_SECRET_MANAGER = re.compile(r"projects/[^/\s]{1,256}/secrets/[^/\s]{1,256}(?:/versions/[^/\s]{1,256})?")
_SHELL_REFERENCE = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]{0,255}|\{[^{}\s]{1,256}\}|\([^\n]{1,1024}\))")
_PLAIN_URL = re.compile(r"(?i)[a-z][a-z0-9+.-]{0,30}://[^\s@]*")


def names_a_secret(name: str) -> bool:
    """Whether ``name`` says its value is a secret (the module docstring's rule)."""
    words = [word.lower() for word in _WORD.findall(name)]
    if not words or words[-1] in ABOUT_A_SECRET:
        return False
    return words[-1] in _SECRET_WORDS or any(part in word for word in words for part in _SECRET_PARTS)


def is_reference(value: str) -> bool:
    """Whether ``value`` is empty, one bit, or says where a secret is kept rather than holding it."""
    text = value.strip()
    return (
        not text
        or text.lower() in _SWITCHES
        or text.startswith(("/", "~/", "./", "../"))
        or _SHELL_REFERENCE.fullmatch(text) is not None
        or _SECRET_MANAGER.fullmatch(text) is not None
        or _PLAIN_URL.fullmatch(text) is not None
    )


def value_kinds(name: str, value: object) -> list[str]:
    """What credential ``value`` stored under ``name`` is (an env variable, a label, a setting): the
    shapes found in ``{"name": "value"}`` as JSON writes it, else :data:`NAMED_SECRET` when the name
    says secret and the value is not a reference (:func:`is_reference`); empty when neither.

    The value is never returned or kept.
    """
    text = "" if value is None else value if isinstance(value, str) else json.dumps(value)
    kinds = list(dict.fromkeys(match.kind for match in find_secrets(json.dumps({name: text}))))
    if not kinds and names_a_secret(name) and not is_reference(text):
        kinds.append(NAMED_SECRET)
    return kinds


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

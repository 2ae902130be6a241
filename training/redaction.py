"""A value shown in a message without the secret it may carry: :func:`redacted`, the one function
every message that quotes a user's value (a URI, an image reference, an option, a config value) uses.

What is hidden, anywhere in the text:

* the user information of a URI, ``scheme://user:password@host`` → ``scheme://user:***@host`` (a lone
  ``token@host`` → ``***@host``; RFC 3986 section 3.2.1: "Use of the format "user:password" in the
  userinfo field is deprecated", and applications should not render it in clear text), whatever the
  scheme (``git+https``, ``postgres``, ``s3``…) and wherever the URI stands in the text;
* ``user:password@`` without a scheme (a path that swallowed a URI's ``//``, a registry reference),
  and a lone ``token@`` before the first ``/`` of a value (``ghp_…@ghcr.io/org/image``: a registry's
  host is the reference's first component, so an ``@`` before it is credentials, while an image
  digest's ``@`` comes after the path, and ``name:tag@sha256:…`` is a digest, not a password);
* the common token shapes, kept to their first four characters: GitHub (``ghp_``, ``gho_``, ``ghu_``,
  ``ghs_``, ``ghr_``, ``github_pat_``), Hugging Face (``hf_``), Slack (``xoxb-``, ``xoxp-``, ``xoxa-``,
  ``xoxe-``, ``xoxo-``, ``xoxr-``, ``xoxs-``, ``xapp-``), Google OAuth access tokens (``ya29.``), AWS
  access key ids (``AKIA``/``ASIA`` + 16), Google API keys (``AIza`` + 35): the prefixes each vendor
  documents for its tokens; and, in a text that holds an AWS access key id, every 40-character run of
  the AWS secret access key's alphabet (mixed case);
* the secret part of a Slack incoming-webhook URL (its last path segment);
* a PEM private key's body after its ``-----BEGIN … PRIVATE KEY-----`` line, and a private key's base64
  DER body without that line (a DER SEQUENCE whose first element is the version INTEGER 0, 1 or 2, as
  PKCS#1, PKCS#8 and SEC 1 keys begin: :mod:`infra.policy.secret_patterns` says why).

:mod:`infra.policy.secret_patterns` finds the same shapes in what a stack carries; a value that is a
secret only by the name it is stored under (``DB_PASSWORD: "pa$$ word"``) cannot be recognised here,
so a message never quotes such a value at all (it names the key and the value's type).
"""

from __future__ import annotations

import re

#: The token shapes of the module docstring.
TOKEN = re.compile(  # no word boundary before a prefix: ``xghp_…`` hides its token too
    r"(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}|"
    r"xox[abeoprs]-[A-Za-z0-9-]{10,}|xapp-[A-Za-z0-9-]{10,}|ya29\.[0-9A-Za-z_-]{20,}|"
    r"(?:AKIA|ASIA)[A-Z0-9]{16}|AIza[0-9A-Za-z_-]{35})"
)
#: ``scheme://userinfo@``: the scheme (group 1), the user (group 2) and ``:password`` (group 3).
URI_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]{0,30}://)([^\s/?#@:'\"]{0,256})(:[^\s@'\"]{0,256})?@")
#: ``user:password@`` without a scheme (not ``name:tag@sha256:…``, an image digest).
USER_PASSWORD = re.compile(
    r"(?<![A-Za-z0-9._%+~-])([A-Za-z0-9._%+~-]{1,128}):(?!//)[^\s@'\"]{1,256}@"
    r"(?![A-Za-z][A-Za-z0-9+._-]{0,30}:[0-9A-Fa-f]{32})"
)
#: A Slack incoming-webhook URL up to its secret (group 1), and the secret.
SLACK_WEBHOOK = re.compile(
    r"(https://hooks\.slack\.com/services/T[A-Za-z0-9_]{1,64}/B[A-Za-z0-9_]{1,64}/)[A-Za-z0-9_]{1,128}"
)
#: A PEM private key's header (group 1) and the body that follows it (base64, line breaks, JSON's ``\n``).
PEM_BODY = re.compile(r"(-----BEGIN [A-Z ]{0,30}PRIVATE KEY-----)[A-Za-z0-9+/=\s\\]{1,16384}")
#: A private key's DER body in base64, without a PEM header (:mod:`infra.policy.secret_patterns`).
DER_KEY_BODY = re.compile(
    r"(?<![A-Za-z0-9+/])(?=[A-Za-z0-9+/]{64})"
    r"(?:MII[A-Za-z0-9+/]{2}[AQgw]IBA|MI[GH][A-Za-z0-9+/]AgE[ABC]|M[A-H][A-Za-z0-9+/]CAQ[AEI])[A-Za-z0-9+/]*={0,2}"
)
#: An AWS access key id, and a run shaped like its secret access key (40 of base64's alphabet, mixed case).
AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")
AWS_SECRET_KEY = re.compile(
    r"(?<![A-Za-z0-9/+])(?=[A-Za-z0-9/+]{0,39}[A-Z])(?=[A-Za-z0-9/+]{0,39}[a-z])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])"
)


#: What a reference's first component cannot hold: in a message's text, the head is no reference.
_NOT_IN_A_REFERENCE = re.compile(r"[\s'\"]")


def _hide_userinfo(authority: str) -> str:
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return authority
    user, colon, _ = userinfo.partition(":")
    return f"{user + ':***' if colon else '***'}@{host}"


def _hide_uri_userinfo(match: re.Match[str]) -> str:
    scheme, user, password = match.group(1), match.group(2), match.group(3)
    return f"{scheme}{user}:***@" if password is not None else f"{scheme}***@"


def redacted(value: str) -> str:
    """``value`` with the secrets of the module docstring replaced by ``***``; anything else as is."""
    head, slash, path = value.partition("/")
    if "://" not in value and slash and "@" in head and not _NOT_IN_A_REFERENCE.search(head):
        value = f"{_hide_userinfo(head)}/{path}"  # a reference's first component (not a message's words)
    value = URI_USERINFO.sub(_hide_uri_userinfo, value)
    value = USER_PASSWORD.sub(lambda match: f"{match.group(1)}:***@", value)
    value = SLACK_WEBHOOK.sub(lambda match: f"{match.group(1)}***", value)
    value = PEM_BODY.sub(lambda match: f"{match.group(1)}***", value)
    value = DER_KEY_BODY.sub(lambda match: match.group(0)[:4] + "***", value)
    if AWS_KEY_ID.search(value):
        value = AWS_SECRET_KEY.sub("***", value)
    return TOKEN.sub(lambda match: match.group(0)[:4] + "***", value)

"""A value shown in a message without the secret it may carry: :func:`redacted`, the one function
every message that quotes a user's value through a URI, an image reference or an option uses.

What is hidden:

* the user information of a URI, ``scheme://user:password@host`` → ``scheme://user:***@host`` (a lone
  ``token@host`` → ``***@host``; RFC 3986 section 3.2.1: "Use of the format "user:password" in the
  userinfo field is deprecated", and applications should not render it in clear text);
* the same before the first ``/`` of a reference without a scheme (``ghp_…@ghcr.io/org/image``: a
  registry's host is the reference's first component, so an ``@`` before it is credentials, while an
  image digest's ``@`` comes after the path);
* the common token shapes anywhere in the text, kept to their first four characters: GitHub
  (``ghp_``, ``gho_``, ``ghu_``, ``ghs_``, ``ghr_``, ``github_pat_``), Hugging Face (``hf_``), Slack
  (``xoxb-``, ``xoxp-``, ``xoxa-``, ``xoxr-``, ``xoxs-``), AWS access key ids (``AKIA``/``ASIA`` + 16),
  Google API keys (``AIza`` + 35): the prefixes each vendor documents for its tokens.
"""

from __future__ import annotations

import re

#: The token shapes of the module docstring.
TOKEN = re.compile(
    r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}|"
    r"xox[bpars]-[A-Za-z0-9-]{10,}|(?:AKIA|ASIA)[A-Z0-9]{16}|AIza[0-9A-Za-z_-]{35})"
)


def _hide_userinfo(authority: str) -> str:
    userinfo, at, host = authority.rpartition("@")
    if not at:
        return authority
    user, colon, _ = userinfo.partition(":")
    return f"{user + ':***' if colon else '***'}@{host}"


def redacted(value: str) -> str:
    """``value`` with the secrets of the module docstring replaced by ``***``; anything else as is."""
    scheme, separator, rest = value.partition("://")
    if separator and "/" not in scheme and " " not in scheme:
        authority, slash, path = rest.partition("/")
        value = f"{scheme}://{_hide_userinfo(authority)}{slash}{path}"
    else:
        head, slash, path = value.partition("/")
        if slash and "@" in head:
            value = f"{_hide_userinfo(head)}/{path}"
    return TOKEN.sub(lambda match: match.group(0)[:4] + "***", value)

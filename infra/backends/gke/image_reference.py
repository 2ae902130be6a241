"""A container image reference as ``multislice:gke.image`` takes it: the grammar of the OCI
distribution reference (pure).

The grammar is the one Docker's and the registries' clients parse references with
(github.com/distribution/reference, ``reference.go``'s comment; Kubernetes passes a Pod's
``image`` to the container runtime, which parses it the same way)::

    reference            := name [ ":" tag ] [ "@" digest ]
    name                 := [domain '/'] remote-name
    domain               := host [':' port-number]
    host                 := domain-name | IPv4address | \\[ IPv6address \\]
    domain-name          := domain-component ['.' domain-component]*
    domain-component     := /([a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])/
    port-number          := /[0-9]+/
    path-component       := alpha-numeric [separator alpha-numeric]*
    remote-name          := path-component ['/' path-component]*
    alpha-numeric        := /[a-z0-9]+/
    separator            := /[_.]|__|[-]*/
    tag                  := /[\\w][\\w.-]{0,127}/
    digest               := digest-algorithm ":" digest-hex
    digest-algorithm     := component [ /[+.-_]/ component ]*,  component := /[A-Za-z][A-Za-z0-9]*/
    digest-hex           := /[0-9a-fA-F]{32,}/

and the name (domain and path) is at most 255 characters (``NameTotalLengthMax``). ``\\w`` there is
Go's RE2 class, ASCII only (``[0-9A-Za-z_]``: https://github.com/google/re2/wiki/Syntax), so a tag is
``[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}``, as the OCI distribution spec writes it ("Pulling manifests":
https://github.com/opencontainers/distribution-spec/blob/main/spec.md); Python's ``\\w`` would take any
letter of Unicode. A port number names a TCP port, 1 to 65535 (RFC 6335, section 6). The first
component is a domain only if it holds a ``.`` or a ``:`` or is ``localhost`` (``splitDomain``), so
``python:3.12`` is the ``python`` repository with tag ``3.12``. A sha256 digest has 64 hex digits.

Errors: :func:`check_image` raises :class:`ValueError` with the reason, which the config turns into
one line naming the key; the value is shown through :func:`training.redaction.redacted` (no
credentials, no token echoed).
"""

from __future__ import annotations

import re

from training.redaction import redacted

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]+))?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_PATH = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
#: The whole reference, groups ``name``, ``tag`` and ``digest``.
REFERENCE = re.compile(rf"(?P<name>(?:{_DOMAIN}/)?{_PATH})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")
#: The longest name (domain and path), characters.
NAME_TOTAL_LENGTH_MAX = 255
#: The largest port number (a TCP port: RFC 6335, section 6).
MAX_PORT = 65535
#: A digest's algorithm and its hex length, where the algorithm fixes one.
DIGEST_HEX_LENGTHS = {"sha256": 64, "sha512": 128}


def check_image(value: str) -> str:
    """``value`` if it is an image reference (the module docstring), else :class:`ValueError`
    saying what is wrong. Returns it unchanged."""
    if value != value.strip() or not value:
        raise ValueError(f"{redacted(value)[:80]!r} is not an image reference: it is empty or has spaces around it")
    match = REFERENCE.fullmatch(value)
    if match is None:
        hint, shown = "", redacted(value)[:80]
        head = value.partition("://")[2].split("/", 1)[0] if "://" in value else value.split("/", 1)[0]
        if "@" in head:  # user:password@registry/…, token@registry/…: never echo it
            hint = " (credentials have no place in an image reference: use an image pull secret)"
        elif any(c.isupper() for c in value.split("@", 1)[0].split(":")[0].split("/", 1)[-1]):
            hint = " (the repository path is lowercase)"
        elif not value.isascii():
            hint = " (a reference is ASCII: no other letters in a tag or a name)"
        raise ValueError(
            f"{shown!r} is not an image reference ([domain/]path[:tag][@digest]: a lowercase path, a tag "
            f"of at most 128 of [A-Za-z0-9_.-], a digest algorithm:hex){hint}"
        )
    name, digest, port = match["name"], match["digest"], match["port"]
    if port is not None and (len(port) > len(str(MAX_PORT)) or not 1 <= int(port) <= MAX_PORT):
        raise ValueError(
            f"{redacted(value)[:80]!r}: the registry's port {port[:12]}{'…' if len(port) > 12 else ''} is not a TCP "
            f"port (1 to {MAX_PORT})"
        )
    if len(name) > NAME_TOTAL_LENGTH_MAX:
        raise ValueError(
            f"{redacted(value)[:80]!r}: the image name is {len(name)} characters, over {NAME_TOTAL_LENGTH_MAX}"
        )
    if digest is not None:
        algorithm, hex_digits = digest.split(":", 1)
        want = DIGEST_HEX_LENGTHS.get(algorithm)
        if want is not None and len(hex_digits) != want:
            raise ValueError(
                f"{redacted(value)[:80]!r}: a {algorithm} digest has {want} hex digits, not {len(hex_digits)}"
            )
    return value

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

and the name (domain and path) is at most 255 characters (``NameTotalLengthMax``). The first
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
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_PATH = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
#: The whole reference, groups ``name``, ``tag`` and ``digest``.
REFERENCE = re.compile(rf"(?P<name>(?:{_DOMAIN}/)?{_PATH})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")
#: The longest name (domain and path), characters.
NAME_TOTAL_LENGTH_MAX = 255
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
        raise ValueError(
            f"{shown!r} is not an image reference ([domain/]path[:tag][@digest]: a lowercase path, a tag "
            f"of at most 128 of [A-Za-z0-9_.-], a digest algorithm:hex){hint}"
        )
    name, digest = match["name"], match["digest"]
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

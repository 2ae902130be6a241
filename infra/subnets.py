"""The IPv4 ranges Google Cloud accepts for a subnet (:func:`check_subnet_range`): read by a stack's
``multislice:network.subnetRange`` and by the gke backend's ``controlPlaneCidr``."""

from __future__ import annotations

import ipaddress

from training.redaction import redacted

#: IPv4 ranges Google Cloud refuses for any subnet ("Prohibited IPv4 subnet ranges"
#: https://cloud.google.com/vpc/docs/subnets), with the page's reason.
#: The page also prohibits the public ranges of Google APIs and services: every public range is
#: refused below anyway.
PROHIBITED_SUBNET_RANGES: tuple[tuple[str, str], ...] = (
    ("0.0.0.0/8", "current (local) network, RFC 1122"),
    ("127.0.0.0/8", "local host (loopback), RFC 1122"),
    ("169.254.0.0/16", "link-local, RFC 3927; the metadata server is 169.254.169.254"),
    ("224.0.0.0/4", "multicast (class D), RFC 5771"),
    ("255.255.255.255/32", "limited broadcast, RFC 8190 and RFC 1122"),
    ("199.36.153.4/30", "restricted.googleapis.com, Private Google Access"),
    ("199.36.153.8/30", "private.googleapis.com, Private Google Access"),
)
#: The non-public IPv4 ranges Google Cloud accepts for subnets ("Valid IPv4 ranges", same page):
#: RFC 1918, shared address space, IETF protocol assignments, documentation, 6to4 relay,
#: benchmarking and class E.
VALID_SUBNET_RANGES: tuple[tuple[str, str], ...] = (
    ("10.0.0.0/8", "RFC 1918"),
    ("172.16.0.0/12", "RFC 1918"),
    ("192.168.0.0/16", "RFC 1918"),
    ("100.64.0.0/10", "shared address space, RFC 6598"),
    ("192.0.0.0/24", "IETF protocol assignments, RFC 6890"),
    ("192.0.2.0/24", "documentation TEST-NET-1, RFC 5737"),
    ("198.51.100.0/24", "documentation TEST-NET-2, RFC 5737"),
    ("203.0.113.0/24", "documentation TEST-NET-3, RFC 5737"),
    ("192.88.99.0/24", "6to4 relay anycast, RFC 7526"),
    ("198.18.0.0/15", "benchmarking, RFC 2544"),
    ("240.0.0.0/4", "class E, reserved for future use, RFC 5735 and RFC 1112"),
)


def check_subnet_range(value: str) -> str:
    """``value`` if it is an IPv4 range Google Cloud accepts for the created subnetwork.

    Google Cloud's rules (https://cloud.google.com/vpc/docs/subnets, "Valid IPv4 ranges",
    "Prohibited IPv4 subnet ranges", "Limitations for IPv4 subnet ranges"): a primary range
    from /8 to /29 that overlaps none of :data:`PROHIBITED_SUBNET_RANGES`. Of the valid ranges
    only the non-public ones (:data:`VALID_SUBNET_RANGES`) are accepted: GCP also allows
    privately used public ranges, but the TPU VMs reach PyPI and Python downloads through
    Cloud NAT, and a subnet that reuses public addresses hides those destinations.

    Raises:
      ValueError: the text is not a CIDR range, or the range is refused (the message names the
        overlapping prohibited range and its reason, or lists the valid ranges).
    """
    try:
        net = ipaddress.IPv4Network(value, strict=True)
    except ValueError as err:
        shown = redacted(repr(value))[:80]  # the value, and the error that quotes it, without a secret
        why = redacted(str(err))[:120]
        raise ValueError(f"{shown} is not an IPv4 CIDR range like '10.130.0.0/20' ({why})") from None
    if net.prefixlen < 8 or net.prefixlen > 29:
        raise ValueError(f"{value!r}: a subnet's primary range has a prefix length from /8 to /29")
    for prohibited, reason in PROHIBITED_SUBNET_RANGES:
        if net.overlaps(ipaddress.IPv4Network(prohibited)):
            raise ValueError(
                f"{value!r} overlaps {prohibited} ({reason}), which Google Cloud prohibits in subnets "
                "(https://cloud.google.com/vpc/docs/subnets: Prohibited IPv4 subnet ranges)"
            )
    if not any(net.subnet_of(ipaddress.IPv4Network(valid)) for valid, _ in VALID_SUBNET_RANGES):
        raise ValueError(
            f"{value!r} is a public range: use a private one such as 10.0.0.0/8, 172.16.0.0/12 or "
            "192.168.0.0/16 (Cloud NAT takes the VMs to public addresses, which a subnet must not reuse)"
        )
    return value

"""Who is counted: a policy's key spec applied to a request, hashed for Redis, masked for the admin.

`specs` reads key specs and computes subjects; `reading` reads headers and bodies as the view will;
`addresses` finds the client's address behind trusted proxies; `text` reads a subject a person wrote.
"""

from __future__ import annotations

from ..values import KeyPart, KeySpec, Subject
from . import addresses, specs
from .addresses import (
    UNIX_SOCKET,
    IPAddress,
    IPNetwork,
    TrustedProxies,
    client_address,
    client_ip,
    forget_warning,
    invalid_trusted_proxies,
    ip_network,
    unmapped,
)
from .reading import BODY_ERRORS, FORM_TYPES, JSON_ATTRIBUTE, header_value, http_request, meta_key
from .specs import (
    DISPLAY_LIMIT,
    KINDS,
    SIMPLE_PARTS,
    TOKEN,
    KeySpecError,
    bounded_display,
    identifies_the_caller,
    mask,
    parse_key_spec,
    subject_for,
    subject_key,
)
from .text import SubjectTextError, subject_from_text


def forget_settings() -> None:
    """What subjects derive from settings: displays, address grouping, trusted proxies."""
    specs.forget_settings()  # displays depend on RATELIMIT_PLAIN_HEADERS
    addresses.forget_settings()  # RATELIMIT_TRUSTED_PROXIES, RATELIMIT_IPV4_PREFIX, RATELIMIT_IPV6_PREFIX


__all__ = [
    "BODY_ERRORS",
    "DISPLAY_LIMIT",
    "FORM_TYPES",
    "IPAddress",
    "IPNetwork",
    "JSON_ATTRIBUTE",
    "KINDS",
    "SIMPLE_PARTS",
    "TOKEN",
    "UNIX_SOCKET",
    "KeyPart",
    "KeySpec",
    "KeySpecError",
    "Subject",
    "SubjectTextError",
    "TrustedProxies",
    "bounded_display",
    "client_address",
    "client_ip",
    "forget_settings",
    "forget_warning",
    "header_value",
    "http_request",
    "identifies_the_caller",
    "invalid_trusted_proxies",
    "ip_network",
    "mask",
    "meta_key",
    "parse_key_spec",
    "subject_for",
    "subject_from_text",
    "subject_key",
    "unmapped",
]

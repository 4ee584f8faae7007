"""The validators of the models' text fields: actions, key specs, methods, time zones, networks."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

from ..periods import zone
from ..subjects import KeySpecError, ip_network, parse_key_spec

UNIT_LENGTH = 32
UNIT = re.compile(r"[a-z][a-z0-9-]*")
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"})


def validate_key_spec(value: str) -> None:
    try:
        parse_key_spec(value)
    except KeySpecError as error:
        raise ValidationError(str(error), code="invalid_key") from error


def validate_action(value: str) -> None:
    if not value.strip() or any(char.isspace() for char in value):
        raise ValidationError(
            "An action is '*', a path prefix such as '/api/', or a name such as 'demo:search'; "
            "it cannot be empty or contain spaces.",
            code="invalid_action",
        )


def parse_methods(value: str) -> frozenset[str]:
    """'post, PUT' -> {'POST', 'PUT'}; blank -> empty set, meaning every method."""
    return frozenset(part.strip().upper() for part in value.split(",") if part.strip())


def validate_methods(value: str) -> None:
    unknown = sorted(parse_methods(value) - HTTP_METHODS)
    if unknown:
        raise ValidationError(
            "Unknown HTTP method(s): %(unknown)s. Use a comma list such as 'POST,PUT', or leave blank for all.",
            params={"unknown": ", ".join(unknown)},
            code="invalid_methods",
        )


def validate_unit(value: str) -> None:
    if not UNIT.fullmatch(value) or len(value) > UNIT_LENGTH:
        raise ValidationError(
            "A unit is 'requests', 'content-bytes' (the bytes of the response), or a short name in lower case "
            "that the view reports, such as 'tokens' or 'credits' (letters, digits and hyphens, at most "
            f"{UNIT_LENGTH} characters).",
            code="invalid_unit",
        )


def validate_time_zone(value: str) -> None:
    if value:
        try:
            zone(value)
        except ValueError as error:
            raise ValidationError(str(error), code="invalid_time_zone") from error


def validate_network(value: str) -> None:
    try:
        ip_network(value)
    except ValueError as error:
        raise ValidationError(
            "Enter an IP address or a network in CIDR form, e.g. 203.0.113.7 or 10.0.0.0/8 or 2001:db8::/48.",
            code="invalid_network",
        ) from error


def canonical_network(value: str) -> str:
    """'10.1.2.3/16' -> '10.1.0.0/16', '10.0.0.1/32' -> '10.0.0.1', '::ffff:203.0.113.7' -> '203.0.113.7'
    (the form client addresses are matched in); an invalid value is left as it is."""
    try:
        network = ip_network(value)
    except ValueError:
        return value  # the field's validator reports it
    return str(network.network_address) if network.prefixlen == network.max_prefixlen else str(network)

"""A subject as a person writes it, for the admin's reset and the command line: 'ip:203.0.113.7',
'user:alice', 'header:X-Api-Key=abc123', turned into the Subject the request path computes."""

from __future__ import annotations

import ipaddress
import re
from types import SimpleNamespace

from ..values import KeyPart, KeySpec, Subject
from .addresses import client_ip, parse_address
from .specs import SIMPLE_PARTS, bounded_display, read_user, subject_of


class SubjectTextError(ValueError):
    """A subject written by a person that does not fit the policy's key; the message says why."""


def subject_from_text(spec: KeySpec, text: str) -> Subject:
    """The subject a person means under `spec`: 'ip:203.0.113.7', 'user:42' (an id), 'user:alice'
    (a username), 'header:X-Api-Key=abc123', 'param:q=abc', 'global'; a composite key's parts
    joined by ', ' in the key's order. The same Subject the request path computes, hash and all."""
    pieces = _pieces_of_text(spec, text.strip())
    read = [_canonical_value(part, piece) for part, piece in zip(spec, pieces)]
    found = subject_of(spec, [value for value, _described in read])
    if not any(part.named and described for part, (_value, described) in zip(spec, read)):
        return found
    shown = (
        part.named(described, value) if part.named and described else part.show(value)
        for part, (value, described) in zip(spec, read)
    )
    return Subject(found.key, bounded_display(", ".join(shown)))  # shown as the request path shows it


def _written_prefixes(part: KeyPart) -> tuple[str, ...]:
    if part.label == "user_or_ip":
        return ("user:", "ip:")
    if part.label in SIMPLE_PARTS:
        return (part.label if part.label == "global" else part.label + ":",)
    return (part.label + "=",)  # header:x-api-key=..., param:q=...


def _pieces_of_text(spec: KeySpec, text: str) -> list[str]:
    """Split a composite subject where the next part's prefix follows a comma (values may hold commas)."""
    pieces, rest = [], text
    for part, following in zip(spec, spec[1:]):
        prefixes = "|".join(re.escape(prefix) for prefix in _written_prefixes(following))
        boundary = re.search(rf",\s*(?=(?:{prefixes}))", rest, re.IGNORECASE)
        if boundary is None:
            raise SubjectTextError(
                f"{text!r} does not have the {len(spec)} parts of the key {_spec_text(spec)!r}, "
                f"e.g. {_example(spec)}."
            )
        pieces.append(rest[: boundary.start()].strip())
        rest = rest[boundary.end() :]
    pieces.append(rest.strip())
    return pieces


def _canonical_value(part: KeyPart, piece: str) -> tuple[str, object | None]:
    """What part.read() returns for the request a person describes with `piece`, and that request
    when the part's display reads more of it than the value (a user's name)."""
    prefix = next((p for p in _written_prefixes(part) if piece.lower().startswith(p)), None)
    if prefix is None:
        raise SubjectTextError(
            f"{piece!r} is not a subject of the key {part.label!r}: write it as {_example((part,))}."
        )
    value = piece[len(prefix) :].strip()
    if prefix == "global":
        if value:
            raise SubjectTextError(f"'global' takes no value, {piece!r} has one.")
        return "global", None
    if not value:
        raise SubjectTextError(f"{piece!r} has no value after {prefix!r}: write it as {_example((part,))}.")
    if prefix == "ip:":
        return "ip:" + _ip_from_text(value), None
    if prefix == "user:":
        # the request path's own readers, given stand-ins for what they read of a request
        pk, name = _user_from_text(value)
        described = SimpleNamespace(user=SimpleNamespace(pk=pk, is_authenticated=True, get_username=lambda: name))
        return read_user(described), described
    return f"{part.label}={value}", None


def _ip_from_text(value: str) -> str:
    """An address, or a network as the admin shows a grouped IPv6 address, grouped as the request path does."""
    if "/" in value:
        try:
            value = str(ipaddress.ip_network(value, strict=False).network_address)
        except ValueError:
            raise SubjectTextError(f"{value!r} is not an IP address or network.") from None
    address = parse_address(value)
    if address is None:
        raise SubjectTextError(f"{value!r} is not an IP address.")
    return client_ip(SimpleNamespace(META={"REMOTE_ADDR": str(address)}))


def _user_from_text(value: str) -> tuple[object, str]:
    """(id, username) of an existing user's id, else of the user of that username, else an id of a
    deleted user (without a username)."""
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ValidationError

    users = get_user_model()
    try:
        pk = users._meta.pk.to_python(value)
    except ValidationError:
        pk = None
    user = users.objects.filter(pk=pk).first() if pk is not None else None
    if user is None:
        user = users.objects.filter(**{users.USERNAME_FIELD: value}).first()
    if user is not None:
        return user.pk, user.get_username()
    if pk is not None:
        return pk, ""  # deleted since, and perhaps still counted
    raise SubjectTextError(f"No user has the id or the username {value!r}.")


def _spec_text(spec: KeySpec) -> str:
    return ",".join(part.label for part in spec)


def _example(spec: KeySpec) -> str:
    examples = {
        "ip": "ip:203.0.113.7",
        "user": "user:42 or user:alice",
        "user_or_ip": "user:42 or ip:203.0.113.7",
        "global": "global",
    }
    return ", ".join(examples.get(part.label, f"{part.label}=<value>") for part in spec)

"""Who is counted: a policy's key spec ('ip', 'user', 'header:X-Api-Key', ...) applied to a request.

A subject reaches Redis only as a short hash; its readable form (secrets masked) is for the admin.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from functools import lru_cache
from typing import Callable, NamedTuple

from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import get_setting

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
DISPLAY_LIMIT = 100
KINDS = "ip, user, user_or_ip, header:<Name>, param:<name>, global"


class Subject(NamedTuple):
    key: str  # 16 hex digits of blake2b(canonical subject): what Redis keys carry
    display: str  # readable, at most 100 characters, secrets masked: what the admin shows


class KeySpecError(ValueError):
    """A key spec that cannot be used; the message says what is wrong."""


class KeyPart(NamedTuple):
    """One part of a key spec: its canonical label and how to read its value from a request."""

    label: str
    read: Callable[[object], str | None]  # request -> canonical value, or None when it cannot be computed
    show: Callable[[str], str]  # canonical value -> display


KeySpec = tuple[KeyPart, ...]


# --- reading a spec ------------------------------------------------------------------------------


def parse_key_spec(spec: str) -> KeySpec:
    """'ip', 'user', 'user_or_ip', 'header:<Name>', 'param:<name>', 'global' or a comma list of them."""
    if not spec or not spec.strip():
        raise KeySpecError(f"The key is empty: use one of {KINDS}, or a comma list of them.")
    parts = [part.strip() for part in spec.split(",")]
    if any(not part for part in parts):
        raise KeySpecError(f"The key {spec!r} has an empty part: remove the stray comma.")
    compiled = tuple(_parse_part(part) for part in parts)
    labels = [part.label for part in compiled]
    duplicates = sorted({label for label in labels if labels.count(label) > 1})
    if duplicates:
        raise KeySpecError(f"The key {spec!r} repeats {', '.join(duplicates)}.")
    if "global" in labels and len(labels) > 1:
        raise KeySpecError("'global' counts everyone together and cannot be combined with other parts.")
    return compiled


def _parse_part(part: str) -> KeyPart:
    kind, colon, name = part.partition(":")
    kind = kind.strip().lower()
    name = name.strip()
    if not colon and kind in SIMPLE_PARTS:
        return SIMPLE_PARTS[kind]
    if kind == "header" and colon:
        if not name:
            raise KeySpecError("'header:' needs a header name, e.g. header:X-Api-Key.")
        if not TOKEN.match(name):
            raise KeySpecError(f"{name!r} is not a valid HTTP header name.")
        return _header_part(name)
    if kind == "param" and colon:
        if not name:
            raise KeySpecError("'param:' needs a parameter name, e.g. param:username.")
        return _param_part(name)
    raise KeySpecError(f"Unknown key kind {part!r} (expected {KINDS}).")


# --- the parts -----------------------------------------------------------------------------------


def _user(request) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return f"user:{user.pk}"


def _ip(request) -> str | None:
    address = client_ip(request)
    return None if address is None else f"ip:{address}"


def _user_or_ip(request) -> str | None:
    return _user(request) or _ip(request)


def _plain(value: str) -> str:
    return value


SIMPLE_PARTS = {
    "ip": KeyPart("ip", _ip, _plain),
    "user": KeyPart("user", _user, _plain),
    "user_or_ip": KeyPart("user_or_ip", _user_or_ip, _plain),
    "global": KeyPart("global", lambda request: "global", _plain),
}


def _header_part(name: str) -> KeyPart:
    meta = name.upper().replace("-", "_")
    if meta not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        meta = "HTTP_" + meta
    label = f"header:{name.lower()}"

    def read(request) -> str | None:
        value = request.META.get(meta)
        return f"{label}={value}" if value else None

    def show(canonical: str) -> str:
        value = canonical[len(label) + 1 :]
        plain = {header.lower() for header in get_setting("RATELIMIT_PLAIN_HEADERS")}
        return f"header:{name}={value if name.lower() in plain else mask(value)}"

    return KeyPart(label, read, show)


def _param_part(name: str) -> KeyPart:
    label = f"param:{name}"

    def read(request) -> str | None:
        value = request.GET.get(name)
        if not value and request.META.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
            value = request.POST.get(name)  # never parse a multipart body from here
        return f"{label}={value}" if value else None

    def show(canonical: str) -> str:
        return f"{label}={mask(canonical[len(label) + 1 :])}"

    return KeyPart(label, read, show)


# --- computing a subject -------------------------------------------------------------------------


def subject_for(spec: KeySpec, request) -> Subject | None:
    """The subject of `request` under `spec`, or None when any part cannot be computed."""
    if len(spec) == 1:  # the common case, kept short
        part = spec[0]
        value = part.read(request)
        if value is None:
            return None
        return _single(value, part.show)
    values = []
    for part in spec:
        value = part.read(request)
        if value is None:
            return None
        values.append(value)
    display = ", ".join(part.show(value) for part, value in zip(spec, values))
    return Subject(_hash(",".join(values)), _bounded(display))


@lru_cache(maxsize=8192)
def _single(value: str, show: Callable[[str], str]) -> Subject:
    # the same clients come back: hashing and formatting them again is wasted work
    return Subject(_hash(value), _bounded(show(value)))


@receiver(setting_changed, dispatch_uid="ratelimit_subjects_settings_changed")
def _forget_subjects(**kwargs: object) -> None:
    _single.cache_clear()  # displays depend on RATELIMIT_PLAIN_HEADERS


def _hash(canonical: str) -> str:
    # surrogatepass: whatever a header or parameter holds (WSGI hands bytes over as latin-1) never raises
    return hashlib.blake2b(canonical.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _bounded(display: str) -> str:
    if len(display) <= DISPLAY_LIMIT and display.isprintable():
        return display  # the common case, without a loop over characters
    shown = "".join(char if char.isprintable() else "?" for char in display[: DISPLAY_LIMIT + 1])
    return shown if len(shown) <= DISPLAY_LIMIT else shown[: DISPLAY_LIMIT - 1] + "…"


def mask(value: str) -> str:
    """Secrets are shown as '…' + their last 4 characters, enough to tell keys apart."""
    return "…" + value[-4:] if len(value) > 8 else "…"


# --- the client's address ------------------------------------------------------------------------


_trusted_cache: dict[tuple, tuple[IPNetwork, ...]] = {}


def _trusted_networks() -> tuple[IPNetwork, ...]:
    configured = tuple(get_setting("RATELIMIT_TRUSTED_PROXIES"))
    networks = _trusted_cache.get(configured)
    if networks is None:
        networks = _trusted_cache[configured] = tuple(ipaddress.ip_network(p, strict=False) for p in configured)
    return networks


@lru_cache(maxsize=4096)
def _parse_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("["):  # "[2001:db8::1]:443"
        text = text[1 : text.find("]")] if "]" in text else text[1:]
    elif text.count(":") == 1:  # "203.0.113.7:5678"
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def _is_trusted(address, networks) -> bool:
    return any(address in network for network in networks)


def client_address(request) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """REMOTE_ADDR, or behind trusted proxies the right-most untrusted X-Forwarded-For address."""
    remote = _parse_address(request.META.get("REMOTE_ADDR", ""))
    networks = _trusted_networks()
    if remote is None or not networks or not _is_trusted(remote, networks):
        return remote  # a client that is not a trusted proxy cannot choose its address by a header
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [hop for hop in forwarded.split(",") if hop.strip()]
    last_trusted = remote
    for hop in reversed(hops):
        address = _parse_address(hop)
        if address is None:
            return last_trusted  # garbage from the client's side: count the request against the proxy
        if not _is_trusted(address, networks):
            return address
        last_trusted = address
    return last_trusted


def client_ip(request) -> str | None:
    """The client's address as counted: IPv6 grouped by RATELIMIT_IPV6_PREFIX, IPv4 by RATELIMIT_IPV4_PREFIX."""
    address = client_address(request)
    if address is None:
        return None
    prefix = get_setting("RATELIMIT_IPV6_PREFIX" if address.version == 6 else "RATELIMIT_IPV4_PREFIX")
    return _grouped(address, prefix)


@lru_cache(maxsize=4096)
def _grouped(address: ipaddress.IPv4Address | ipaddress.IPv6Address, prefix: int) -> str:
    if prefix >= address.max_prefixlen:
        return str(address)
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))


# --- a subject as a person writes it (the admin's reset, the command line) ------------------------

from types import SimpleNamespace  # noqa: E402  (kept with the only code that uses it)


class SubjectTextError(ValueError):
    """A subject written by a person that does not fit the policy's key; the message says why."""


def subject_from_text(spec: KeySpec, text: str) -> Subject:
    """The subject a person means under `spec`: 'ip:203.0.113.7', 'user:42' (an id), 'user:alice'
    (a username), 'header:X-Api-Key=abc123', 'param:q=abc', 'global'; a composite key's parts
    joined by ', ' in the key's order. The same Subject the request path computes, hash and all."""
    pieces = _pieces_of_text(spec, text.strip())
    values = [_canonical_value(part, piece) for part, piece in zip(spec, pieces)]
    if len(spec) == 1:
        return _single(values[0], spec[0].show)
    display = ", ".join(part.show(value) for part, value in zip(spec, values))
    return Subject(_hash(",".join(values)), _bounded(display))


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
            raise SubjectTextError(f"{text!r} does not have the {len(spec)} parts of the key {_spec_text(spec)!r}, "
                                   f"e.g. {_example(spec)}.")
        pieces.append(rest[: boundary.start()].strip())
        rest = rest[boundary.end() :]
    pieces.append(rest.strip())
    return pieces


def _canonical_value(part: KeyPart, piece: str) -> str:
    """What part.read() returns for the request a person describes with `piece`."""
    prefix = next((p for p in _written_prefixes(part) if piece.lower().startswith(p)), None)
    if prefix is None:
        raise SubjectTextError(f"{piece!r} is not a subject of the key {part.label!r}: write it as {_example((part,))}.")
    value = piece[len(prefix) :].strip()
    if prefix == "global":
        if value:
            raise SubjectTextError(f"'global' takes no value, {piece!r} has one.")
        return "global"
    if not value:
        raise SubjectTextError(f"{piece!r} has no value after {prefix!r}: write it as {_example((part,))}.")
    if prefix == "ip:":
        return "ip:" + _ip_from_text(value)
    if prefix == "user:":
        # the request path's own readers, given stand-ins for what they read of a request
        return _user(SimpleNamespace(user=SimpleNamespace(pk=_user_pk_from_text(value), is_authenticated=True)))
    return f"{part.label}={value}"


def _ip_from_text(value: str) -> str:
    """An address, or a network as the admin shows a grouped IPv6 address, grouped as the request path does."""
    if "/" in value:
        try:
            value = str(ipaddress.ip_network(value, strict=False).network_address)
        except ValueError:
            raise SubjectTextError(f"{value!r} is not an IP address or network.") from None
    address = _parse_address(value)
    if address is None:
        raise SubjectTextError(f"{value!r} is not an IP address.")
    return client_ip(SimpleNamespace(META={"REMOTE_ADDR": str(address)}))


def _user_pk_from_text(value: str):
    """An existing user's id, else the id of the user of that username, else an id of a deleted user."""
    from django.contrib.auth import get_user_model
    from django.core.exceptions import ValidationError

    users = get_user_model()
    try:
        pk = users._meta.pk.to_python(value)
    except ValidationError:
        pk = None
    if pk is not None and users.objects.filter(pk=pk).exists():
        return pk
    user = users.objects.filter(**{users.USERNAME_FIELD: value}).first()
    if user is not None:
        return user.pk
    if pk is not None:
        return pk  # deleted since, and perhaps still counted
    raise SubjectTextError(f"No user has the id or the username {value!r}.")


def _spec_text(spec: KeySpec) -> str:
    return ",".join(part.label for part in spec)


def _example(spec: KeySpec) -> str:
    examples = {"ip": "ip:203.0.113.7", "user": "user:42 or user:alice", "user_or_ip": "user:42 or ip:203.0.113.7", "global": "global"}
    return ", ".join(examples.get(part.label, f"{part.label}=<value>") for part in spec)

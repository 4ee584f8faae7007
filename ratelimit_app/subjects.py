"""Who is counted: a policy's key spec ('ip', 'user', 'header:X-Api-Key', ...) applied to a request.

A subject reaches Redis only as a short hash; its readable form (secrets masked) is for the admin.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import re
from functools import lru_cache
from typing import Callable, NamedTuple

from django.conf import settings
from django.core.exceptions import BadRequest, SuspiciousOperation
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException
from django.utils.module_loading import import_string

from .conf import get_setting
from .lru import byte_bounded_cache
from .values import KeyPart, KeySpec, Subject

logger = logging.getLogger("ratelimit_app")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
DISPLAY_LIMIT = 100
KINDS = "ip, user, user_or_ip, header:<Name>, param:<name>, get:<name>, post:<name>, global, a dotted path to a function (myapp.keys.tenant)"
UNIX_SOCKET = "unix"  # in RATELIMIT_TRUSTED_PROXIES: the server's own socket (REMOTE_ADDR empty) is a proxy


class KeySpecError(ValueError):
    """A key spec that cannot be used; the message says what is wrong."""




# --- reading a spec ------------------------------------------------------------------------------


def parse_key_spec(spec: str) -> KeySpec:
    """'ip', 'user', 'user_or_ip', 'header:<Name>', 'param:<name>', 'get:<name>', 'post:<name>', 'global'
    or a comma list of them."""
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
    if "." in part and ":" not in part:
        return _callable_part(part)
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
    if kind in ("param", "get", "post") and colon:
        if not name:
            raise KeySpecError(f"'{kind}:' needs a parameter name, e.g. {kind}:username.")
        return _param_part(kind, name)
    raise KeySpecError(f"Unknown key kind {part!r} (expected {KINDS}).")


# --- the parts -----------------------------------------------------------------------------------


def _user(request) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return f"user:{user.pk}"


def _ip(request) -> str | None:
    remote = request.META.get("REMOTE_ADDR")
    if remote and not _trusted_proxies().networks:
        value = _direct_ip(remote)  # no proxy is believed: the address is REMOTE_ADDR's (the common case)
    else:
        address = client_ip(request)
        value = None if address is None else f"ip:{address}"
    if value is None:
        _warn_no_address(request)
    return value


@byte_bounded_cache(1 << 20)  # the same clients come back
def _direct_ip(remote: str) -> str | None:
    """The `ip` value of a request from `remote` (REMOTE_ADDR) when no proxy is trusted."""
    address = _parse_address(remote)
    return None if address is None else f"ip:{_grouped(address, _prefix_of(address))}"


_warned_no_address = False


def _warn_no_address(request) -> None:
    global _warned_no_address
    if _warned_no_address:
        return
    _warned_no_address = True  # once per process: loud enough to be seen, never a flood
    logger.warning(
        "ratelimit: an ip policy met a request with no usable client address (REMOTE_ADDR=%r, "
        "X-Forwarded-For=%r); ip policies do not apply to such requests. Behind a unix socket, add "
        "'unix' to RATELIMIT_TRUSTED_PROXIES so that the proxy's X-Forwarded-For is used.",
        request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR", "")[:100],
    )


def _user_or_ip(request) -> str | None:
    return _user(request) or _ip(request)


def _plain(value: str) -> str:
    return value


SIMPLE_PARTS = {
    "ip": KeyPart("ip", _ip, _plain),
    "user": KeyPart("user", _user, _plain, reads_user=True),
    "user_or_ip": KeyPart("user_or_ip", _user_or_ip, _plain, reads_user=True),
    "global": KeyPart("global", lambda request: "global", _plain),
}


def meta_key(header: str) -> str:
    """Where Django keeps a request header: 'X-Api-Key' -> 'HTTP_X_API_KEY', 'Content-Type' -> 'CONTENT_TYPE'."""
    name = header.strip().upper().replace("-", "_")
    return name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{name}"


def http_request(request):
    """The Django HttpRequest behind a DRF Request (or the request itself)."""
    return request.__dict__.get("_request", request)  # a dict lookup: no AttributeError raised per request


def _header_part(name: str) -> KeyPart:
    meta = meta_key(name)
    label = f"header:{name.lower()}"

    def read(request) -> str | None:
        value = request.META.get(meta)
        return f"{label}={value}" if value else None

    def show(canonical: str) -> str:
        value = canonical[len(label) + 1 :]
        plain = {header.lower() for header in get_setting("RATELIMIT_PLAIN_HEADERS")}
        return f"header:{name}={value if name.lower() in plain else mask(value)}"

    return KeyPart(label, read, show)


def _param_part(kind: str, name: str) -> KeyPart:
    """param: the body, then the query string (what a view handling a post reads); get: the query
    string only; post: the body only."""
    label = f"{kind}:{name}"
    body, query = kind != "get", kind != "post"

    def read(request) -> str | None:
        value = _from_body(request, name) if body else None
        if value is None and query:  # the first source holding the field decides, as for the view
            value = request.GET.get(name)
        return f"{label}={value}" if value else None

    def show(canonical: str) -> str:
        return f"{label}={mask(canonical[len(label) + 1 :])}"

    return KeyPart(label, read, show)


# Reading a body must never turn into a 500: whatever Django refuses here, the view meets again.
BODY_ERRORS = (SuspiciousOperation, BadRequest, MultiPartParserError, RawPostDataException, OSError, ValueError)
JSON_ATTRIBUTE = "_ratelimit_json"


def _from_body(request, name: str) -> str | None:
    """A field of a form body, or a top-level field of a JSON object body (content types as Django
    parses them: case, parameters and spaces do not matter)."""
    request = http_request(request)
    content_type = getattr(request, "content_type", None) or ""
    if content_type in FORM_TYPES:
        return _from_form(request, name, content_type) if request.method == "POST" else None  # as Django
    if content_type == "application/json" or content_type.endswith("+json"):
        return _from_json(request, name)
    return None


FORM_TYPES = frozenset(("application/x-www-form-urlencoded", "multipart/form-data"))


def _from_form(request, name: str, content_type: str) -> str | None:
    """A field of a form body, as request.POST gives it to the view (multipart within Django's limits)."""
    if content_type == "multipart/form-data":
        _keep_small_body(request)
    try:
        return request.POST.get(name)
    except BODY_ERRORS:
        if hasattr(request, "_body"):
            # parse again when the view asks, so that it gets Django's own 400 rather than an empty form
            request.__dict__.pop("_post", None)
            request.__dict__.pop("_files", None)
        return None


def _keep_small_body(request) -> None:
    # Parsing multipart consumes the stream: read a body Django would hold in memory anyway first,
    # so the view can still read request.body. A larger one is streamed by request.POST, as the view
    # would; its request.body is refused by Django either way.
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        if limit is not None and int(request.META.get("CONTENT_LENGTH") or 0) <= limit:
            request.body
    except BODY_ERRORS:
        pass  # request.POST meets the same error and says so


def _from_json(request, name: str) -> str | None:
    """A top-level field of a JSON object body; strings as they are, other values in their JSON form."""
    document = request.__dict__.get(JSON_ATTRIBUTE, _MISSING)
    if document is _MISSING:  # parsed once per request, however many policies read it
        document = request.__dict__[JSON_ATTRIBUTE] = _json_body(request)
    if not isinstance(document, dict):
        return None
    value = document.get(name)
    if value is None or isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _json_body(request) -> object:
    try:
        return json.loads(request.body)  # request.body enforces DATA_UPLOAD_MAX_MEMORY_SIZE
    except (*BODY_ERRORS, RecursionError):
        return None


_MISSING = object()


def _callable_part(path: str) -> KeyPart:
    """A function of the project, `(request) -> str | None`, named by its dotted path; imported now, so a
    policy naming a missing or non-callable one is refused when it is saved."""
    try:
        function = import_string(path)
    except ImportError as error:
        raise KeySpecError(f"Cannot import the key function {path!r}: {error}.") from error
    if not callable(function):
        raise KeySpecError(f"{path!r} is not a function: a key function takes the request and returns a string or None.")
    label = path

    def read(request) -> str | None:
        value = function(request)
        return None if value is None or value == "" else f"{label}={value}"

    return KeyPart(label, read, _plain, reads_user=True)  # a project's function may look at the user


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


@byte_bounded_cache(4 << 20)  # keyed by the canonical value: bounded in bytes, not entries
def _single(value: str, show: Callable[[str], str]) -> Subject:
    # the same clients come back: hashing and formatting them again is wasted work
    return Subject(_hash(value), _bounded(show(value)))


def forget_settings() -> None:
    """What subjects derive from settings: displays, address grouping, trusted proxies."""
    global _trusted
    _single.cache_clear()  # displays depend on RATELIMIT_PLAIN_HEADERS
    _direct_ip.cache_clear()  # addresses are grouped by RATELIMIT_IPV4_PREFIX and RATELIMIT_IPV6_PREFIX
    _trusted = None


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


class TrustedProxies(NamedTuple):
    networks: tuple[IPNetwork, ...]
    unix: bool  # the server's own socket: REMOTE_ADDR is empty and the proxy is on this machine


_trusted: TrustedProxies | None = None  # forgotten whenever a setting changes


def _trusted_proxies() -> TrustedProxies:
    """RATELIMIT_TRUSTED_PROXIES, read once: its networks, and whether it holds 'unix'."""
    global _trusted
    if _trusted is None:
        entries = [_proxy_entry(entry) for entry in get_setting("RATELIMIT_TRUSTED_PROXIES")]
        networks = tuple(entry for entry in entries if entry is not None and entry != UNIX_SOCKET)
        _trusted = TrustedProxies(networks, UNIX_SOCKET in entries)
    return _trusted


def _proxy_entry(entry: object) -> IPNetwork | str | None:
    """A network, 'unix', or None for an entry that is neither (skipped; system check E003)."""
    if str(entry).strip().lower() == UNIX_SOCKET:
        return UNIX_SOCKET
    try:
        return ip_network(entry)
    except (ValueError, TypeError):
        return None


def unmapped(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (::ffff:203.0.113.7, how a dual-stack socket reports an IPv4 client)
    as the IPv4 address it carries: every client address is counted and matched in this form."""
    if address.version == 6 and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def ip_network(value: object) -> IPNetwork:
    """An address or network as written (host bits ignored), in the form unmapped() gives addresses:
    an IPv4-mapped one (::ffff:203.0.113.0/120) is the IPv4 network it carries. ValueError otherwise."""
    network = ipaddress.ip_network(value.strip() if isinstance(value, str) else value, strict=False)
    if network.version == 6 and network.prefixlen >= 96 and network.network_address.ipv4_mapped is not None:
        return ipaddress.IPv4Network((network.network_address.ipv4_mapped, network.prefixlen - 96))
    return network


def invalid_trusted_proxies() -> list[str]:
    """The entries of RATELIMIT_TRUSTED_PROXIES that are neither an address, a network nor 'unix'."""
    return [repr(entry) for entry in get_setting("RATELIMIT_TRUSTED_PROXIES") if _proxy_entry(entry) is None]


@byte_bounded_cache(1 << 20)
def _parse_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    text = text.strip()
    if text.startswith("["):  # "[2001:db8::1]:443"
        text = text[1 : text.find("]")] if "]" in text else text[1:]
    elif text.count(":") == 1:  # "203.0.113.7:5678"
        text = text.partition(":")[0]
    # a zone id ('%eth0') names the server's interface, not the client: '%1', '%2'... are one client
    text = text.partition("%")[0]
    try:
        return unmapped(ipaddress.ip_address(text))
    except ValueError:
        return None


def _is_trusted(address, networks) -> bool:
    return any(address in network for network in networks)


def client_address(request) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """REMOTE_ADDR, or behind trusted proxies the right-most untrusted X-Forwarded-For address.

    An empty REMOTE_ADDR is the server's unix socket: a trusted proxy when RATELIMIT_TRUSTED_PROXIES
    holds 'unix', otherwise no address at all.
    """
    remote_text = request.META.get("REMOTE_ADDR") or ""
    networks, unix = _trusted_proxies()
    if remote_text:
        remote = _parse_address(remote_text)
        if remote is None or not networks or not _is_trusted(remote, networks):
            return remote  # a client that is not a trusted proxy cannot choose its address by a header
    elif not unix:
        return None
    else:
        remote = None  # the local socket: trusted, but it has no address of its own to fall back on
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
    return _grouped(address, _prefix_of(address))


def _prefix_of(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> int:
    return get_setting("RATELIMIT_IPV6_PREFIX" if address.version == 6 else "RATELIMIT_IPV4_PREFIX")


@lru_cache(maxsize=4096)  # addresses and prefixes: every entry has the same small size
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

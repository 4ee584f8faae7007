"""Who is counted: a policy's key spec ('ip', 'user', 'header:X-Api-Key', ...) applied to a request.

A subject reaches Redis only as a short hash; its readable form (secrets masked) is for the admin.
"""

from __future__ import annotations

import hashlib
import re
from typing import Callable, Sequence

from django.utils.module_loading import import_string

from ..conf import get_setting
from ..lru import byte_bounded_cache
from ..values import KeyPart, KeySpec, Subject
from .addresses import read_ip
from .reading import body_field, header_value, meta_key

TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)
DISPLAY_LIMIT = 100
KINDS = (
    "ip, user, user_or_ip, header:<Name>, param:<name>, get:<name>, post:<name>, global, "
    "a dotted path to a function (myapp.keys.tenant)"
)


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


def read_user(request) -> str | None:
    """The `user` key part's value, 'user:<pk>', or None for an anonymous request."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    return f"user:{user.pk}"


def _user_or_ip(request) -> str | None:
    return read_user(request) or read_ip(request)


def _named_user(request, canonical: str) -> str:
    """'user:alice' for 'user:2', from the request's user (loaded already): what the admin, the export and
    `top` show. The id stays where the name would read as another user's id, or as two parts of a key."""
    if not canonical.startswith("user:"):
        return canonical  # user_or_ip counted an anonymous request by its address
    name = request.user.get_username()
    return f"user:{name}" if name and not name.isdigit() and "," not in name else canonical


def _plain(value: str) -> str:
    return value


SIMPLE_PARTS = {
    "ip": KeyPart("ip", read_ip, _plain, identifies_caller=True),  # a client cannot choose its address (proxies.md)
    "user": KeyPart("user", read_user, _plain, reads_user=True, identifies_caller=True, named=_named_user),
    "user_or_ip": KeyPart("user_or_ip", _user_or_ip, _plain, reads_user=True, identifies_caller=True,
                          named=_named_user),
    "global": KeyPart("global", lambda request: "global", _plain),
}


def _header_part(name: str) -> KeyPart:
    meta = meta_key(name)
    label = f"header:{name.lower()}"

    def read(request) -> str | None:
        value = header_value(request.META, meta)
        return f"{label}={value}" if value else None

    def show(canonical: str) -> str:
        value = canonical[len(label) + 1 :]
        plain = {header.lower() for header in get_setting("RATELIMIT_PLAIN_HEADERS")}
        return f"header:{name}={value if name.lower() in plain else mask(value)}"

    # a header's value is the caller's credential (an API key) unless RATELIMIT_PLAIN_HEADERS says it is
    # not a secret: identifies_the_caller() reads the setting when asked
    return KeyPart(label, read, show, identifies_caller=True)


def _param_part(kind: str, name: str) -> KeyPart:
    """param: the body, then the query string (what a view handling a post reads); get: the query
    string only; post: the body only."""
    label = f"{kind}:{name}"
    body, query = kind != "get", kind != "post"

    def read(request) -> str | None:
        value = body_field(request, name) if body else None
        if value is None and query:  # the first source holding the field decides, as for the view
            value = request.GET.get(name)
        return f"{label}={value}" if value else None

    def show(canonical: str) -> str:
        return f"{label}={mask(canonical[len(label) + 1 :])}"

    return KeyPart(label, read, show)


def _callable_part(path: str) -> KeyPart:
    """A function of the project, `(request) -> str | None`, named by its dotted path; imported now, so a
    policy naming a missing or non-callable one is refused when it is saved."""
    try:
        function = import_string(path)
    except ImportError as error:
        raise KeySpecError(f"Cannot import the key function {path!r}: {error}.") from error
    if not callable(function):
        raise KeySpecError(
            f"{path!r} is not a function: a key function takes the request and returns a string or None."
        )
    label = path

    def read(request) -> str | None:
        value = function(request)
        return None if value is None or value == "" else f"{label}={value}"

    # a project's function may look at the user; it names the caller only when it says so
    identifies_caller = getattr(function, "identifies_caller", False) is True
    return KeyPart(label, read, _plain, reads_user=True, identifies_caller=identifies_caller)


def identifies_the_caller(spec: KeySpec) -> bool:
    """Whether every part of `spec` names the caller themselves (their address, user, a secret header such
    as an API key, a key function marked `identifies_caller = True`), so that a subject of it computed from
    a request is the caller's own: never a parameter or a plain header anyone may write, nor `global`."""
    plain = {f"header:{name.lower()}" for name in get_setting("RATELIMIT_PLAIN_HEADERS")}
    return all(part.identifies_caller and part.label not in plain for part in spec)


# --- computing a subject -------------------------------------------------------------------------


def subject_for(spec: KeySpec, request) -> Subject | None:
    """The subject of `request` under `spec`, or None when any part cannot be computed."""
    if len(spec) == 1:  # the common case, kept short
        part = spec[0]
        value = part.read(request)
        if value is None:
            return None
        if part.named is not None:  # the key from the value, the display from the request
            return Subject(single_subject(value, part.show).key, bounded_display(part.named(request, value)))
        return single_subject(value, part.show)
    values = []
    for part in spec:
        value = part.read(request)
        if value is None:
            return None
        values.append(value)
    found = subject_of(spec, values)
    if not any(part.named for part in spec):
        return found
    display = ", ".join(part.named(request, v) if part.named else part.show(v) for part, v in zip(spec, values))
    return Subject(found.key, bounded_display(display))


def subject_of(spec: KeySpec, values: Sequence[str]) -> Subject:
    """The subject whose parts read `values` (canonical, one per part of `spec`, in its order)."""
    if len(spec) == 1:
        return single_subject(values[0], spec[0].show)
    display = ", ".join(part.show(value) for part, value in zip(spec, values))
    return Subject(subject_key(",".join(values)), bounded_display(display))


@byte_bounded_cache()  # keyed by the canonical value: bounded in bytes, not entries
def single_subject(value: str, show: Callable[[str], str]) -> Subject:
    """The subject of a one-part key whose part read `value`."""
    # the same clients come back: hashing and formatting them again is wasted work
    return Subject(subject_key(value), bounded_display(show(value)))


def forget_settings() -> None:
    """Forget the displays made so far: they depend on RATELIMIT_PLAIN_HEADERS."""
    single_subject.cache_clear()


def subject_key(canonical: str) -> str:
    """What Redis keys carry for a subject: 16 hex digits of its canonical value's blake2b."""
    # surrogatepass: whatever a header or parameter holds (WSGI hands bytes over as latin-1) never raises
    return hashlib.blake2b(canonical.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def bounded_display(display: str) -> str:
    """A display as the admin shows it: at most DISPLAY_LIMIT characters, unprintable ones as '?'."""
    if len(display) <= DISPLAY_LIMIT and display.isprintable():
        return display  # the common case, without a loop over characters
    shown = "".join(char if char.isprintable() else "?" for char in display[: DISPLAY_LIMIT + 1])
    return shown if len(shown) <= DISPLAY_LIMIT else shown[: DISPLAY_LIMIT - 1] + "…"


def mask(value: str) -> str:
    """Secrets are shown as '…' + their last 4 characters, enough to tell keys apart."""
    return "…" + value[-4:] if len(value) > 8 else "…"

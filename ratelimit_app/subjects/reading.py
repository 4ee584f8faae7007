"""Reading a request as its view will: where a header is kept, the Django request behind a DRF one,
and a field of a form or JSON body (parsed once per request, never turned into a 500)."""

from __future__ import annotations

import json

from django.conf import settings
from django.core.exceptions import BadRequest, SuspiciousOperation
from django.http.multipartparser import MultiPartParserError
from django.http.request import RawPostDataException

# Reading a body must never turn into a 500: whatever Django refuses here, the view meets again.
BODY_ERRORS = (SuspiciousOperation, BadRequest, MultiPartParserError, RawPostDataException, OSError, ValueError)
FORM_TYPES = frozenset(("application/x-www-form-urlencoded", "multipart/form-data"))
JSON_ATTRIBUTE = "_ratelimit_json"
_MISSING = object()


def meta_key(header: str) -> str:
    """Where Django keeps a request header: 'X-Api-Key' -> 'HTTP_X_API_KEY', 'Content-Type' -> 'CONTENT_TYPE'."""
    name = header.strip().upper().replace("-", "_")
    return name if name in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{name}"


def header_value(meta, name: str) -> str | None:
    """The header kept in `meta` under `name` as its sender typed it. Servers hand headers over as latin-1
    text (WSGI's environ; Django decodes ASGI's bytes so too): UTF-8 read back as UTF-8 where it is valid,
    as Django does for paths, so that a key typed 'clé-123' in the admin matches what a client sends."""
    value = meta.get(name)
    if not value or value.isascii():
        return value
    try:
        return value.encode("latin-1").decode("utf-8")
    except UnicodeError:  # latin-1 bytes that are not UTF-8, or text handed over as it is (a test client)
        return value


def http_request(request):
    """The Django HttpRequest behind a DRF Request (or the request itself)."""
    return request.__dict__.get("_request", request)  # a dict lookup: no AttributeError raised per request


def body_field(request, name: str) -> str | None:
    """A field of a form body, or a top-level field of a JSON object body (content types as Django
    parses them: case, parameters and spaces do not matter)."""
    request = http_request(request)
    content_type = getattr(request, "content_type", None) or ""
    if content_type in FORM_TYPES:
        return _from_form(request, name, content_type) if request.method == "POST" else None  # as Django
    if content_type == "application/json" or content_type.endswith("+json"):
        return _from_json(request, name)
    return None


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

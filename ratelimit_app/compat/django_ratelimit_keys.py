"""django-ratelimit's keys (ip, user, user_or_ip, get:x, post:x, header:x, a dotted path or a callable),
read from a request as django-ratelimit reads them, and the subjects they name."""

from __future__ import annotations

import ipaddress
from typing import Any, Callable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ..conf import get_setting
from ..subjects import mask, meta_key
from . import door



def get_ip(request) -> str:
    """The client's address as django-ratelimit reads it (RATELIMIT_IP_META_KEY), masked to its network."""
    ip_meta = getattr(settings, "RATELIMIT_IP_META_KEY", None)
    if not ip_meta:
        ip = request.META["REMOTE_ADDR"]
        if not ip:
            raise ImproperlyConfigured(
                "IP address in REMOTE_ADDR is empty. This can happen when using a reverse proxy and connecting "
                "to the app server with Unix sockets. Set RATELIMIT_IP_META_KEY."
            )
    elif callable(ip_meta):
        ip = ip_meta(request)
    elif isinstance(ip_meta, str) and "." in ip_meta:
        ip = import_string(ip_meta)(request)
    elif ip_meta in request.META:
        ip = request.META[ip_meta]
    else:
        raise ImproperlyConfigured(f'Could not get IP address from "{ip_meta}"')
    if ":" in ip:
        mask_bits = getattr(settings, "RATELIMIT_IPV6_MASK", 64)
    else:
        mask_bits = getattr(settings, "RATELIMIT_IPV4_MASK", 32)
    return str(ipaddress.ip_network(f"{ip}/{mask_bits}", strict=False).network_address)


def user_or_ip(request) -> str:
    return str(request.user.pk) if request.user.is_authenticated else get_ip(request)


SIMPLE_KEYS: dict[str, Callable[[Any], str]] = {
    "ip": get_ip,
    "user": lambda request: str(request.user.pk),
    "user_or_ip": user_or_ip,
}
ACCESSOR_KEYS: dict[str, Callable[[Any, str], str]] = {
    "get": lambda request, name: request.GET.get(name, ""),
    "post": lambda request, name: request.POST.get(name, ""),
    "header": lambda request, name: request.META.get(meta_key(name), ""),
}


def key_value(key, group: str, request) -> str:
    if callable(key):
        return key(group, request)
    if key in SIMPLE_KEYS:
        return SIMPLE_KEYS[key](request)
    if ":" in key:
        accessor, name = key.split(":", 1)
        if accessor not in ACCESSOR_KEYS:
            raise ImproperlyConfigured(f"Unknown ratelimit key: {key}")
        return ACCESSOR_KEYS[accessor](request, name)
    if "." in key:
        return import_string(key)(group, request)
    raise ImproperlyConfigured(f"Could not understand ratelimit key: {key}")


def key_label(key) -> str:
    if callable(key):
        return f"{getattr(key, '__module__', '')}.{getattr(key, '__qualname__', repr(key))}"
    return key


def subject(key, value: Any) -> door.Subject:
    label = key_label(key)
    shown = str(value)
    plain = {f"header:{name.lower()}" for name in get_setting("RATELIMIT_PLAIN_HEADERS")}
    if label.startswith(("header:", "get:", "post:")) and label.lower() not in plain:
        shown = mask(shown)  # API keys and the like are shown masked in the admin
    return door.subject(f"{label}={value}", f"{label}={shown}" if label not in SIMPLE_KEYS else f"{label}:{shown}")

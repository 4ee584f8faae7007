"""Settings of ratelimit_app with their defaults and their kinds, read at call time so override_settings works
(the values are cached until Django signals that a setting changed)."""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, NamedTuple

from django.conf import settings
from django.utils.module_loading import import_string

logger = logging.getLogger("ratelimit_app")

DEFAULTS: dict[str, Any] = {
    # Master switch: False turns every door into a no-op (no Redis call at all).
    "RATELIMIT_ENABLED": True,
    # django-redis cache alias whose client the engine uses.
    "RATELIMIT_CACHE": "default",
    # Prefix of every Redis key, so several sites can share one server.
    "RATELIMIT_KEY_PREFIX": "rl",
    # Addresses or networks of proxies whose X-Forwarded-For is believed.
    "RATELIMIT_TRUSTED_PROXIES": (),
    "RATELIMIT_IPV4_PREFIX": 32,
    "RATELIMIT_IPV6_PREFIX": 64,
    # Header values are masked in the admin unless the header is listed here.
    "RATELIMIT_PLAIN_HEADERS": ("User-Agent", "Accept-Language", "Origin", "Referer", "Host"),
    # When Redis cannot be reached: True lets requests through, False answers 503.
    "RATELIMIT_FAIL_OPEN": True,
    # Seconds the circuit stays open after a Redis error before one request tries again.
    "RATELIMIT_BREAKER_SECONDS": 1.0,
    # Workers compare the policy version with Redis at most this often when no decision call carried it.
    "RATELIMIT_POLICY_RECHECK_SECONDS": 1.0,
    # A policy change also reaches every worker after at most this many seconds, whatever happened
    # to Redis (a safety net under the version check).
    "RATELIMIT_POLICY_RELOAD_SECONDS": 30.0,
    # Socket timeout of the admin's own Redis client (live page, policy list, resets); its errors
    # never open the circuit breaker that requests use.
    "RATELIMIT_ADMIN_TIMEOUT": 1.0,
    # How many recently active subjects the live page index keeps per policy.
    "RATELIMIT_LIVE_INDEX_SIZE": 2000,
    # Subjects are spread over this many shards, each one Redis Cluster slot with its own live index and
    # totals. 1 suits a single server (the operator's reads stay one per policy); on Redis Cluster use a
    # few times the number of masters (a system check warns about 1 there).
    "RATELIMIT_SHARDS": 1,
    # Seconds between two saves of calendar quotas' usage to the database (batched upserts): the most
    # usage a loss of Redis can take away.
    "RATELIMIT_QUOTA_SAVE_SECONDS": 5.0,
    # Dotted path of a view answering denied requests instead of the built-in 429 response.
    "RATELIMIT_DENIED_VIEW": None,
    # Refuse a subject over an enforcing limit from this process's memory until its retry time (no Redis call).
    "RATELIMIT_DENY_CACHE": True,
    # Prometheus metrics (ratelimit_app.metrics): None = on when prometheus_client is installed; False = off.
    "RATELIMIT_METRICS": None,
    # Policies declared in settings, e.g. [{"name": "api", "action": "/api/", "rate": "100/m", "key": "user_or_ip"}]:
    # written to the database as policies from code (see registry/).
    "RATELIMIT_POLICIES": (),
    # "auto": the scripts run as a Redis Functions library (FUNCTION LOAD once, then FCALL) where the
    # server has Functions (Redis >= 7, Valkey), EVALSHA elsewhere; False: always EVALSHA.
    "RATELIMIT_REDIS_FUNCTIONS": "auto",
    # Bytes a process keeps in its caches (script arguments, packed commands, subjects, refusals ...), all
    # of them together: each takes its share (ratelimit_app.lru.BUDGETS), the oldest entries going first.
    "RATELIMIT_CACHE_BYTES": 32 * 2**20,
}




class OutOfRange(ValueError):
    """A value of the setting's kind, outside the values it may take."""


class Kind(NamedTuple):
    """What a setting holds. `expected` says it to a person (system check E021); `read` turns what was
    written (a string from os.environ included) into the value the app uses, or raises TypeError or
    ValueError saying why not."""

    expected: str
    read: Callable[[Any], Any]


WORDS = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
DAY = 86400.0  # the longest interval a seconds setting takes (a timer cannot wait for ever)


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in WORDS:
        return WORDS[value.strip().lower()]
    raise TypeError("not a boolean")


def _number(value: Any, parse: Callable[[Any], Any], types: tuple[type, ...], what: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, *types)):
        raise TypeError(f"not {what}")
    try:
        return parse(value.strip() if isinstance(value, str) else value)
    except ValueError:
        raise TypeError(f"a string that is not {what}") from None
    except OverflowError:  # an int too large for a float
        raise OutOfRange("too large") from None


def seconds(minimum: float, positive: bool = False) -> Kind:
    """Seconds as a number (int, float, or a string of one), from `minimum` (excluded if `positive`) to a day."""
    span = f"above {minimum:g}, up to {DAY:g}" if positive else f"from {minimum:g} to {DAY:g}"

    def read(value: Any) -> float:
        number = _number(value, float, (int, float), "a number")
        if not math.isfinite(number) or number < minimum or positive and number <= minimum or number > DAY:
            raise OutOfRange(f"not {span}")
        return number

    return Kind(f"a number of seconds {span} (a string of one, such as \"1.5\", is read as one)", read)


def whole(low: int, high: int) -> Kind:
    """A whole number (an int, or a string of one) from `low` to `high`."""

    def read(value: Any) -> int:
        number = _number(value, int, (int,), "a whole number")
        if not low <= number <= high:
            raise OutOfRange(f"not from {low} to {high}")
        return number

    return Kind(f"a whole number from {low} to {high} (a string of one, such as \"{high}\", is read as one)", read)


def texts(entries: str, strings: bool = True) -> Kind:
    """A list, tuple or set of `entries` (read as a tuple), or a string of them separated by commas (as
    os.environ gives them); each entry a string when `strings`."""

    def read(value: Any) -> tuple:
        if isinstance(value, str):
            found = tuple(part.strip() for part in value.split(",") if part.strip())
        elif isinstance(value, (list, tuple, set, frozenset)):
            found = tuple(value)
        else:
            raise TypeError("neither a list nor a string")
        odd = [entry for entry in found if strings and not isinstance(entry, str)]
        if odd:
            raise TypeError(f"holds {odd[0]!r}, not a string")
        return found

    return Kind(f"a list or tuple of {entries}, or a string of them separated by commas", read)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def _view(value: Any) -> str | None:
    """None (or "") for the built-in 429, or the dotted path of a callable that imports."""
    if value is None or value == "":
        return None
    path = _text(value)
    try:
        found = import_string(path)
    except Exception as error:  # noqa: BLE001 - whatever importing the project's module raised, said in the check
        raise ValueError(f"does not import ({error})") from None
    if not callable(found):
        raise ValueError("is not a callable")
    return path


def _policies(value: Any) -> tuple:
    """A list or tuple of entries (each checked by E010), None for none."""
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise TypeError("not a list of policies")
    return tuple(value)


def _optional_boolean(value: Any) -> bool | None:
    return None if value is None else _boolean(value)


def _functions(value: Any) -> str | bool:
    """"auto" (True reads as it) or False."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    return "auto" if _boolean(value) else False


BOOLEAN = Kind('True or False (the strings "true"/"false", "yes"/"no", "on"/"off", "1"/"0" are read as such)',
               _boolean)
TEXT = Kind("a string", _text)

# Every setting's kind, one entry per setting of DEFAULTS (a test keeps them together): what system check
# E021 reports a written value against, and how get_setting reads it.
TYPES: dict[str, Kind] = {
    "RATELIMIT_ENABLED": BOOLEAN,
    "RATELIMIT_CACHE": TEXT,
    "RATELIMIT_KEY_PREFIX": TEXT,
    "RATELIMIT_TRUSTED_PROXIES": texts("addresses or networks", strings=False),  # each entry is checked by E003
    "RATELIMIT_IPV4_PREFIX": whole(0, 32),
    "RATELIMIT_IPV6_PREFIX": whole(0, 128),
    "RATELIMIT_PLAIN_HEADERS": texts("header names"),
    "RATELIMIT_FAIL_OPEN": BOOLEAN,
    "RATELIMIT_BREAKER_SECONDS": seconds(0),
    "RATELIMIT_POLICY_RECHECK_SECONDS": seconds(0),
    "RATELIMIT_POLICY_RELOAD_SECONDS": seconds(0),
    "RATELIMIT_ADMIN_TIMEOUT": seconds(0, positive=True),
    "RATELIMIT_LIVE_INDEX_SIZE": whole(1, 1_000_000),
    "RATELIMIT_SHARDS": whole(1, 16384),  # its range is reported by E016 (beside E017: one on a cluster)
    "RATELIMIT_QUOTA_SAVE_SECONDS": seconds(0, positive=True),
    "RATELIMIT_DENIED_VIEW": Kind("None, or the dotted path of a view (a callable) that imports", _view),
    "RATELIMIT_DENY_CACHE": BOOLEAN,
    "RATELIMIT_METRICS": Kind(f"None, or {BOOLEAN.expected}", _optional_boolean),
    "RATELIMIT_POLICIES": Kind("a list or tuple of policies (dictionaries), or None", _policies),
    "RATELIMIT_CACHE_BYTES": whole(0, 2**40),
    "RATELIMIT_REDIS_FUNCTIONS": Kind('"auto" (or True), or False (or "false", "no", "off", "0")', _functions),
}

# A setting read under another library's name when ours is not set: django-ratelimit's cache alias.
FALLBACKS = {"RATELIMIT_CACHE": "RATELIMIT_USE_CACHE"}

_cache: dict[str, Any] = {}


def written(name: str) -> Any:
    """The setting as the project wrote it, its default where it did not."""
    default = getattr(settings, FALLBACKS[name], DEFAULTS[name]) if name in FALLBACKS else DEFAULTS[name]
    return getattr(settings, name, default)


def read_setting(name: str, value: Any) -> Any:
    """`value` read as the setting `name` holds it; TypeError or ValueError (OutOfRange) saying why not."""
    return TYPES[name].read(value)


def get_setting(name: str) -> Any:
    """The setting's value as the app uses it; cached, and forgotten whenever a setting changes."""
    try:
        return _cache[name]
    except KeyError:
        value = _cache[name] = _usable(name)
        return value


def _usable(name: str) -> Any:
    """The written value read by its kind; a value it refuses gives way to the default, with a logged error
    (manage.py check reports it as E021), so that no request and no timer thread fails on it."""
    value = written(name)
    try:
        return read_setting(name, value)
    except (TypeError, ValueError) as error:
        logger.error("ratelimit: %s is %r (%s), not %s: the default %r is used (system check ratelimit_app.E021)",
                     name, value, error, TYPES[name].expected, DEFAULTS[name])
        return DEFAULTS[name]


def forget_settings() -> None:
    _cache.clear()

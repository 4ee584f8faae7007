"""System check of policies' actions against the URLconf (W012): a policy whose action names a URL
name, or a path prefix, that nothing routes never meets a request of the site, and says so nowhere else."""

from __future__ import annotations

import difflib
from typing import Iterable, Iterator, Sequence

from django.core.checks import Tags, Warning, register
from django.urls import URLPattern, URLResolver, get_resolver

from .rows import readable_policies

REGEX_SPECIALS = frozenset(".^$*+?{}[]\\|()")
QUANTIFIERS = frozenset("?*+{")
# the compatibility modules' own actions: their throttles and decorators count them, whatever the routes
COMPAT_ACTIONS = ("drf:", "django-ratelimit:")


@register()
def check_unrouted_declarations(app_configs: object = None, **kwargs: object) -> list:
    """RATELIMIT_POLICIES entries whose action nothing in the URLconf routes (no database needed)."""
    from ..registry.declarations import settings_policies

    return _warnings((policy.name, policy.values["action"]) for policy in settings_policies([]))


@register(Tags.database)
def check_unrouted_rows(app_configs: object = None, databases: Sequence[str] | None = None, **kwargs: object) -> list:
    """The policies made in the admin whose action nothing routes: with `--database` and during migrate."""
    found = []
    for database in databases or ():
        rows = readable_policies(database) or ()
        found += _warnings((row.name, row.action) for row in rows if row.source != "code")
    return found


def _warnings(policies: Iterable[tuple[str, str]]) -> list:
    found = []
    for name, action in policies:
        problem = unrouted(action)
        if problem:
            found.append(Warning(
                f"Policy {name!r} never applies: {problem}.",
                hint="Fix its action (python manage.py ratelimit test GET /some/path/ lists the names a path "
                     "is known by), or delete the policy.",
                obj=name,
                id="ratelimit_app.W012",
            ))
    return found


def unrouted(action: str) -> str | None:
    """Why no request of the URLconf in use can meet `action`, or None when some can (or it cannot be told).

    A path prefix is reported when no URL pattern can match a path that starts with it. A name with a
    colon is a URL name: reported when no route has it. A plain name may be one that code counts with
    hit() or check(): reported only when it is not a route's name but is a letter or two away from one.
    """
    if not action or action == "*" or action.startswith(COMPAT_ACTIONS):
        return None
    try:
        patterns = get_resolver().url_patterns
    except Exception:  # noqa: BLE001 - Django's own check of the URLconf reports why it does not load
        return None
    if action.startswith("/"):
        rest = action[1:]
        if any(_could_match(rest, head, exact) for head, exact in _heads(patterns)):
            return None
        return f"its action is the path prefix {action!r}, and no URL pattern routes a path that starts with it"
    names = _known_names(patterns)
    if action in names:
        return None
    close = difflib.get_close_matches(action, sorted(names), n=1, cutoff=0.8)
    if ":" not in action and not close:
        return None
    said = f"its action is the name {action!r}, which no URL name, throttle_scope or @ratelimit action has"
    return said + (f" (did you mean {close[0]!r}?)" if close else "")


# --- what the URLconf routes ------------------------------------------------------------------


def _heads(patterns: Iterable, head: str = "") -> Iterator[tuple[str, bool]]:
    """Per route, the fixed text every path it matches starts with (without the leading slash), as far
    as it is known, and whether that text is the whole path it matches. A route whose start cannot be
    read yields what comes before it: it counts as matching anything from there."""
    for pattern in patterns:
        text, whole, ends = _literal(pattern.pattern)
        if isinstance(pattern, URLResolver):
            if whole:
                yield from _heads(pattern.url_patterns, head + text)
            else:
                yield head + text, False
        else:
            yield head + text, whole and ends


def _literal(pattern: object) -> tuple[str, bool, bool]:
    """(the fixed start of one pattern, whether that is all of the pattern, whether it matches nothing
    after it). An unknown kind of pattern (a language prefix, a lazy translated route) and an
    unanchored regex have no fixed start."""
    route = getattr(pattern, "_route", None)
    if isinstance(route, str):  # path(): an endpoint matches its whole route, nothing after it
        text = route.split("<", 1)[0]
        return text, text == route, True
    regex = getattr(pattern, "_regex", None)
    if not isinstance(regex, str) or not regex.startswith("^") or "|" in regex:
        return "", False, False
    text = ""
    for position, char in enumerate(regex[1:], 1):
        if char in REGEX_SPECIALS:
            if regex[position:] == "$":
                return text, True, True
            if char in QUANTIFIERS:
                text = text[:-1]  # 'items?' may match 'item'
            return text, False, False
        text += char
    return text, True, False


def _could_match(prefix: str, head: str, exact: bool) -> bool:
    """Whether a path starting with `prefix` can be matched by a route whose paths start with `head`
    (are `head`, when exact)."""
    return head.startswith(prefix) or (not exact and prefix.startswith(head))


def _known_names(patterns: Iterable) -> set[str]:
    """What the doors know requests of the URLconf by: view names (with their namespaces), DRF views'
    throttle_scope, @ratelimit actions; and the actions of policies declared in code (compat throttles)."""
    from .. import registry
    from ..registry.declarations import settings_policies

    names: set[str] = set()
    for view, view_name in _routes(patterns):
        view_class = getattr(view, "cls", None) or getattr(view, "view_class", None)
        names.update(n for n in (view_name, getattr(view_class, "throttle_scope", None)) if isinstance(n, str))
        names.update(getattr(view, "ratelimit_actions", ()))
    from_settings = {policy.name for policy in settings_policies([])}
    names.update(p.values["action"] for p in registry.declared_policies() if p.name not in from_settings)
    return names


def _routes(patterns: Iterable, namespaces: str = "") -> Iterator[tuple[object, str]]:
    """(view, its view name as a resolved request has it) of every route of the URLconf."""
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = f"{namespaces}{pattern.namespace}:" if pattern.namespace else namespaces
            yield from _routes(pattern.url_patterns, inner)
        elif isinstance(pattern, URLPattern):
            yield pattern.callback, namespaces + (pattern.name or _view_path(pattern.callback))


def _view_path(view: object) -> str:
    """The dotted path Django names an unnamed route's view by (ResolverMatch's _func_path)."""
    owner = getattr(view, "view_class", view)
    if not hasattr(owner, "__name__"):
        owner = owner.__class__
    return f"{owner.__module__}.{owner.__name__}"

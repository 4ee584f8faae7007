"""What an operator does, for the admin's views and the `ratelimit` command alike: the live snapshot
of a policy, its trend, resetting subjects, finding a subject from what a person typed."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

from . import engine, live, quotas
from .engine import RedisUnavailable, client, prune
from .live import PolicyActivity, policy_activity, policy_trends  # noqa: F401  (the policy list's columns)
from .loading import compile_policy
from .models import Policy
from .subjects import SubjectTextError, subject_from_text
from .values import CompiledPolicy

LIVE_ROWS = 100
SUBJECT_KEY = re.compile(r"[0-9a-f]{16}")  # what values.Subject.key holds


def reset_all(policy: Policy) -> None:
    """Start every subject of the policy afresh: counters carry the generation, old ones just expire. A
    quota's saved usage of the current period goes too (the new counters would start from it), and what
    workers counted before and save after is dropped by its generation."""
    policy.generation += 1
    policy.save(update_fields=["generation", "updated"])
    quotas.forget_current(policy, engine.server_clock.now_ms())  # Redis's day


def reset_subject(policy: Policy, text: str) -> tuple[str, bool]:
    """Start one subject afresh (a key from the live page, or `ip:203.0.113.7` as typed): the subject
    as the server knows it, and whether it had counts. ValidationError when the text names none."""
    compiled = compile_policy(policy)
    subject_key, typed = subject_key_of(compiled, text.strip())
    if compiled.plugin is not None:
        shown_as = "" if typed == subject_key else typed  # a key as the live page sends it: the saved row's stays
        quotas.keep_before_reset(compiled, subject_key, shown_as, engine.server_clock.now_ms())
    shown = live.reset_subjects(compiled, [subject_key])
    return " / ".join(shown) or typed, bool(shown)


def live_snapshot(policy: Policy, rows: int = LIVE_ROWS) -> tuple[dict, int]:
    """The live page's data as its JSON answers it (the policy, its subjects with their counts, the
    totals allowed and denied, how many subjects are active, shown and blocked), and the HTTP status."""
    data: dict = {
        "policy": {
            "id": policy.pk, "name": policy.name, "action": policy.action, "limit": policy.limit,
            "window": policy.window, "strategy": policy.strategy, "key": policy.key, "mode": policy.mode,
            "unit": policy.unit,
        },
        "subjects": [],
        "totals": {"allowed": 0, "denied": 0},
        "active": 0,
        "shown": 0,
        "blocked": 0,
    }
    try:
        usage = live.live_usage(compile_policy(policy), rows=rows)
    except ValidationError as error:
        return {**data, "error": f"This policy is invalid and not enforced: {'; '.join(error.messages)}"}, 200
    except RedisUnavailable as error:
        return {**data, "error": f"Redis is unreachable, live usage cannot be shown: {error}"}, 503
    data["subjects"] = [
        {
            "subject": s.display, "key": s.key, "count": s.count, "limit": s.limit,
            "remaining": max(s.limit - s.count, 0), "reset_in": round(s.reset_in, 1),
            "blocked": s.count >= s.limit, "overridden": s.overridden, "plan": s.plan or None,
            # beyond the limit once a request settled more than its estimate: refused until back under it
            "overage": max(s.count - s.limit, 0),
        }
        for s in usage.subjects
    ]
    data["totals"] = {"allowed": usage.allowed, "denied": usage.denied}
    # the listed subjects are all the active ones unless the index was full: then the totals say how many
    data["shown"] = usage.shown
    data["active"] = usage.active if usage.index_full else usage.shown
    data["blocked"] = usage.blocked
    return data, 200


def subject_key_of(policy: CompiledPolicy, text: str) -> tuple[str, str]:
    """The subject key and how to show it, from a key as the live page sends it or a subject as a
    person writes it (ip:203.0.113.7, user:alice); ValidationError saying why when it is neither."""
    if SUBJECT_KEY.fullmatch(text):
        return text, text
    try:
        subject = subject_from_text(policy.key_spec, text)
    except SubjectTextError as error:
        raise ValidationError(str(error)) from None
    return subject.key, subject.display



def subject_key_for(policy_name: str, text: str) -> str:
    """subject_key_of() for the policy called `policy_name`; ValueError saying what is wrong."""
    row = Policy.objects.filter(name=policy_name).first()
    if row is None:
        raise ValueError(f"There is no policy {policy_name!r}.")
    try:
        return subject_key_of(compile_policy(row), text.strip())[0]
    except ValidationError as error:
        raise ValueError(" ".join(error.messages)) from None


def trend_data(policy: Policy) -> list[dict]:
    """Allowed and denied per window, oldest first, for the live page's chart ([] when Redis cannot say)."""
    try:
        return [point._asdict() for point in live.policy_trend(policy)]
    except RedisUnavailable:
        return []


def prune_libraries() -> tuple[list[str], list[str]]:
    """Delete the app's Redis Functions libraries that no worker runs (never this version's):
    -> (deleted, kept)."""
    return prune(client())


def own_library() -> str:
    """The name of this version's Functions library."""
    return engine.scripts.library_name

"""The operator's side of Redis: what the live page and the policy list read, and resets.

Kept apart from the request path (engine.py): these reads go through the admin's own client
(admin_connection.py), in bounded batches, so watching never holds Redis for long. `usage` lists the
subjects counted now; `activity` reads a policy's totals (its window, its trend); `resets` forgets counts.
"""

from __future__ import annotations

from .activity import (
    PolicyActivity,
    TrendPoint,
    policy_activity,
    policy_totals,
    policy_trend,
    policy_trends,
    trend_windows,
)
from .resets import reset_subjects
from .usage import FIELD_BUDGET, LiveUsage, SubjectUsage, live_usage

__all__ = [
    "FIELD_BUDGET",
    "LiveUsage",
    "PolicyActivity",
    "SubjectUsage",
    "TrendPoint",
    "live_usage",
    "policy_activity",
    "policy_totals",
    "policy_trend",
    "policy_trends",
    "reset_subjects",
    "trend_windows",
]

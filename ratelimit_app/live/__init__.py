"""The operator's reads of Redis, through the admin's own client in bounded batches so watching never
holds Redis for long: `usage` (the live page's subjects), `activity` (a policy's totals, its trend), `resets`.
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

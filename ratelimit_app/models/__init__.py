"""The models: Policy (one named rate limit), ActionCost (the units a request of an action takes),
Override (a different limit for some subjects), Plan (limits over several policies for the subjects
assigned to it) and QuotaUsage (what calendar quotas counted). One module per concern; every name is
imported from here."""

from __future__ import annotations

from .fields import MAX_COST, LimitField, StrategyField, limit_field
from .overrides import MatchKind, Override, SubjectMatch, exemption_errors
from .plans import Plan, PlanAssignment, PlanLimit
from .policy import OPTION_NAMES, ActionCost, Mode, Policy, Source, Strategy, actions_overlap, never_admitted
from .quotas import QuotaUsage
from .validators import (
    HTTP_METHODS,
    canonical_network,
    parse_methods,
    validate_action,
    validate_key_spec,
    validate_methods,
    validate_network,
    validate_time_zone,
    validate_unit,
)

__all__ = [
    "HTTP_METHODS", "MAX_COST", "OPTION_NAMES", "ActionCost", "LimitField", "MatchKind", "Mode", "Override",
    "Plan", "PlanAssignment", "PlanLimit", "Policy", "QuotaUsage", "Source", "Strategy", "StrategyField",
    "SubjectMatch", "actions_overlap", "canonical_network", "exemption_errors", "limit_field", "never_admitted",
    "parse_methods", "validate_action", "validate_key_spec", "validate_methods", "validate_network",
    "validate_time_zone", "validate_unit",
]

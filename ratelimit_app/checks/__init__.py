"""System checks: misconfiguration is reported by `manage.py check`, not by a 500 later. Importing this
package registers them all (apps.py does at start-up); one module per concern."""

from __future__ import annotations

from .cache import check_cache, check_retries, check_shards, check_timeouts
from .costs import check_code_costs, check_code_costs_against_rows
from .policies import check_middleware_order, check_policies, check_subject_rows
from .environment import check_metrics, check_trusted_proxies
from .routes import check_unrouted_declarations, check_unrouted_rows
from .server import check_eviction
from .settings import check_settings

__all__ = [
    "check_cache", "check_code_costs", "check_code_costs_against_rows", "check_eviction", "check_metrics",
    "check_middleware_order", "check_policies", "check_retries", "check_settings", "check_shards",
    "check_subject_rows", "check_timeouts", "check_trusted_proxies", "check_unrouted_declarations",
    "check_unrouted_rows",
]

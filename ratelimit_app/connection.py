"""Kept for the paths users write in settings and monitoring: CONNECTION_FACTORY, breaker.failures, outage.requests."""
from .engine import breaker  # noqa: F401
from .engine import ClusterConnectionFactory  # noqa: F401
from .events import outage  # noqa: F401

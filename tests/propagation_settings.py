"""The demo site with its safety-net reload of the policy index out of the way (a day): a policy
change can then reach a worker only through the policy version in Redis."""

from project.settings import *  # noqa: F403

RATELIMIT_POLICY_RELOAD_SECONDS = 24 * 3600

"""The operator's side in the Django admin: registering the app's models, each in a module of its own.

`policy` is the policy admin; its extra pages are views beside it (`pages`: revert, tester, changes;
`live_page`: the live page and resets). `overrides`, `plans`, `costs` and `quota_usage` admin the rest.
"""

from . import costs, overrides, plans, policy, quota_usage  # noqa: F401 - each registers its ModelAdmin

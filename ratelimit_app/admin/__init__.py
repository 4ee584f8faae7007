"""The operator's side in the Django admin: `policy` (the policy admin) with its extra pages as views beside
it (`pages`, `live_page`), and the admins of `overrides`, `plans`, `costs` and `quota_usage`.
"""

from . import costs, overrides, plans, policy, quota_usage  # noqa: F401 - each registers its ModelAdmin

"""Policy changes, from the admin, the ORM or a fixture, invalidate every worker's index."""

from __future__ import annotations

from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from .models import Policy
from .policies import policies_changed


@receiver(post_save, sender=Policy, dispatch_uid="ratelimit_policy_saved")
@receiver(post_delete, sender=Policy, dispatch_uid="ratelimit_policy_deleted")
def policy_changed(**kwargs: object) -> None:
    policies_changed()

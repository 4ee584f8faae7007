"""Changes of policies, overrides, action costs, plans (their limits and assignments) and group
membership, from the admin, the ORM or a fixture, invalidate every worker's index."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db.models.signals import m2m_changed, post_delete, post_save
from django.dispatch import receiver

from .models import ActionCost, Override, Plan, PlanAssignment, PlanLimit, Policy
from .policies import policies_changed


@receiver(post_save, sender=Policy, dispatch_uid="ratelimit_policy_saved")
@receiver(post_delete, sender=Policy, dispatch_uid="ratelimit_policy_deleted")
@receiver(post_save, sender=Override, dispatch_uid="ratelimit_override_saved")
@receiver(post_delete, sender=Override, dispatch_uid="ratelimit_override_deleted")
@receiver(post_save, sender=ActionCost, dispatch_uid="ratelimit_action_cost_saved")
@receiver(post_delete, sender=ActionCost, dispatch_uid="ratelimit_action_cost_deleted")
@receiver(post_save, sender=Plan, dispatch_uid="ratelimit_plan_saved")
@receiver(post_delete, sender=Plan, dispatch_uid="ratelimit_plan_deleted")
@receiver(post_save, sender=PlanLimit, dispatch_uid="ratelimit_plan_limit_saved")
@receiver(post_delete, sender=PlanLimit, dispatch_uid="ratelimit_plan_limit_deleted")
@receiver(post_save, sender=PlanAssignment, dispatch_uid="ratelimit_plan_assignment_saved")
@receiver(post_delete, sender=PlanAssignment, dispatch_uid="ratelimit_plan_assignment_deleted")
@receiver(m2m_changed, sender=get_user_model().groups.through, dispatch_uid="ratelimit_group_members")
def policy_changed(**kwargs: object) -> None:
    policies_changed()

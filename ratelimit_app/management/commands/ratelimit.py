"""manage.py ratelimit status | top POLICY | reset POLICY SUBJECT | test METHOD PATH | prune: the live page,
the policy tester and the server's upkeep on a terminal."""

from __future__ import annotations

import json
import logging
import time

import redis

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from ratelimit_app import engine, operations
from ratelimit_app.checks.server import eviction_warning, evictions
from ratelimit_app.engine import RedisUnavailable
from ratelimit_app.models import Mode, Policy
from ratelimit_app.rates import figure, human_limit, human_per
from ratelimit_app.values import REQUESTS
from ratelimit_app.tester import TesterForm

logger = logging.getLogger("ratelimit_app")


class Command(BaseCommand):
    help = "Watch and operate rate limits: status, top POLICY, reset POLICY SUBJECT, test METHOD PATH, prune."

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{status,top,reset,test,prune}")
        status = actions.add_parser("status", help="Every policy with its active subjects and denials this window.")
        status.add_argument("--json", action="store_true", dest="as_json", help="Print JSON instead of a table.")
        top = actions.add_parser("top", help="The busiest subjects of a policy in the current window.")
        top.add_argument("policy", help="The policy's name (or id).")
        top.add_argument("--limit", type=int, default=20, help="How many subjects to show (default 20, at most 1000).")
        top.add_argument(
            "--json", action="store_true", dest="as_json", help="Print the live page's JSON instead of a table."
        )
        reset = actions.add_parser("reset", help="Forget the counts of one subject of a policy, or of all (--all).")
        reset.add_argument("policy", help="The policy's name (or id).")
        reset.add_argument(
            "subject", nargs="?",
            help="As a person writes it: ip:203.0.113.7, user:42, user:alice, header:X-Api-Key=..., "
            "or the 16-hex-digit key the live page shows.",
        )
        reset.add_argument("--all", action="store_true", help="Reset every subject of the policy.")
        test = actions.add_parser("test", help="What the policies would decide for a request, counting nothing.")
        test.add_argument("method", help="GET, POST, ...")
        test.add_argument("path", help="The request's path, e.g. /api/items/.")
        test.add_argument("--user", default="", help="Username of the requesting user (anonymous without).")
        test.add_argument("--ip", default="203.0.113.7", help="The client's address (default 203.0.113.7).")
        test.add_argument(
            "--header", action="append", default=[], metavar="'NAME: VALUE'", help="A request header; repeat for more."
        )
        actions.add_parser(
            "prune", help="Delete the Redis Functions libraries of other versions of this app that no worker runs."
        )

    def handle(self, *args, action: str, **options) -> None:
        getattr(self, f"handle_{action}")(**options)

    # --- status -----------------------------------------------------------------------------

    def handle_status(self, *, as_json: bool, **options) -> None:
        rows = list(Policy.objects.order_by("name"))
        try:
            activity = operations.policy_activity([row for row in rows if row.window and row.window > 0])
            error = None
        except RedisUnavailable as unavailable:
            activity, error = {}, f"Redis is unreachable, activity is not shown: {unavailable}"
        if as_json:
            self._print_json([_status_entry(row, activity.get(row.pk)) for row in rows])
        else:
            table = [("policy", "action", "limit", "strategy", "key", "mode", "enabled", "active", "denied")]
            for row in rows:
                now = activity.get(row.pk)
                would = " (would)" if now is not None and row.mode == Mode.SHADOW and now.denied else ""
                table.append((
                    row.name, row.action, _limit(row), row.strategy, row.key, row.mode,
                    "yes" if row.enabled else "no",
                    "?" if now is None else str(now.active),
                    "?" if now is None else f"{now.denied}{would}",
                ))
            self._print_table(table, numeric=(7, 8))
            if not rows:
                self.stdout.write("No policy yet: add one in the admin.")
            if error is None:
                self._print_workers()
        if error:
            raise CommandError(error)
        for eviction in evictions():  # on stderr: --json's output stays the policies' list
            warning = eviction_warning(eviction)
            self.stderr.write(self.style.WARNING(f"{warning.id}: {warning.msg}\n  HINT: {warning.hint}"))

    def _print_workers(self) -> None:
        """How old the policies each worker enforces are, and which workers cannot read the database."""
        try:
            reports = engine.worker_reports()
        except RedisUnavailable:
            return
        if not reports:
            return
        now = time.time()
        oldest = max(now - report.loaded_at for report in reports)
        self.stdout.write(f"Policies in force on {len(reports)} worker(s), loaded at most {oldest:.0f} s ago.")
        for report in reports:
            if report.error:
                self.stdout.write(f"  {report.worker}: the database cannot be read ({report.error}); the policies "
                                  f"loaded {now - report.loaded_at:.0f} s ago stay in force.")

    # --- top --------------------------------------------------------------------------------

    def handle_top(self, *, policy: str, limit: int, as_json: bool, **options) -> None:
        if not 1 <= limit <= 1000:
            raise CommandError("--limit must be between 1 and 1000.")
        row = _policy(policy)
        data, _ = operations.live_snapshot(row, rows=limit)
        if "error" in data:
            raise CommandError(data["error"])
        if as_json:
            self._print_json(data)
            return
        verb = "would have denied" if row.mode == Mode.SHADOW else "denied"
        totals = data["totals"]
        self.stdout.write(
            f"{row.name}: {_limit(row)}, {row.strategy} per {row.key}, {row.mode}. "
            f"{data['active']} active, {data['blocked']} at the limit; this window {totals['allowed']} allowed, "
            f"{totals['denied']} {verb}."
        )
        if not data["subjects"]:
            self.stdout.write("No subject has used this policy in the current window.")
            return
        unit = row.unit
        table = [("subject", "count" if unit == REQUESTS else unit, "limit", "remaining", "reset in", "")]
        for s in data["subjects"]:
            blocked = ("would be denied" if row.mode == Mode.SHADOW else "blocked") if s["blocked"] else ""
            if s["overage"]:  # a settle took it past its limit: refused until it is back under
                blocked += f", {figure(s['overage'], unit)} over"
            limit_shown = figure(s["limit"], unit) + (
                f" (plan {s['plan']})" if s["plan"] else "*" if s["overridden"] else ""
            )
            reset_in = f"{s['reset_in']:.1f} s"
            table.append((s["subject"], figure(s["count"], unit), limit_shown, figure(s["remaining"], unit), reset_in,
                          blocked))
        self._print_table(table, numeric=(1, 2, 3, 4))
        if data["active"] > len(data["subjects"]):
            shown = f"top {len(data['subjects'])} of {data['active']}"
            self.stdout.write(f"({shown}; * = an override's limit, (plan x) = plan x's)")

    # --- reset ------------------------------------------------------------------------------

    def handle_reset(self, *, policy: str, subject: str | None, all: bool, **options) -> None:
        row = _policy(policy)
        if all == bool(subject):
            raise CommandError("Give either a SUBJECT (e.g. ip:203.0.113.7) or --all, not both.")
        if all:
            operations.reset_all(row)
            self._done(f"Counts of every subject reset for {row.name}.")
            return
        try:
            shown, existed = operations.reset_subject(row, subject)
        except ValidationError as error:
            raise CommandError(f"Nothing was reset: {' '.join(error.messages)}") from None
        except RedisUnavailable as error:
            raise CommandError(f"Nothing was reset: Redis is unreachable ({error}).") from None
        if existed:
            self._done(f"Counts of subject {shown} reset for {row.name}.")
        else:
            self.stdout.write(f"Subject {shown} had no count under {row.name}: nothing to reset.")

    # --- prune ------------------------------------------------------------------------------

    def handle_prune(self, **options) -> None:
        try:
            deleted, kept = operations.prune_libraries()
        except redis.exceptions.NoPermissionError as error:
            raise CommandError(f"Prune stopped: the Redis user lacks a permission it needs (SCAN, FUNCTION LIST, "
                               f"FUNCTION DELETE): {error}.") from None
        except redis.RedisError as error:
            raise CommandError(f"Nothing was pruned: Redis is unreachable ({error}).") from None
        for name in deleted:
            self.stdout.write(f"Deleted {name}: no worker runs it.")
        for name in kept:
            why = "this version" if name == operations.own_library() else "a worker runs it"
            self.stdout.write(f"Kept {name}: {why}.")
        if not deleted and not kept:
            self.stdout.write("No library of this app on the server (it runs the scripts without Functions).")

    # --- test -------------------------------------------------------------------------------

    def handle_test(self, *, method: str, path: str, user: str, ip: str, header: list[str], **options) -> None:
        described = {"method": method.upper(), "path": path, "username": user, "ip": ip, "headers": "\n".join(header)}
        form = TesterForm(described)
        if not form.is_valid():
            problems = " ".join(f"{name}: {' '.join(messages)}" for name, messages in form.errors.items())
            raise CommandError(f"Cannot test this request: {problems}")
        results = form.explain()
        names = ", ".join(name for name in results.names if name) or "none (only '*' and path prefixes match)"
        self.stdout.write(f"{method.upper()} {path} is known by the names: {names}")
        self.stdout.write(results.cost.text)
        if results.metered:
            self.stdout.write(results.metered)
        assignment = results.assignment
        if assignment is not None:
            until = f", until {assignment.expires_at.isoformat()}" if assignment.expires_at else ""
            self.stdout.write(f"Plan: {assignment.plan.name} (assigned to {assignment.description}{until})")
        else:
            self.stdout.write("Plan: none")
        if not results.explanations:
            self.stdout.write("No enabled policy matches this request: it is not limited.")
        table = [("policy", "mode", "action", "subject", "override", "limit from", "limit in effect", "count", "would")]
        for item in results.explanations:
            table.append(_explanation_row(item))
        if results.explanations:
            self._print_table(table)
            denied = any(item.decision and not item.decision.allowed for item in results.explanations)
            self.stdout.write("The request would be denied (429)." if denied else "The request would be allowed.")
        if results.error:
            raise CommandError(results.error)

    # --- output -----------------------------------------------------------------------------

    def _done(self, message: str) -> None:
        """A change made from the command line: said, and logged (the admin's log needs a user)."""
        logger.info("ratelimit: %s (manage.py ratelimit)", message)
        self.stdout.write(message)

    def _print_table(self, rows: list[tuple[str, ...]], numeric: tuple[int, ...] = ()) -> None:
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            pairs = enumerate(zip(row, widths))
            cells = [cell.rjust(width) if i in numeric else cell.ljust(width) for i, (cell, width) in pairs]
            self.stdout.write("  ".join(cells).rstrip())

    def _print_json(self, data: object) -> None:
        self.stdout.write(json.dumps(data, indent=2))


def _policy(name: str) -> Policy:
    """The policy of that name (or id); CommandError naming the existing ones otherwise."""
    row = Policy.objects.filter(name=name).first()
    if row is None and name.isdigit():
        row = Policy.objects.filter(pk=int(name)).first()
    if row is None:
        known = ", ".join(Policy.objects.order_by("name").values_list("name", flat=True)[:30]) or "none yet"
        raise CommandError(f"No policy named {name!r}. Policies: {known}.")
    return row


def _status_entry(row: Policy, activity: operations.PolicyActivity | None) -> dict:
    entry = {
        "name": row.name, "action": row.action, "limit": row.limit, "window": row.window, "strategy": row.strategy,
        "key": row.key, "mode": row.mode, "enabled": row.enabled, "unit": row.unit,
    }
    if activity is not None:
        entry.update(active=activity.active, allowed=activity.allowed, denied=activity.denied)
    return entry


def _limit(row: Policy) -> str:
    """'100 / 1 min', '10,000,000 tokens / calendar month (UTC)'."""
    return human_limit(row.limit, row.unit, _per(row))


def _per(row: Policy) -> str:
    """A policy row's window, or its calendar period in its zone (blank: the site's)."""
    return human_per(row.window, row.period, row.time_zone or settings.TIME_ZONE)


def _explanation_row(item) -> tuple[str, ...]:
    """One line of the tester's answer, worded as the admin's tester page words it."""
    policy, planned = item.policy, item.planned
    named = (policy.name, policy.mode, policy.action)
    if planned is None:
        return (*named, "-", "-", "-", "-", "-", item.would)
    override = planned.override.description if planned.override else "none"
    return (*named, planned.subject.display, override, item.limit_from, item.limit_text, item.count_text, item.would)

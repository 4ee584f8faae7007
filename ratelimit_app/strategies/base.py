"""What every strategy tells the rest of the app; a strategy module overrides what differs for it."""

from __future__ import annotations

from importlib import resources
from typing import ClassVar

TOTALS_BUCKETS = 60  # at most this many buckets in a policy's totals


class Strategy:
    """One way of counting: its Python half (this class) beside its Lua half (lua/<name>.lua)."""

    name: ClassVar[str]  # as stored in Policy.strategy, and the Lua table's name
    label: ClassVar[str]  # shown in the admin's choices
    help: ClassVar[str]  # one sentence for the admin's help text
    letter: ClassVar[str]  # in counter keys: a change of strategy starts fresh counters
    order: ClassVar[int]  # its place among the choices
    default: ClassVar[bool] = False  # the strategy of a policy that names none
    options: ClassVar[dict[str, str]] = {}  # the policy fields only this strategy reads, with their help
    notes: ClassVar[dict[str, str]] = {}  # what a field every strategy reads (limit, window) means for this one
    live_per_key: ClassVar[bool] = False  # the live page sends each subject's limit with its key
    # a request keeps what it took until its response is done, when the doors give it back (the Lua
    # half then has `release`)
    holds: ClassVar[bool] = False
    # the largest cost one request may take (None: any): a strategy writing a member per unit bounds a
    # request's work in Redis, and a larger cost never fits (scripts.py hands the figure to the Lua half)
    most: ClassVar[int | None] = None
    # its count may move by any number of units after a request (a unit metered after the response:
    # tokens, content-bytes: it defines `settling`); when not, `unit_refusal` says why, as the form, the
    # check and the import show it
    counts_units: ClassVar[bool] = False
    unit_refusal: ClassVar[str] = "it does not say how a settle moves its counter (its `settling`)"
    # its count starts afresh at each window's edge: the live page says "this window", not "in the last ..."
    whole_windows: ClassVar[bool] = False
    counts_like: ClassVar[tuple[str, ...]] = ()  # libraries whose counting it reproduces, for their compat layers
    # where the test deciding it against a reference model in plain Python is, "tests/<file>.py::<name>"
    # (the registry refuses a strategy that declares none: its exactness would be checked by nothing)
    reference: ClassVar[str] = ""

    @property
    def lua(self) -> str:
        return f"{self.name}.lua"

    def script(self) -> str:
        """The Lua half's source (lua/<name>.lua), as the scripts assemble it."""
        return resources.files("ratelimit_app").joinpath("lua", self.lua).read_text(encoding="utf-8")

    def clean(self, row) -> None:
        """Raise ValidationError for values of `row` (a Policy) this strategy cannot count with."""

    def bucket_ms(self, row) -> int:
        """The figure the Lua half reads as `bucket` in a policy's terms."""
        return row.window * 1000

    def burst(self, row) -> int | None:
        """Requests allowed at once (None: the limit)."""
        return None

    def shape(self, row, bucket_ms: int) -> str:
        """The part of the counter key that a change of the counting (window, buckets) must change."""
        return f"{self.letter}{row.window}"

    def totals_bucket_ms(self, window_ms: int, bucket_ms: int) -> int:
        """The bucket of a policy's totals: the window in at most 60 steps (a window in ms always has
        40 or 50 among its divisors), so a read of the totals stays short."""
        return next(window_ms // count for count in range(TOTALS_BUCKETS, 0, -1) if window_ms % count == 0)

    def settling(self, policy, limit: int, at_ms: int) -> tuple[str, int, int]:
        """How lua/settle.lua moves a counter of it charged at `at_ms` (Redis's clock) under `limit`, for a
        request that used more or less than its estimate: (its counter's layout, the window, period or
        bucket charged, a figure the layout reads). Only a strategy that `counts_units` is asked."""
        raise NotImplementedError

    def live_batch(self, policy, batch: int, field_budget: int) -> int:
        """How many counters one read of the live page takes, at worst within its budget."""
        return batch

    # --- what the engine asks at each decision of a strategy that is `asked` (engine/arguments.py, verdicts.py)
    # Its terms move with the clock, its window ends by its own arithmetic, and its counts are kept beyond
    # Redis: the engine hands each to hooks.counted, and asks hooks.saved_usage for a counter the Lua half
    # reports absent (retry ABSENT, contract.lua). The others' terms are made once per subject.
    asked: ClassVar[bool] = False

    def period_kind(self, row) -> tuple[str, str]:
        """The calendar period a policy of it counts and the time zone its days begin in ('', '': none)."""
        return "", ""

    def terms(self, policy, now_ms: int, seed: tuple[int, int] | None) -> str:
        """What follows a check's terms in a call at `now_ms`, with `seed` (the start of the span in ms, the
        usage saved) when the engine asks again after the Lua half said the counter was absent."""
        return ""

    def span(self, policy, at_ms: int) -> tuple[int, int]:
        """The (start, end) in ms of the span its counter counts that contains `at_ms`."""
        start = at_ms - at_ms % policy.window_ms
        return start, start + policy.window_ms

    def counts_over(self, row) -> str | None:
        """What a limit of it counts over when that is no window of seconds, as the admin's list shows it."""
        return None

    def starts_again(self, policy, now_ms: int) -> int | None:
        """When (ms) its count starts again, used or not (a calendar period's end); None: as its units leave."""
        return None

    def emptied(self, policy, now_ms: int) -> tuple[str, int] | None:
        """What a reset of a subject writes in its counter, and when that ends (ms); None: it deletes it."""
        return None

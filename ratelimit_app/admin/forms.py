"""The policy admin's forms: the list's editable row, and the change form with its `rate` shorthand."""

from __future__ import annotations

from django import forms
from django.utils.html import format_html, format_html_join

from .. import strategies
from ..models import Mode
from ..periods import PERIODS
from ..rates import EXAMPLES, not_a_period, parse_quota, parse_rate
from ..values import CONTENT_BYTES, REQUESTS

# offered by the unit field's list; any other short name is a unit the view settles
UNITS = (
    (REQUESTS, "each request's cost, known before the view (the default)"),
    (CONTENT_BYTES, "the bytes of each response, counted by the app"),
    ("tokens", "what the view settles: ratelimit_app.settle(request, tokens=...)"),
    ("credits", "what the view settles: ratelimit_app.settle(request, credits=...)"),
)


class UnitInput(forms.TextInput):
    """A text input offering the usual units (a datalist): the browser suggests them, any other name is typed."""

    def __init__(self, attrs=None) -> None:
        super().__init__({"list": "rl-units", "autocomplete": "off", **(attrs or {})})

    def render(self, name, value, attrs=None, renderer=None) -> str:
        options = format_html_join("", '<option value="{}">{}</option>', UNITS)
        field = super().render(name, value, attrs, renderer)
        return format_html('{}<datalist id="rl-units">{}</datalist>', field, options)


class PolicyListForm(forms.ModelForm):
    """The list's editable row: the mode shown by its short name, so the columns fit beside it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "mode" in self.fields:
            self.fields["mode"].choices = [(mode, mode) for mode in Mode.values]


class PolicyForm(forms.ModelForm):
    """The change form, with a `rate` field: '100/m' fills the limit and the window in one go."""

    class Meta:
        widgets = {"unit": UnitInput()}

    rate = forms.CharField(
        label="rate",
        required=False,
        help_text=(
            f"Optional shorthand for the limit and the window, {EXAMPLES}; or a calendar quota, e.g. 10000/month, "
            "500/week, 1000/calendar-day (1000/day is a window of 86,400 seconds). When given, it wins over both."
        ),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        for field in ("limit", "window"):  # the rate may stand in for them
            if field in self.fields and "rate" in self.fields:
                self.fields[field].required = False
        if "unit" in self.fields:  # left blank: requests, what every policy counted before units
            self.fields["unit"].required = False

    def clean_unit(self) -> str:
        return self.cleaned_data["unit"].strip() or REQUESTS

    def clean(self) -> dict:
        data = super().clean()
        rate = (data.get("rate") or "").strip()
        quota = parse_quota(rate)
        if quota:  # the calendar quota strategy counts it
            data["limit"], data["period"] = quota
            data["window"], data["strategy"] = PERIODS[quota[1]], strategies.calendar()
            for field in ("limit", "window", "period", "strategy"):
                self.errors.pop(field, None)
        elif rate:
            try:
                data["limit"], data["window"] = parse_rate(rate)
            except ValueError as error:
                self.add_error("rate", str(error))
                return data
            self.errors.pop("limit", None)
            self.errors.pop("window", None)
            if data.get("strategy") == strategies.calendar():  # it would set the window from the period
                self.add_error("rate", not_a_period(rate))
            if data["limit"] < 1:
                self.add_error("rate", "The limit must be at least 1 request per window.")
        else:
            for field in ("limit", "window"):
                if field == "window" and data.get("strategy") == strategies.calendar():
                    continue  # the period sets it
                if field in self.fields and data.get(field) is None and field not in self.errors:
                    self.add_error(field, "Give a value here, or a rate such as 100/m.")
        return data

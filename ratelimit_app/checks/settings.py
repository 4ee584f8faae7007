"""System check of every setting against its kind (conf.TYPES): a value the app cannot read is reported
here, not found out by a request or a timer thread."""

from __future__ import annotations

from django.core.checks import Error, register

from ..conf import TYPES, OutOfRange, written

# settings whose range another check reports, with what the range is for
RANGE_CHECKED_ELSEWHERE = {"RATELIMIT_SHARDS"}  # E016


@register()
def check_settings(app_configs: object = None, **kwargs: object) -> list:
    found = []
    for name, kind in TYPES.items():
        value = written(name)
        try:
            kind.read(value)
        except OutOfRange:
            if name not in RANGE_CHECKED_ELSEWHERE:
                found.append(_refused(name, value, "out of range", kind.expected))
        except (TypeError, ValueError) as error:
            found.append(_refused(name, value, str(error), kind.expected))
    return found


def _refused(name: str, value: object, why: str, expected: str) -> Error:
    return Error(
        f"{name} is {value!r} ({why}): it must be {expected}.",
        hint="Until it is fixed, the app uses the setting's default (see the settings reference).",
        id="ratelimit_app.E021",
    )

"""System checks of what surrounds the app: the proxies in front of it, the metrics library."""

from __future__ import annotations

from django.core.checks import Error, Warning, register

from ..conf import get_setting


@register()
def check_trusted_proxies(app_configs: object = None, **kwargs: object) -> list:
    from ..subjects import invalid_trusted_proxies

    invalid = invalid_trusted_proxies()
    if not invalid:
        return []
    return [
        Error(
            f"RATELIMIT_TRUSTED_PROXIES holds {', '.join(invalid)}, neither an address, a network nor 'unix': "
            "migrate and runserver stop until it is fixed (where checks do not run, such as under gunicorn, it "
            "is skipped and the other entries are used).",
            hint="Use addresses or networks ('10.0.0.1', '10.0.0.0/8'), and 'unix' for a proxy talking to "
            "this server through a unix socket.",
            id="ratelimit_app.E003",
        )
    ]


@register()
def check_metrics(app_configs: object = None, **kwargs: object) -> list:
    from .. import metrics

    if get_setting("RATELIMIT_METRICS") and metrics.prometheus_client is None:
        return [
            Warning(
                "RATELIMIT_METRICS is True but prometheus_client is not installed: no metric is recorded.",
                hint="pip install prometheus_client, or remove RATELIMIT_METRICS.",
                id="ratelimit_app.W005",
            )
        ]
    return []

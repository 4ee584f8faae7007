"""The site as a WSGI server runs it, with the gap between a response's last byte and its close (the
server's bookkeeping, a busy thread) made wide: a client has the answer well before it is closed."""

from __future__ import annotations

import time

from django.core.wsgi import get_wsgi_application

_django = get_wsgi_application()


def application(environ, start_response):
    return _ClosedLate(_django(environ, start_response))


class _ClosedLate:
    def __init__(self, body) -> None:
        self.body = body

    def __iter__(self):
        return iter(self.body)

    def close(self) -> None:
        time.sleep(0.3)
        self.body.close()

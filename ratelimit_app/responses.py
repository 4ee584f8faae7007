"""The answers to a request that is refused: 429 over a limit, 503 when Redis is down and fail-closed."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.utils.module_loading import import_string

from . import headers
from .conf import get_setting
from .limiter import RequestState
from .rates import amount, quantity
from .subjects import http_request
from .values import REQUESTS, Decision

UNAVAILABLE_RETRY_AFTER = 1
UNAVAILABLE_MESSAGE = "Rate limiting is unavailable. Retry shortly."  # true under fail open too (a view let it through)
JSON, TEXT = "application/json", "text/plain"
REFUSAL_MARK = "ratelimit_refusal"


def wants_json(request, json_api: bool = False) -> bool:
    """JSON when the client prefers it; on a JSON API (a DRF view) also when it accepts anything."""
    request = http_request(request)
    if "json" in request.META.get("CONTENT_TYPE", "") and not request.META.get("HTTP_ACCEPT"):
        return True
    return request.get_preferred_type([JSON, TEXT] if json_api else [TEXT, JSON]) == JSON


def refusal(request, state: RequestState | None) -> HttpResponse | None:
    """The response for a refused request, or None when the request may go on."""
    if state is None:
        return None
    if state.denied:
        return _marked(too_many_requests(request, state))
    if state.unavailable:
        return _marked(service_unavailable(request, state.json_api))
    return None


def answer(request, response, state: RequestState | None):
    """The response as it leaves a door: the refusal when a door refused, else the view's with the headers."""
    if state is None:
        return response
    if state.refused:
        if is_refusal(response):
            return response  # a door inside answered: its refusal came out through the middleware inside, keep it
        refused = refusal(request, state)
        return response if refused is None else _replacing(refused, response)
    headers.apply(response, state.decisions)
    return response


# What the replaced response says about its own body or its own status, not about the site.
NOT_CARRIED = frozenset({"content-type", "content-length", "content-encoding", "content-language", "www-authenticate"})


def _replacing(refused, response):
    """`refused` in place of `response`, with what the middleware inside added to that (X-Frame-Options,
    Vary, cookies): DRF's refusal, or the view's answer to a request refused on the way out."""
    for name, value in response.headers.items():
        if name.lower() not in NOT_CARRIED and name not in refused.headers:
            refused.headers[name] = value
    for name, morsel in response.cookies.items():
        refused.cookies.setdefault(name, morsel)
    _drop(response)
    return refused


def _drop(response) -> None:
    """The replaced answer is never sent nor closed, as one Django's own middleware replaces (a 304): its file
    is closed now, unread; a streamed body's generator is closed as CPython frees it, once no frame holds it."""
    file = getattr(response, "file_to_stream", None)
    if file is not None:
        file.close()


def bare_refusal(state: RequestState) -> HttpResponse:
    """The refusal when making the full one failed (a RATELIMIT_DENIED_VIEW that raised, a header that
    could not be written): the status and Retry-After alone, so a refused request is still refused."""
    if state.denied:
        response = HttpResponse("Too many requests.\n", status=429, content_type="text/plain; charset=utf-8")
        waits = [d.retry_after for d in state.denied if d.retry_after is not None]
        response.headers["Retry-After"] = str(max(1, int(max(waits, default=UNAVAILABLE_RETRY_AFTER) + 0.999)))
    else:
        response = HttpResponse(UNAVAILABLE_MESSAGE + "\n", status=503, content_type="text/plain; charset=utf-8")
        response.headers["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    return _marked(response)


def is_refusal(response) -> bool:
    """Whether `response` is one refusal() made (so the middleware passes it on as it is)."""
    return getattr(response, REFUSAL_MARK, False)


def _marked(response: HttpResponse) -> HttpResponse:
    setattr(response, REFUSAL_MARK, True)
    return response


def too_many_requests(request, state: RequestState) -> HttpResponse:
    custom = get_setting("RATELIMIT_DENIED_VIEW")
    if custom:
        response = import_string(custom)(request, state)
    else:
        first = next((d for d in state.denied if d.retry_after is None), state.denied[0])
        wait = headers.retry_after(state.denied)
        body = {"detail": refusal_message(first, wait), "policy": first.policy.name}
        if first.cost != 1:
            body["cost"] = first.cost
        if wait is not None:
            body["retry_after"] = wait
        message = body["detail"]
        if wants_json(request, state.json_api):
            response = JsonResponse(body, status=429)
        else:
            response = HttpResponse(message + "\n", status=429, content_type="text/plain; charset=utf-8")
    headers.apply(response, state.decisions, state.denied)
    return response


def refusal_message(denied: Decision, wait: int | None) -> str:
    policy, unit = denied.policy, denied.policy.unit
    most = policy.largest_cost(denied.limit)
    if unit == REQUESTS:
        costs, most_said = f"costs {denied.cost} units", str(most)
        units = "" if denied.cost == 1 else f" This request costs {denied.cost} units."
    else:  # a metered unit: the cost is the estimate the request would be admitted on
        costs, most_said = f"is estimated at {quantity(denied.cost, unit)}", quantity(most, unit)
        units = f" This request is estimated at {quantity(denied.cost, unit)}."
    if wait is None:  # no wait admits it: say so rather than name a time
        return f"Too many requests: this request {costs}, more than policy '{policy.name}' " \
            f"allows at once ({most_said}); it can never be admitted."
    return f"Too many requests: the limit of {amount(denied.limit, unit)} per {policy.window} s of policy " \
        f"'{policy.name}' is reached.{units} Retry in {wait} s."


def service_unavailable(request, json_api: bool = False) -> HttpResponse:
    message = UNAVAILABLE_MESSAGE
    if wants_json(request, json_api):
        response = JsonResponse({"detail": message, "retry_after": UNAVAILABLE_RETRY_AFTER}, status=503)
    else:
        response = HttpResponse(message + "\n", status=503, content_type="text/plain; charset=utf-8")
    response.headers["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
    return response

"""What a request holds and what its closing step sends (when, for users: docs/howto/in-flight.md).

Each request has one Closing: the places of in-flight policies it took are held there, and its closing
step sends everything held in one batch, once, at the first of:

- a door's answer leaving it (before a byte of it is sent): leaving();
- its streamed body ending, failing or being closed (the body the door hands the server is a Body);
- the request failing before its answer left a door: letting_go();
- request_finished in the request's context (the server closed whatever answer it sent: a 304 in place of
  a streamed body, or any answer of a view that called hit() without a door).

A whole answer whose bytes a policy counts (content-bytes) gives its places back as it leaves the door, and
settles at request_finished, once any outer middleware compressed, rendered or replaced it: its bytes if the
server closed it (HttpResponse.closed), none if another answer went in its place.

A batch is a list of items for engine.release(): the places held, and what the request's metered
policies move by (what it settled less its estimate: values.Adjustment), worked out as it is taken.
Only Django's public hooks are used, but for one case: _asgi_close_in_context_before_django_61().
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Sequence

import django

from . import engine
from .boundary import MIDDLEWARE, Door, faults, protected
from .drivers import Io, Steps, steps
from .loggate import LogGate
from .subjects import http_request
from .values import CONTENT_BYTES, Adjustment, Held, Metered

logger = logging.getLogger("ratelimit_app")
ignored_said = LogGate()  # a settle ignored for what the request's run told: said once a minute per kind


def ignore_settle(kind: str, message: str) -> None:
    """A settle whose amount only the request's run told (a model's count out of range, a unit said
    again) is ignored rather than raised: it never costs the caller the answer (a 500). Logged for the
    operator, once a minute per kind."""
    if ignored_said.due(kind):
        logger.error("ratelimit: %s", message)


class Closing:
    """One request's closing step: what it holds until it ends. `origin`: the environ or scope its
    request_started was sent with (None when no handler started it), which tells its own from another's."""

    __slots__ = ("origin", "batch", "metered", "used", "sent", "answer", "ended")

    def __init__(self, origin: object = None) -> None:
        self.origin = origin
        self.batch: list[Held] = []
        self.metered: list[Metered] = []  # its estimates charged in metered policies (values.Metered)
        self.used: dict[str, int] | None = None  # what settle() said it used, by unit
        self.sent: int | None = None  # the bytes its response sent, once known (content-bytes)
        self.answer = None  # the whole answer whose bytes it counts, until the request ends (content-bytes)
        self.ended = False  # its closing step ran: a settle() now comes too late

    def charge(self, metered: Sequence[Metered]) -> None:
        """Estimates charged in metered policies: settled (moved by what it used less them) as it ends."""
        self.metered += metered

    def settle(self, used: dict[str, int]) -> None:
        """Record what the request used of each unit (ratelimit_app.settle()): each unit once (a unit said
        again is ignored, logged), before it ends (after: ValueError, outside any request's answer)."""
        if self.ended:
            raise ValueError(
                "settle(): this request has ended and its usage was settled with it: settle before the view "
                "returns its response, or in a streamed body before its last chunk is sent."
            )
        if self.used is None:
            self.used = {}
        for unit, amount in used.items():
            if unit in self.used:
                ignore_settle("again", f"settle(): {unit} were already settled for this request ({self.used[unit]}): "
                              f"{amount} ignored; settle each unit once, with what the whole request used.")
            else:
                self.used[unit] = amount

    def _adjustments(self) -> list[Adjustment]:
        """What its metered policies move by: what it used of their unit less its estimate (at most their
        overage cap above it); nothing where their unit was not settled (the estimate stands).
        content-bytes settles itself with the bytes the response sent, unless the view settled it."""
        used = self.used or {}
        if self.sent is not None and CONTENT_BYTES not in used:
            used = {**used, CONTENT_BYTES: self.sent}
        adjustments = []
        for charged in self.metered:
            amount = used.get(charged.policy.unit)
            if amount is None:
                continue
            units = amount - charged.estimate
            cap = charged.policy.overage_cap
            if cap is not None and units > cap:
                units = cap
            if units:
                adjustments.append(Adjustment(charged, units))
        self.metered = []
        return adjustments

    def counts_bytes(self) -> bool:
        """Whether a policy that admitted the request counts the bytes of its answer (content-bytes)."""
        return any(charged.policy.unit == CONTENT_BYTES for charged in self.metered)

    def hold(self, items: Sequence[Held]) -> None:
        """Items the closing step sends: recorded before the call that takes them is sent, so that a call
        left unanswered (timed out, cancelled) is given back too."""
        self.batch += items

    def forget(self, items: Sequence[Held]) -> None:
        """Items held for a call that did not take them (refused, or no room): nothing to send."""
        dropped = set(map(id, items))
        self.batch = [item for item in self.batch if id(item) not in dropped]

    def take(self) -> list[Held | Adjustment]:
        """The batch, no longer held: whoever takes it sends it (each item is sent once)."""
        self.ended = True
        if self.answer is not None:
            self.sent, self.answer = _sent(self.answer), None
        batch = self.batch
        if batch:  # most requests hold nothing: nothing to replace
            self.batch = []
        if self.metered:
            batch = batch + self._adjustments()
        return batch

    def send(self) -> None:
        batch = self.take()
        if batch:
            engine.release(batch)

    async def asend(self) -> None:
        batch = self.take()
        if batch:
            await engine.arelease(batch)

    def send_places(self) -> None:
        """The places held, sent now; the metered policies are settled as the request ends."""
        batch, self.batch = self.batch, []
        if batch:
            engine.release(batch)

    async def asend_places(self) -> None:
        batch, self.batch = self.batch, []
        if batch:
            await engine.arelease(batch)


#: the Closing of the request this context serves, made when the request started
current: ContextVar[Closing | None] = ContextVar("ratelimit_closing", default=None)


def _origin(base) -> object:
    scope = getattr(base, "scope", None)  # an ASGIRequest's; a WSGIRequest has its environ
    return scope if scope is not None else getattr(base, "environ", None)


def closing_of(request) -> Closing:
    """The Closing of `request` (a DRF Request's is its HttpRequest's): the one its request_started made
    when this context saw it, else a new one, which request_finished in this context then sends (a request
    no handler started, or one whose request_started ran in a context of its own)."""
    base = http_request(request)
    started = current.get()
    origin = _origin(base)
    if started is not None and origin is not None and started.origin is origin:
        return started
    closing = Closing(origin)
    if started is None or started.ended:  # never another request's that is still open (a request made in a view)
        current.set(closing)
    if django.VERSION < (6, 1) and getattr(base, "scope", None) is not None:  # an ASGIRequest
        _asgi_close_in_context_before_django_61(base, closing)
    return closing


def _asgi_close_in_context_before_django_61(base, closing: Closing) -> None:
    """The one private touch. Django 5.2 and 6.0's ASGIHandler run the request in a task of its own and close
    the response, sending request_finished, from their caller's (asgi.py:205/233, 6.0: 209/237), which never
    sees this Closing; the request's close() runs there, listed with the response's: it puts it in."""
    if base.__dict__.get(CLOSES_WITH) is not None:
        return
    close = base.close

    def close_in_context() -> None:
        current.set(closing)
        close()

    base.close = close_in_context
    base.__dict__[CLOSES_WITH] = closing


CLOSES_WITH = "_ratelimit_closing"  # on an HttpRequest: the Closing its close() puts in context


# --- when the answer leaves a door ----------------------------------------------------------------


@steps
def leaving(request, response, closing: Closing) -> Steps:
    """The request's answer leaves a door: what it holds is sent now, before a byte of the answer is; a
    streamed body's when it ends, fails or is closed (and at request_finished, should the response be
    dropped unsent: an outer middleware answered instead, e.g. ConditionalGetMiddleware's 304)."""
    if not (closing.batch or closing.metered):
        return response
    if getattr(response, "streaming", False) and request.method != "HEAD":
        # a file is sent by the server's file wrapper (a body set anew would not be), and its close ends it;
        # one whose bytes are counted is read through a Body: what the server sent, not its Content-Length
        # (a client that left a large download midway), nor nothing when it has none (a proxied download)
        if getattr(response, "file_to_stream", None) is None or closing.counts_bytes():
            body = response.streaming_content
            closing.sent = 0  # counted as the body is produced
            response.streaming_content = ABody(body, closing) if response.is_async else Body(body, closing)
        return response
    if request.method == "HEAD":
        _unsent(response)
        closing.sent = 0
    elif closing.counts_bytes():
        # its bytes are counted once the server has sent it: an outer middleware may yet compress it,
        # render it (DRF, a template) or answer a 304 in its place, which sends none of them
        yield Io(closing.send_places, closing.asend_places)
        closing.answer = response
        return response
    yield Io(closing.send, closing.asend)  # send(), by the door's driver
    return response


def _sent(answer) -> int:
    """The bytes of a whole answer, once the server closed it (it is closed before request_finished is sent);
    none when it was never closed: another answer went in its place (a 304), or the request failed."""
    return len(answer.content) if answer.closed and getattr(answer, "is_rendered", True) else 0


def _unsent(response) -> None:
    """A HEAD's answer is whole with its headers, yet servers read a streamed body to the end to drop it:
    it is not produced, which would be work done with no place held."""
    if getattr(response, "streaming", False) and getattr(response, "file_to_stream", None) is None:
        response.streaming_content = _nothing() if response.is_async else ()


async def _nothing():
    return
    yield  # an async body with no chunk


_ENDED = iter(())


class Body:
    """A streamed body, chunk by chunk as the view made it: its end (the last chunk produced, the server has
    yet to end the body), its failure and its close (Django calls the close() of what streaming_content is
    set to with the response's) run the closing step."""

    __slots__ = ("chunks", "closing")

    def __init__(self, chunks, closing: Closing) -> None:
        self.chunks = iter(chunks)
        self.closing = closing

    def __iter__(self):
        return self

    def __next__(self):
        try:
            chunk = next(self.chunks)
        except BaseException:  # StopIteration: the body ended
            self.close()
            raise
        self.closing.sent += len(chunk)  # bytes: streaming_content made them so
        return chunk

    def close(self) -> None:
        self.chunks = _ENDED  # the chunks refer to the response: no cycle keeps it once the body ended
        self.closing.send()


class ABody:
    """Body's twin for an async body (iterated with `async for`); Django closes it with the response."""

    __slots__ = ("chunks", "closing")

    def __init__(self, chunks, closing: Closing) -> None:
        self.chunks = chunks
        self.closing = closing

    def __aiter__(self):
        return self

    async def __anext__(self):
        try:
            chunk = await self.chunks.__anext__()
        except BaseException:  # StopAsyncIteration: the body ended; or it failed, or was cancelled
            self.chunks = _NO_CHUNKS
            await self.closing.asend()
            raise
        self.closing.sent += len(chunk)
        return chunk

    def close(self) -> None:
        self.chunks = _NO_CHUNKS
        self.closing.send()


class _NoChunks:
    async def __anext__(self):
        raise StopAsyncIteration


_NO_CHUNKS = _NoChunks()


@steps
def letting_go(closing: Closing | None, door: Door) -> Steps[None]:
    """The request failed (an exception, or its client left) before its answer left the door: what it
    holds is sent, and a failure to send it never hides the request's own error."""
    try:
        if closing is not None:
            yield Io(closing.send, closing.asend)  # send(), by the door's driver
    except Exception as error:  # noqa: BLE001 - the boundary (boundary.py)
        faults.record(error, door)


# --- the request's start and end (apps.py connects them) ------------------------------------------


def request_began(environ=None, scope=None, **kwargs) -> None:
    """request_started: the request served in this context has a Closing from now on."""
    current.set(Closing(scope if scope is not None else environ))


def _request_ended(**kwargs) -> None:
    closing = current.get()
    if closing is not None:
        closing.send()


#: request_finished (the server closed the response it sent, or the client left): what no door sent
#: goes now, e.g. places taken by hit() on a site without the middleware.
request_ended = protected(_request_ended, MIDDLEWARE, lambda _error: None)

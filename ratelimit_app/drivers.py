"""The two drivers of the plain-code steps (the doors, deciding): a step yields the I/O it needs as an
Io, and run() does it with the sync function, arun() awaits the async one; the logic is written once."""

from __future__ import annotations

from typing import Any, Callable, Generator, NamedTuple, TypeVar

T = TypeVar("T")


class Io(NamedTuple):
    """One piece of I/O a step asks for: `sync(*args, **kwargs)`, or `await async_(*args, **kwargs)`."""

    sync: Callable[..., Any]
    async_: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = {}


Steps = Generator[Io, Any, T]


def nothing(*args: Any) -> None:
    """The sync side of an Io that only async code needs (loading the user ahead of time)."""


def run(steps: Steps[T]) -> T:
    """Drive `steps` with sync I/O: each Io's result is sent back, its exception thrown in."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            io = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        finally:
            error = None  # thrown once; not kept (with its traceback) past this round
        try:
            reply = io.sync(*io.args, **io.kwargs)
        except BaseException as raised:  # the steps decide: let go of what they hold, then raise
            reply, error = None, raised


async def arun(steps: Steps[T]) -> T:  # run()'s twin: the one place an await cannot be shared with sync code
    """Drive `steps` on an event loop: each Io's coroutine is awaited (a CancelledError thrown in)."""
    reply: Any = None
    error: BaseException | None = None
    while True:
        try:
            io = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        finally:
            error = None
        try:
            reply = await io.async_(*io.args, **io.kwargs)
        except BaseException as raised:
            reply, error = None, raised

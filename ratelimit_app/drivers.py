"""The two drivers of the plain-code steps (the doors, deciding): a step yields the I/O it needs as an
Io, and run() does it with the sync function, arun() awaits the async one; the logic is written once.
The request path's steps are marked @steps: their `.sync` twin is the same code with each Io called
where it is yielded, a plain function (a generator resumed per I/O cost every request ~20k instructions)."""

from __future__ import annotations

import __future__
import ast
import inspect
import textwrap
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


def steps(function: Callable[..., Steps[T]]) -> Callable[..., Steps[T]]:
    """Mark a generator function of steps and give it `.sync`, a plain function with the same code where
    `yield Io(sync, async_, args, kwargs)` is `sync(*args, **kwargs)`, `yield io` (a name) is
    `io.sync(*io.args, **io.kwargs)` and `yield from f(...)` is `f.sync(...)` (f marked @steps too)."""
    function.sync = _sync_twin(function)  # type: ignore[attr-defined]
    return function


def _sync_twin(function: Callable[..., Steps[T]]) -> Callable[..., T]:
    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):  # shipped without its source (.pyc only): the same steps, driven by run()
        return lambda *args, **kwargs: run(function(*args, **kwargs))
    tree = ast.parse(source)
    definition = tree.body[0]
    if not isinstance(definition, ast.FunctionDef) or function.__closure__:
        raise TypeError(f"@steps: {function.__qualname__} is not a module-level generator function")
    definition.decorator_list = []
    _Direct(function.__qualname__).visit(definition)
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, function.__code__.co_firstlineno - 1)  # tracebacks point at the steps' own lines
    code = compile(tree, function.__code__.co_filename, "exec", dont_inherit=True,
                   flags=__future__.annotations.compiler_flag)
    made: dict[str, Any] = {}
    exec(code, function.__globals__, made)  # noqa: S102 - the module's own code, rewritten
    twin = made[definition.name]
    twin.__qualname__ = f"{function.__qualname__}.sync"
    twin.__doc__ = function.__doc__
    return twin


class _Direct(ast.NodeTransformer):
    """Each yield of a step's body made the sync call it stands for (nested functions are left alone)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.depth = 0

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.depth += 1
        if self.depth == 1:
            self.generic_visit(node)
        self.depth -= 1
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Lambda(self, node: ast.Lambda) -> ast.AST:
        return node

    def visit_Yield(self, node: ast.Yield) -> ast.AST:
        self.generic_visit(node)
        value = node.value
        if value is None:  # a bare `yield` (steps with no I/O): never reached with a value
            made: ast.expr = ast.Constant(None)
        elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Io" \
                and not value.keywords and 2 <= len(value.args) <= 4 \
                and not any(isinstance(arg, ast.Starred) for arg in value.args):
            args: list[ast.expr] = []
            if len(value.args) > 2:
                given = value.args[2]
                args = list(given.elts) if isinstance(given, ast.Tuple) else [ast.Starred(given, ast.Load())]
            keywords = [ast.keyword(None, value.args[3])] if len(value.args) > 3 else []
            made = ast.Call(value.args[0], args, keywords)
        elif isinstance(value, ast.Name):
            def field(name: str) -> ast.expr:
                return ast.Attribute(ast.Name(value.id, ast.Load()), name, ast.Load())
            made = ast.Call(field("sync"), [ast.Starred(field("args"), ast.Load())],
                            [ast.keyword(None, field("kwargs"))])
        else:
            raise TypeError(f"@steps {self.where}: yield Io(...) or a name, line {node.lineno}")
        return ast.copy_location(made, node)

    def visit_YieldFrom(self, node: ast.YieldFrom) -> ast.AST:
        self.generic_visit(node)
        value = node.value
        if not isinstance(value, ast.Call):
            raise TypeError(f"@steps {self.where}: yield from a call of steps, line {node.lineno}")
        sync = ast.Attribute(value.func, "sync", ast.Load())
        return ast.copy_location(ast.Call(sync, value.args, value.keywords), node)

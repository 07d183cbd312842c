"""The blocking client's event-loop thread, and the one way a blocking class forwards to asyncio.

Responsibility: :class:`LoopThread` runs a private event loop (uvloop) in a daemon thread and
carries calls, pipelined futures and async iterators over to it. :class:`BlockingFacade` is the
base of every blocking class (``vellum.BookKeeper`` and its ledger handles, the blocking named
ledgers): it wraps one asyncio object living on a loop thread. A facade declares each forwarded
coroutine method with :func:`blocking`, each method returning an asyncio future at once
(``append_async``) with :func:`pipelined` and each forwarded attribute with :class:`mirrored`,
one line each, typed from the asyncio member it forwards to: mypy checks arguments and results
against the asyncio signature (and that the facade wraps that asyncio class), ``help()`` shows
the asyncio method's signature and docstring.

Invariants:
- every asyncio object lives on the loop and is touched only there; the exception is a plain
  attribute read (:class:`mirrored`), which is safe from any thread;
- work submitted from one thread reaches the loop in submission order (``call_soon_threadsafe``
  is FIFO, ``run_coroutine_threadsafe`` uses it), so pipelined appends keep their call order;
- a blocking call made from the loop thread itself raises ``IllegalOpError`` instead of
  deadlocking, one made after :meth:`LoopThread.stop` raises ``ClientClosedError``; a refused
  coroutine is closed unrun;
- a caller that stops waiting (timeout) cancels the coroutine it started.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import operator
import threading
from collections.abc import AsyncGenerator, Callable, Coroutine, Generator
from typing import Any, Concatenate, Generic, ParamSpec, Self, TypeVar, overload

from vellum.errors import ClientClosedError, IllegalOpError

_T = TypeVar("_T")
_A = TypeVar("_A")
_R = TypeVar("_R")
_W = TypeVar("_W")
_P = ParamSpec("_P")

__all__ = ["BlockingFacade", "LoopThread", "blocking", "mirrored", "pipelined"]


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class LoopThread:
    """A private event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = _new_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, name="vellum-client-loop", daemon=True)
        self.thread.start()
        self._ready.wait()
        self.stopped = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()

    @property
    def usable(self) -> bool:
        """A blocking call can be made here and now: not stopped, not on the loop thread."""
        return not self.stopped and threading.current_thread() is not self.thread

    def submit(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        if self.stopped:
            coro.close()
            raise ClientClosedError("the BookKeeper client is closed")
        if threading.current_thread() is self.thread:
            coro.close()
            raise IllegalOpError("blocking Vellum call made from the client's own event-loop thread")
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, _T], timeout_s: float | None = None) -> _T:
        cf = self.submit(coro)
        try:
            return cf.result(timeout_s)
        except concurrent.futures.TimeoutError:
            cf.cancel()  # do not leave the coroutine running on after the caller gave up
            raise

    def start_future(self, start: Callable[[], asyncio.Future[_T]]) -> concurrent.futures.Future[_T]:
        """Call ``start`` on the loop (in call order with everything else submitted from this
        thread) and return at once with a future that completes as the asyncio one does."""
        cf: concurrent.futures.Future[_T] = concurrent.futures.Future()
        if self.stopped:
            cf.set_exception(ClientClosedError("the BookKeeper client is closed"))
            return cf

        def transfer(f: asyncio.Future[_T]) -> None:
            if not cf.set_running_or_notify_cancel():
                return
            exc = f.exception()
            if exc is not None:
                cf.set_exception(exc)
            else:
                cf.set_result(f.result())

        def begin() -> None:
            try:
                fut = start()
            except Exception as e:  # e.g. a payload without len(): fail the caller's future, not the loop
                if cf.set_running_or_notify_cancel():
                    cf.set_exception(e)
                return
            fut.add_done_callback(transfer)

        try:
            self.loop.call_soon_threadsafe(begin)
        except RuntimeError:  # the loop was closed meanwhile
            cf.set_exception(ClientClosedError("the BookKeeper client is closed"))
        return cf

    def iterate(self, agen: AsyncGenerator[_T, None]) -> Generator[_T, None, None]:
        """The items of ``agen`` (made by an asyncio object of this loop), each fetched on the
        loop; closing the iterator closes ``agen`` there (unless the loop is gone)."""

        async def step() -> _T:
            return await agen.__anext__()

        try:
            while True:
                try:
                    item = self.call(step())
                except StopAsyncIteration:
                    return
                yield item
        finally:
            if self.usable:
                self.call(agen.aclose())

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self.thread:
            self.thread.join()
            self.loop.close()


class BlockingFacade(Generic[_A]):
    """Base of a blocking class: wraps asyncio object ``aio``, which lives on ``loop_thread``.

    Forwarded members are declared in the subclass body: ``read = blocking(AsyncHandle.read)``,
    ``ledger_id = mirrored(AsyncHandle.ledger_id)``; anything else is written out.
    """

    def __init__(self, loop_thread: LoopThread, aio: _A) -> None:
        self._lt = loop_thread
        self._aio = aio

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Forwarders are made in this module: name them after the facade (repr, help, pickling).
        for attr, value in vars(cls).items():
            if getattr(value, "__forwards_to__", None) is not None:
                value.__module__ = cls.__module__
                value.__qualname__ = f"{cls.__qualname__}.{attr}"

    @property
    def aio(self) -> _A:
        """The asyncio object underneath (touch it only on the loop: from coroutines given to
        ``BookKeeper.run``)."""
        return self._aio

    def __repr__(self) -> str:
        return f"Blocking{self._aio!r}"


@overload
def blocking(
    method: Callable[Concatenate[_A, _P], Coroutine[Any, Any, _R]],
) -> Callable[Concatenate[BlockingFacade[_A], _P], _R]: ...


@overload
def blocking(
    method: Callable[Concatenate[_A, _P], Coroutine[Any, Any, _R]], *, returns: Callable[[LoopThread, _R], _W]
) -> Callable[Concatenate[BlockingFacade[_A], _P], _W]: ...


def blocking(
    method: Callable[..., Coroutine[Any, Any, Any]], *, returns: Callable[[LoopThread, Any], Any] | None = None
) -> Callable[..., Any]:
    """The blocking form of coroutine method ``method`` of the facade's asyncio class: runs it on
    the facade's asyncio object, on the loop thread, and waits for its result; ``returns`` wraps
    that result (an asyncio handle) in its own facade on the same loop thread.

    The method is looked up by name on the asyncio object at each call, as a hand-written
    ``self.aio.method(...)`` would. Signature and docstring are the asyncio method's.
    """
    name = method.__name__

    def forward(self: BlockingFacade[Any], /, *args: Any, **kwargs: Any) -> Any:
        result = self._lt.call(getattr(self._aio, name)(*args, **kwargs))
        return result if returns is None else returns(self._lt, result)

    signature = inspect.signature(method)
    if returns is not None:
        signature = signature.replace(return_annotation=getattr(returns, "__name__", repr(returns)))
    return _forwarder(forward, method, signature)


def pipelined(
    method: Callable[Concatenate[_A, _P], asyncio.Future[_R]],
) -> Callable[Concatenate[BlockingFacade[_A], _P], concurrent.futures.Future[_R]]:
    """The blocking form of ``method``, a method that starts work and returns an asyncio future
    at once (``append_async``): it is called on the loop, in call order with everything else
    this thread submits, and the caller gets a ``concurrent.futures.Future`` at once
    (:meth:`LoopThread.start_future`)."""
    name = method.__name__

    def forward(self: BlockingFacade[Any], /, *args: Any, **kwargs: Any) -> Any:
        return self._lt.start_future(lambda: getattr(self._aio, name)(*args, **kwargs))

    signature = inspect.signature(method)
    returned = str(signature.return_annotation).replace("asyncio.Future", "concurrent.futures.Future", 1)
    return _forwarder(forward, method, signature.replace(return_annotation=returned))


def _forwarder(forward: Callable[..., Any], method: Callable[..., Any], signature: inspect.Signature) -> Any:
    """``forward`` dressed as ``method`` for ``help()``; named after its facade at class creation."""
    forward.__name__ = method.__name__
    forward.__qualname__ = method.__qualname__
    forward.__doc__ = method.__doc__
    forward.__signature__ = signature  # type: ignore[attr-defined]
    forward.__forwards_to__ = method  # type: ignore[attr-defined]
    return forward


class mirrored(property, Generic[_A, _T]):  # lower case: used like ``property``
    """A read-only attribute of a facade: the same attribute of its asyncio object.

    ``ledger_id = mirrored(AsyncLedgerHandle.ledger_id)``: at run time the argument is the asyncio
    class's property; mypy sees it as the getter, which types the facade's attribute.
    """

    def __init__(self, getter: Callable[[_A], _T]) -> None:
        fget = getattr(getter, "fget", getter)
        super().__init__(operator.attrgetter(f"_aio.{fget.__name__}"))
        # property.__init__ cannot give a subclass instance its doc: set it here (help() shows it).
        self.__doc__ = fget.__doc__

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: BlockingFacade[_A], owner: type | None = None) -> _T: ...

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return super().__get__(obj, owner)

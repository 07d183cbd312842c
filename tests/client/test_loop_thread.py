"""The blocking client's loop thread and the one way its facades forward to asyncio
(``client/loop_thread.py``): calls, pipelined futures and iterators cross to the loop; forwarded
members keep the asyncio signature and docstring; the real facades forward the API they always had.
No bookies: a small asyncio class stands in for the client."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import AsyncGenerator, Iterator

import pytest

from vellum.client import blocking as blocking_module
from vellum.client import named_blocking
from vellum.client.bookkeeper import BookKeeper as AsyncBookKeeper
from vellum.client.ledger import LedgerHandle as AsyncLedgerHandle
from vellum.client.loop_thread import BlockingFacade, LoopThread, blocking, mirrored, pipelined
from vellum.client.named import NamedLedgerHandle as AsyncNamedLedgerHandle
from vellum.client.named import NamedLedgers as AsyncNamedLedgers
from vellum.errors import ClientClosedError, IllegalOpError


@pytest.fixture
def lt() -> Iterator[LoopThread]:
    loop_thread = LoopThread()
    yield loop_thread
    loop_thread.stop()


# ------------------------------------------------------------------ LoopThread


def test_call_runs_on_the_loop_thread_and_refuses_it(lt: LoopThread) -> None:
    async def where() -> threading.Thread:
        return threading.current_thread()

    assert lt.call(where()) is lt.thread
    assert lt.usable
    refused: concurrent.futures.Future[BaseException | None] = concurrent.futures.Future()

    def on_loop() -> None:
        coro = asyncio.sleep(0)
        try:
            lt.call(coro)
            refused.set_result(None)
        except BaseException as e:
            refused.set_result(e)
        assert not lt.usable
        assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED  # closed unrun: no "never awaited"

    lt.loop.call_soon_threadsafe(on_loop)
    assert isinstance(refused.result(10), IllegalOpError)


def test_a_timed_out_call_is_cancelled_on_the_loop(lt: LoopThread) -> None:
    cancelled = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        lt.call(slow(), timeout_s=0.05)
    assert cancelled.wait(10)


def test_after_stop_everything_is_refused() -> None:
    lt = LoopThread()
    lt.stop()
    lt.stop()  # idempotent
    assert not lt.usable and not lt.thread.is_alive()
    coro = asyncio.sleep(0)
    with pytest.raises(ClientClosedError):
        lt.call(coro)
    assert inspect.getcoroutinestate(coro) == inspect.CORO_CLOSED
    with pytest.raises(ClientClosedError):
        lt.start_future(lambda: asyncio.get_running_loop().create_future()).result(0)


def test_start_future_keeps_call_order_and_carries_results_and_errors(lt: LoopThread) -> None:
    started: list[int] = []

    def start(i: int) -> asyncio.Future[int]:
        started.append(i)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if i == 3:
            fut.set_exception(ValueError("three"))
        else:
            asyncio.get_running_loop().call_later(0.001 * (10 - i), fut.set_result, i * 10)
        return fut

    futures = [lt.start_future(lambda i=i: start(i)) for i in range(10)]  # type: ignore[misc]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    with pytest.raises(ValueError, match="three"):
        futures[3].result(10)
    assert [f.result(10) for i, f in enumerate(futures) if i != 3] == [i * 10 for i in range(10) if i != 3]
    assert started == list(range(10))


def test_start_future_fails_the_future_when_starting_raises(lt: LoopThread) -> None:
    def start() -> asyncio.Future[int]:
        raise TypeError("object of type 'int' has no len()")

    with pytest.raises(TypeError, match="len"):
        lt.start_future(start).result(10)


def test_iterate_fetches_on_the_loop_and_closing_closes_the_generator(lt: LoopThread) -> None:
    threads: list[threading.Thread] = []
    closed = threading.Event()

    async def numbers(n: int) -> AsyncGenerator[int, None]:
        try:
            for i in range(n):
                threads.append(threading.current_thread())
                yield i
        finally:
            threads.append(threading.current_thread())
            closed.set()

    assert list(lt.iterate(numbers(3))) == [0, 1, 2]
    assert closed.is_set() and set(threads) == {lt.thread}
    closed.clear()
    it = lt.iterate(numbers(100))
    assert [next(it), next(it)] == [0, 1]
    it.close()
    assert closed.is_set()


# ------------------------------------------------------------------ facades


class Adder:
    """The asyncio side of the test facades."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int, threading.Thread]] = []

    @property
    def total_calls(self) -> int:
        """How many additions were made."""
        return len(self.calls)

    async def add(self, a: int, b: int = 1, *, times: int = 1) -> int:
        """``(a + b) * times``."""
        self.calls.append((a, b, times, threading.current_thread()))
        return (a + b) * times

    async def child(self, start: int) -> Adder:
        """A new adder."""
        out = Adder()
        out.calls = [(start, 0, 0, threading.current_thread())]
        return out

    def add_async(self, a: int) -> asyncio.Future[int]:
        """Starts an addition; the future completes with ``a + 1``."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        fut.set_result(a + 1)
        return fut


class BlockingChild(BlockingFacade[Adder]):
    total_calls = mirrored(Adder.total_calls)


class BlockingAdder(BlockingFacade[Adder]):
    total_calls = mirrored(Adder.total_calls)
    add = blocking(Adder.add)
    child = blocking(Adder.child, returns=BlockingChild)
    add_async = pipelined(Adder.add_async)


def test_forwarders_run_on_the_loop_with_the_asyncio_signature(lt: LoopThread) -> None:
    aio = Adder()
    facade = BlockingAdder(lt, aio)
    assert facade.aio is aio and repr(facade).startswith("Blocking<")
    assert facade.add(2) == 3 and facade.add(2, 3, times=2) == 10 and facade.add(a=1, b=1) == 2
    assert [c[3] for c in aio.calls] == [lt.thread] * 3
    assert facade.total_calls == 3
    child = facade.child(7)
    assert isinstance(child, BlockingChild) and child.total_calls == 1 and child.aio.calls[0][0] == 7
    fut = facade.add_async(4)
    assert isinstance(fut, concurrent.futures.Future) and fut.result(10) == 5
    with pytest.raises(TypeError):
        facade.add()  # type: ignore[call-arg]  # the asyncio method's own argument check


def test_forwarders_look_like_the_asyncio_members_in_help() -> None:
    add, child, add_async = BlockingAdder.add, BlockingAdder.child, BlockingAdder.add_async
    assert inspect.signature(add) == inspect.signature(Adder.add)
    assert inspect.signature(child).parameters == inspect.signature(Adder.child).parameters
    assert inspect.signature(child).return_annotation == "BlockingChild"
    assert inspect.signature(add_async).return_annotation == "concurrent.futures.Future[int]"
    assert (add.__doc__, child.__doc__, add_async.__doc__) == (Adder.add.__doc__, Adder.child.__doc__,
                                                                 Adder.add_async.__doc__)
    assert add.__qualname__ == "BlockingAdder.add" and add.__module__ == __name__
    assert BlockingAdder.total_calls.__doc__ == "How many additions were made."


def test_forwarders_look_the_method_up_on_the_asyncio_object(lt: LoopThread) -> None:
    aio = Adder()

    async def replaced(a: int, b: int = 1, *, times: int = 1) -> int:
        return -1

    aio.add = replaced  # type: ignore[method-assign]
    assert BlockingAdder(lt, aio).add(1) == -1  # as a hand-written ``self.aio.add(...)`` would


FACADES = [
    (blocking_module.BookKeeper, AsyncBookKeeper),
    (blocking_module.LedgerHandle, AsyncLedgerHandle),
    (named_blocking.NamedLedgers, AsyncNamedLedgers),
    (named_blocking.NamedLedgerHandle, AsyncNamedLedgerHandle),
]


@pytest.mark.parametrize(("facade", "aio"), FACADES, ids=lambda c: c.__module__ + "." + c.__name__)
def test_each_facade_forwards_to_the_asyncio_member_of_the_same_name(facade: type, aio: type) -> None:
    for name, member in vars(facade).items():
        target = getattr(member, "__forwards_to__", None)
        if target is not None:
            assert target is getattr(aio, name), f"{facade.__name__}.{name} forwards to {target.__qualname__}"
            assert member.__name__ == name
        elif isinstance(member, mirrored):
            assert member.fget is not None and member.__doc__ == getattr(aio, name).__doc__


#: the blocking API as it was written out by hand before the forwarding was declared
PUBLIC_API = {
    blocking_module.BookKeeper: {
        "aio", "loop", "is_closed", "submit", "run", "config", "create_ledger", "open_ledger", "delete_ledger",
        "list_ledgers", "ledger_metadata", "ledger_exists", "close",
    },
    blocking_module.LedgerHandle: {
        "ledger_id", "metadata", "last_add_confirmed", "last_add_pushed", "length", "is_closed", "aio", "append",
        "append_async", "read", "read_unconfirmed", "batch_read", "read_last_add_confirmed",
        "try_read_last_add_confirmed", "wait_for_lac", "tail", "force", "close",
    },
    named_blocking.NamedLedgers: {
        "aio", "open", "list", "exists", "record", "info", "delete", "shrink", "get_cursor", "set_cursor",
        "publish_segments", "merge_segments", "overwrite", "drain",
    },
    named_blocking.NamedLedgerHandle: {
        "name", "aio", "record", "version", "start_entry_id", "last_add_confirmed", "writer_epoch", "append",
        "append_async", "read", "read_last_add_confirmed", "refresh", "tail", "shrink", "get_cursor",
        "set_cursor", "close",
    },
}


@pytest.mark.parametrize("facade", list(PUBLIC_API), ids=lambda c: c.__module__ + "." + c.__name__)
def test_the_blocking_api_is_unchanged(facade: type) -> None:
    assert {n for n in dir(facade) if not n.startswith("_")} == PUBLIC_API[facade]
    if facade is not blocking_module.BookKeeper and facade is not named_blocking.NamedLedgers:
        assert hasattr(facade, "__enter__") and hasattr(facade, "__exit__")


def test_blocking_signatures_users_see() -> None:
    # the blocking shrink keeps its signature (no private keyword from the asyncio side)
    assert str(inspect.signature(named_blocking.NamedLedgers.shrink)) == (
        "(self, name: 'str', end_entry_id: 'int', *, force: 'bool' = False) -> 'ShrinkResult'")
    assert str(inspect.signature(blocking_module.BookKeeper.open_ledger)) == (
        "(self, ledger_id: 'int', *, password: 'bytes' = b'', recovery: 'bool' = True) -> 'LedgerHandle'")
    assert str(inspect.signature(named_blocking.NamedLedgerHandle.tail)) == (
        "(self, start_entry_id: 'int | None' = None, *, poll_timeout_s: 'float' = 1.0) "
        "-> 'Iterator[NamedLedgerEntry]'")

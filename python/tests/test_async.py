"""asyncio: awaitables and `async for`, driven by the CQ's fd."""
import asyncio
import errno
import threading

import pytest

import pyferry
from conftest import pool_bytes_in_use, pool_settles


def run(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_aget_aput(pair):
    p, c = pair

    async def main():
        waiting = asyncio.ensure_future(c.aget("prod", "k", timeout=5))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        assert await p.aput("cons", "k", b"async") == 5
        buf = await waiting
        assert buf.tobytes() == b"async"
        buf.release()
    run(main())


def test_many_concurrent_no_threads(pair):
    p, c = pair
    threads = threading.active_count()

    async def main():
        gets = [asyncio.ensure_future(c.aget("prod", f"k{i}", timeout=10)) for i in range(200)]
        await asyncio.gather(*(p.aput("cons", f"k{i}", str(i).encode()) for i in range(200)))
        bufs = await asyncio.gather(*gets)
        assert [b.tobytes() for b in bufs] == [str(i).encode() for i in range(200)]
        assert threading.active_count() == threads  # no thread per request
        for b in bufs:
            b.release()
    run(main())


def test_errors_and_cancel(pair):
    p, c = pair

    async def main():
        with pytest.raises(TimeoutError) as ei:
            await c.aget("prod", "absent", timeout=0.05)
        assert ei.value.errno == errno.ETIMEDOUT
        with pytest.raises(BlockingIOError):
            await c.aget("prod", "absent", nowait=True)
        t = asyncio.ensure_future(c.aget("prod", "never"))
        await asyncio.sleep(0.01)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        # the ferry op was cancelled too: a later put of the key stays for the next get
        await p.aput("cons", "never", b"late")
        assert (await c.aget("prod", "never", timeout=5)).tobytes() == b"late"
    before = c.health()["ops"]["cancelled"]
    run(main())
    assert c.health()["ops"]["cancelled"] == before + 1  # the task's cancel reached ferry


def test_async_stream(pair):
    p, c = pair

    async def produce():
        for i in range(6):
            await p.aput_chunk("cons", "as", bytes([65 + i]) * 100, end=(i == 5))

    async def main():
        prod = asyncio.ensure_future(produce())
        got = []
        async for buf in c.astream("prod", "as", timeout=5):
            got.append(buf.tobytes())
            buf.release()
        await prod
        assert got == [bytes([65 + i]) * 100 for i in range(6)]
    run(main())


def test_async_stream_abort_and_aclose(pair):
    p, c = pair
    start = pool_bytes_in_use(p) + pool_bytes_in_use(c)

    async def main():
        s = c.astream("prod", "ab", timeout=5)
        await p.aput_chunk("cons", "ab", b"one")
        p.abort_stream("cons", "ab", "bye")
        assert (await s.__anext__()).tobytes() == b"one"
        with pytest.raises(pyferry.FerryCancelledError) as ei:
            await s.__anext__()
        assert "bye" in str(ei.value)
        async with c.astream("prod", "cl", timeout=5) as s2:
            await p.aput_chunk("cons", "cl", b"x" * 4000)
            await p.aput_chunk("cons", "cl", b"y" * 4000)
            (await s2.__anext__()).release()
    run(main())
    assert pool_settles([p, c], start)


def test_close_engine_fails_pending(ns):
    async def main():
        e = pyferry.Engine("ac", ns=ns, pool_size=1 << 20)
        t = asyncio.ensure_future(e.aget("nobody", "k"))
        await asyncio.sleep(0.01)
        e.close()
        with pytest.raises(pyferry.FerryCancelledError):
            await t
    run(main())


def _fds():
    import os
    return len(os.listdir("/proc/self/fd"))


def test_each_loop_gives_its_queue_back(pair):
    """asyncio.run makes a loop per call: the queues (a CQ and its fd each) of
    loops that are gone are given back, not kept for the engine's life."""
    p, c = pair

    async def once(i):
        waiting = asyncio.ensure_future(c.aget("prod", f"l{i}", timeout=5))
        await p.aput("cons", f"l{i}", b"x")
        (await waiting).release()

    run(once(0))
    fds = _fds()
    for i in range(1, 60):
        run(once(i))
    assert _fds() <= fds + 2
    assert len(c._aio_queues) == 1 and len(p._aio_queues) == 1
    assert not c.__dict__.get("_aio_spent") and not p.__dict__.get("_aio_spent")


def test_dropped_stream_is_cancelled(pair):
    """A stream nobody reads any more (its task was cancelled, the object is
    gone) is cancelled: a new reader of the same key gets the chunks."""
    p, c = pair

    async def main():
        async def reader():
            async for buf in c.astream("prod", "dr", timeout=30):
                buf.release()
        t = asyncio.ensure_future(reader())
        await asyncio.sleep(0.05)
        t.cancel()
        with pytest.raises(asyncio.CancelledError):
            await t
        await asyncio.sleep(0.05)
        s = c.astream("prod", "dr", timeout=5)
        await p.aput_chunk("cons", "dr", b"one")
        await p.aput_chunk("cons", "dr", b"two", end=True)
        assert [b.tobytes() async for b in s] == [b"one", b"two"]
    before = c.health()["ops"]["cancelled"]
    run(main())
    assert c.health()["ops"]["cancelled"] == before + 1


def test_stream_wait_for_reads_on(pair):
    """A task cancelled while it waits for a chunk (asyncio.wait_for) leaves
    the stream as it is: the next read gets the next chunk."""
    p, c = pair

    async def main():
        s = c.astream("prod", "wf", timeout=5)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(s.__anext__(), 0.05)
        await p.aput_chunk("cons", "wf", b"late", end=True)
        assert (await s.__anext__()).tobytes() == b"late"
    run(main())


def test_aclose_from_another_task_wakes_the_reader(pair):
    p, c = pair

    async def main():
        s = c.astream("prod", "ac", timeout=30)
        got = []

        async def reader():
            async for buf in s:
                got.append(buf.tobytes())
                buf.release()
        t = asyncio.ensure_future(reader())
        await asyncio.sleep(0.05)
        await s.aclose()
        await asyncio.wait_for(t, 5)   # ends (the stream was cancelled), does not hang
        assert got == []
    run(main())


def test_close_from_another_thread_fails_pending(ns):
    """Engine.close() on another thread: the loop's own thread stops watching
    the fd and fails what waits (asyncio is not thread-safe)."""
    async def main():
        loop = asyncio.get_running_loop()
        e = pyferry.Engine("ct", ns=ns, pool_size=1 << 20)
        t = asyncio.ensure_future(e.aget("nobody", "k"))
        await asyncio.sleep(0.01)
        poked = []

        def close_then_watch():
            threading.Event().wait(0.3)   # the loop sleeps in its selector by then
            e.close()
            # A loop that nobody woke sleeps on: poke it after 10 s so the test ends.
            if not t.done():
                threading.Event().wait(10)
                loop.call_soon_threadsafe(poked.append, True)
        closer = threading.Thread(target=close_then_watch, daemon=True)
        closer.start()
        with pytest.raises(pyferry.FerryCancelledError):
            await t   # no timer of ours: only the close can wake this loop
        assert not poked
        await loop.run_in_executor(None, closer.join)
        assert e.closed
    run(main())


def test_refused_close_leaves_async_ops_alone(pair):
    """close() refused (another thread waits in a call) changes nothing: the
    awaiting get still gets its data."""
    p, c = pair

    async def main():
        waiting = asyncio.ensure_future(c.aget("prod", "rc", timeout=10))
        blocker = threading.Thread(target=lambda: c.get("prod", "never", timeout=1.0),
                                   daemon=True)
        pending = asyncio.get_running_loop().run_in_executor(None, blocker.run)
        await asyncio.sleep(0.2)
        with pytest.raises(pyferry.FerryBusyError):
            c.close()
        assert not c.closed
        await p.aput("cons", "rc", b"still")
        assert (await waiting).tobytes() == b"still"
        with pytest.raises(TimeoutError):
            await pending
    run(main())


def test_engine_used_from_asyncio_is_collected(ns):
    """The engine and its loop queues refer to each other: dropped without
    close(), the cycle collector still finds it (AsyncQueue takes part in
    it), and its name is free again."""
    import gc
    import weakref as _weakref

    def use_and_drop():
        e = pyferry.Engine("gcq", ns=ns, pool_size=1 << 20)

        async def once():
            with pytest.raises(BlockingIOError):
                await e.aget("nobody", "k", nowait=True)
        run(once())
        return _weakref.ref(e)

    ref = use_and_drop()
    gc.collect()
    assert ref() is None
    pyferry.Engine("gcq", ns=ns, pool_size=1 << 20).close()

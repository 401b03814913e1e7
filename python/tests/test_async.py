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

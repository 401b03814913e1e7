"""pyferry.aio: asyncio for ferry engines, driven by a completion queue's fd.

Each (engine, event loop) pair gets one AsyncQueue: a ferry CQ whose fd the
loop watches with add_reader. Ops are submitted from the loop's thread and
post to that CQ; when the fd is readable the loop takes every completion
(poll), resolves the futures, and arms the fd again (ferry_cq_arm): no
thread per request and no polling timer. Cancelling an awaiting task cancels
the ferry op; the memory a put reads from stays held until ferry is done.
"""
import asyncio
import collections

from . import _ferry


class _LoopQueue:
    def __init__(self, engine, loop):
        self.engine = engine
        self.loop = loop
        self.q = engine._async_queue()
        self.fd = self.q.fileno()
        self.waiters = {}          # user_data -> Future or AsyncStream
        self.closed = False
        loop.add_reader(self.fd, self._drain)
        self._drain()              # arm it

    def _drain(self):
        q = self.q
        while not self.closed:
            for ud, res, ln, more, buf in q.poll():
                w = self.waiters.get(ud)
                if w is None:          # a cancel's own completion, or an op given up
                    if buf is not None:
                        buf.release()
                    continue
                if isinstance(w, AsyncStream):
                    if not more:
                        del self.waiters[ud]
                    w._deliver(res, buf, more)
                    continue
                del self.waiters[ud]
                if w.cancelled():
                    if buf is not None:
                        buf.release()
                elif res < 0:
                    if buf is not None:
                        buf.release()
                    w.set_exception(_ferry._error(res, w._what))
                else:
                    w.set_result((res, ln, buf))
            if q.arm():
                return

    def submit(self, what, fn, *args, **kw):
        ud = fn(*args, **kw)
        fut = self.loop.create_future()
        fut._what = what
        self.waiters[ud] = fut
        return ud, fut

    async def run(self, what, fn, *args, **kw):
        ud, fut = self.submit(what, fn, *args, **kw)
        try:
            return await fut
        except asyncio.CancelledError:
            if not self.closed and self.waiters.get(ud) is fut:
                self.q.cancel(ud)   # its CQE still comes; the future is already cancelled
            raise

    def shutdown(self):
        if self.closed:
            return
        self.closed = True
        if not self.loop.is_closed():
            self.loop.remove_reader(self.fd)
        err = _ferry._error(-125, "engine closed")  # ECANCELED
        for w in self.waiters.values():
            if isinstance(w, AsyncStream):
                w._deliver(-125, None, False)
            elif not w.done():
                w.set_exception(err)
        self.waiters.clear()


def _queue(engine):
    loop = asyncio.get_running_loop()
    qs = engine.__dict__.setdefault("_aio_queues", {})
    lq = qs.get(loop)
    if lq is None or lq.closed:
        if engine.closed:
            raise ValueError("the engine is closed")
        lq = qs[loop] = _LoopQueue(engine, loop)
    return lq


def _shutdown(engine):
    """Stop watching the engine's CQ fds (before the engine is destroyed)."""
    if engine is None:
        return
    for lq in engine.__dict__.pop("_aio_queues", {}).values():
        lq.shutdown()


async def get(engine, peer, key, *, timeout=None, nowait=False):
    """A zero-copy get: the Buffer."""
    lq = _queue(engine)
    _, _, buf = await lq.run(f"aget '{key}'", lq.q.get, peer, key, timeout=timeout,
                             nowait=nowait)
    return buf


async def put(engine, peer, key, data, *, timeout=None, replace=False, wait_peer=False):
    """A put: the bytes sent."""
    lq = _queue(engine)
    _, ln, _ = await lq.run(f"aput '{key}'", lq.q.put, peer, key, data, timeout=timeout,
                            replace=replace, wait_peer=wait_peer)
    return ln


async def put_chunk(engine, peer, stream, data, *, end=False, timeout=None, wait_peer=False):
    """One chunk of a stream: its index."""
    lq = _queue(engine)
    res, _, _ = await lq.run(f"aput_chunk '{stream}'", lq.q.put_chunk, peer, stream, data,
                             end=end, timeout=timeout, wait_peer=wait_peer)
    return res


def stream(engine, peer, key, *, timeout=None, whole=False):
    """An async iterator over a stream's chunks (Buffers); timeout: the gap."""
    lq = _queue(engine)
    ud = lq.q.stream(peer, key, timeout=timeout, whole=whole)
    s = AsyncStream(lq, ud, key)
    lq.waiters[ud] = s
    return s


class AsyncStream:
    """The chunks of one stream, for `async for`. aclose() cancels the rest."""

    def __init__(self, lq, ud, key):
        self._lq = lq
        self._ud = ud
        self._key = key
        self._chunks = collections.deque()
        self._ended = False
        self._error = None
        self._waiter = None
        self.last_index = -1

    def _deliver(self, res, buf, more):
        if res < 0:
            what = f"stream '{self._key}'"
            if buf is not None:
                what += " aborted: " + buf.tobytes().decode("utf-8", "replace")
                buf.release()
            if not self._ended:
                self._error = _ferry._error(res, what)
            self._ended = True
        else:
            self._chunks.append((res, buf))
            if not more:
                self._ended = True
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        while not self._chunks:
            if self._error is not None:
                e, self._error = self._error, None
                raise e
            if self._ended:
                raise StopAsyncIteration
            self._waiter = self._lq.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        idx, buf = self._chunks.popleft()
        self.last_index = idx
        return buf

    async def aclose(self):
        """Stop reading: cancel the STREAM_GET and drop the chunks not taken."""
        if not self._ended and not self._lq.closed:
            self._lq.q.cancel(self._ud)
            while not self._ended:
                self._waiter = self._lq.loop.create_future()
                try:
                    await self._waiter
                finally:
                    self._waiter = None
        self._error = None
        while self._chunks:
            self._chunks.popleft()[1].release()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

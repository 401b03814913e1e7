"""pyferry.aio: asyncio for ferry engines, driven by a completion queue's fd.

Each (engine, event loop) pair gets one AsyncQueue: a ferry CQ whose fd the
loop watches with add_reader. Ops are submitted from the loop's thread and
post to that CQ; when the fd is readable the loop takes every completion
(poll), resolves the futures, and arms the fd again (ferry_cq_arm): no
thread per request and no polling timer. Cancelling an awaiting task cancels
the ferry op; the memory a put reads from stays held until ferry is done.

A queue lives as long as its loop: the first use of the engine from a new
loop gives back the queues of loops that were closed (asyncio.run makes a
loop per call). A stream that nobody reads any more (its AsyncStream is
gone) is cancelled. Engine.close() may be called from any thread: the
loop's own thread stops watching the fd and fails what still waits.
"""
import asyncio
import collections
import threading
import weakref

from . import _ferry

_GONE = object()  # a stream whose reader is gone: its op was cancelled, its chunks dropped


class _LoopQueue:
    def __init__(self, engine, loop):
        self.engine = engine
        self.loop = loop
        self.q = engine._async_queue()
        self.fd = self.q.fileno()
        self.waiters = {}          # user_data -> Future, weakref to an AsyncStream, or _GONE
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
                if w is _GONE or isinstance(w, weakref.ref):
                    s = None if w is _GONE else w()
                    if not more:
                        del self.waiters[ud]
                    if s is not None:
                        s._deliver(res, buf, more)
                        continue
                    if buf is not None:
                        buf.release()
                    if more and w is not _GONE:  # its reader went without a word: stop it
                        self.abandon(ud)
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

    def abandon(self, ud):
        """Stream ud's reader is gone: cancel it; what still comes is dropped."""
        self.waiters[ud] = _GONE
        self.q.cancel(ud)

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
        """The engine is closing: stop watching the fd, fail what waits.

        On the loop's thread at once; from another thread the loop's own
        thread does it (asyncio is not thread-safe), and this waits up to a
        second for it while the loop runs, since the fd goes with the engine.
        A closed loop has nobody left to tell.
        """
        if self.closed:
            return
        self.closed = True
        waiters = list(self.waiters.values())
        self.waiters.clear()
        loop = self.loop
        if loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            self._stop(waiters)
            return
        done = threading.Event()

        def stop():
            try:
                self._stop(waiters)
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(stop)
        except RuntimeError:   # closed meanwhile
            return
        if loop.is_running():
            done.wait(1.0)

    def _stop(self, waiters):
        self.loop.remove_reader(self.fd)
        err = _ferry._error(-125, "engine closed")  # ECANCELED
        for w in waiters:
            if isinstance(w, weakref.ref):
                w = w()
                if w is not None:
                    w._deliver(-125, None, False)
            elif w is not _GONE and not w.done():
                w.set_exception(err)

    def give_back(self):
        """Its loop is closed: cancel what is still in flight, then give the CQ
        back (True), or say it is still in use (False: try again later)."""
        if not self.closed:
            self.closed = True
            for ud, w in self.waiters.items():
                if isinstance(w, weakref.ref):
                    w = w()
                    if w is not None:
                        w._ended = True
                try:
                    self.q.cancel(ud)   # (one already over answers -ENOENT: harmless)
                except (ValueError, _ferry.FerryError):
                    pass
            self.waiters.clear()
        try:
            return self.q.close()
        except (ValueError, _ferry.FerryError):
            return True


def _queue(engine):
    loop = asyncio.get_running_loop()
    qs = engine.__dict__.setdefault("_aio_queues", {})
    lq = qs.get(loop)
    if lq is None or lq.closed:
        if engine.closed:
            raise ValueError("the engine is closed")
        # The queues of loops that are gone (each asyncio.run makes one): given back
        # now, or at a later call when an op of theirs was still on its way.
        spent = engine.__dict__.setdefault("_aio_spent", [])
        spent.extend(qs.pop(lp) for lp in [lp for lp in qs if lp.is_closed()])
        spent[:] = [q for q in spent if not q.give_back()]
        lq = qs[loop] = _LoopQueue(engine, loop)
    return lq


def _shutdown(engine):
    """Stop watching the engine's CQ fds (before the engine is destroyed)."""
    if engine is None:
        return
    engine.__dict__.pop("_aio_spent", None)   # their CQs go with the engine
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
    lq.waiters[ud] = weakref.ref(s)
    return s


class AsyncStream:
    """The chunks of one stream, for `async for`. aclose() cancels the rest,
    and so does dropping the object before the stream ended. A task cancelled
    while it waits for a chunk leaves the stream as it is (asyncio.wait_for
    on __anext__ can read on); several tasks may wait on one stream."""

    def __init__(self, lq, ud, key):
        self._lq = lq
        self._ud = ud
        self._key = key
        self._chunks = collections.deque()
        self._ended = False
        self._error = None
        self._waiters = set()
        self._closing = False      # aclose() cancelled it: its readers just end
        self.last_index = -1

    def __del__(self):
        try:
            lq = self._lq
            if not self._ended and not lq.closed and not lq.loop.is_closed():
                lq.abandon(self._ud)
            while self._chunks:
                self._chunks.popleft()[1].release()
        except Exception:   # interpreter shutdown, or the engine went first
            pass

    async def _wait(self):
        fut = self._lq.loop.create_future()
        self._waiters.add(fut)
        try:
            await fut
        finally:
            self._waiters.discard(fut)

    def _deliver(self, res, buf, more):
        if res < 0:
            what = f"stream '{self._key}'"
            if buf is not None:
                what += " aborted: " + buf.tobytes().decode("utf-8", "replace")
                buf.release()
            if not self._ended and not self._closing:
                self._error = _ferry._error(res, what)
            self._ended = True
        else:
            self._chunks.append((res, buf))
            if not more:
                self._ended = True
        for w in self._waiters:
            if not w.done():
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
            await self._wait()
        idx, buf = self._chunks.popleft()
        self.last_index = idx
        return buf

    async def aclose(self):
        """Stop reading: cancel the STREAM_GET and drop the chunks not taken."""
        self._closing = True
        if not self._ended and not self._lq.closed:
            self._lq.q.cancel(self._ud)
            while not self._ended:
                await self._wait()
        self._error = None
        while self._chunks:
            self._chunks.popleft()[1].release()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()

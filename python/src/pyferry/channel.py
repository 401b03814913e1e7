"""pyferry.MessageQueue: a broadcast queue shaped like vLLM's
``vllm.distributed.device_communicators.shm_broadcast.MessageQueue``, on
ferry's broadcast channels (api/ferry/channel.h).

    # driver
    mq = pyferry.MessageQueue(n_reader=4, n_local_reader=4)
    handle = mq.export_handle()              # bytes: pass it to every worker
    ...                                      # workers: MessageQueue.create_from_handle(handle, rank)
    mq.wait_until_ready()
    mq.enqueue(("execute_model", args))      # pickled once, one copy for all readers
    # worker
    mq = pyferry.MessageQueue.create_from_handle(handle, rank)
    mq.wait_until_ready()
    method, args = mq.dequeue(timeout=10)

Readers on the writer's host read the pickled bytes in place from the
writer's pool (shared memory, no copy); readers elsewhere are reached over
tcp through the control channel: give ``connect_ip`` (an address of this
host the readers can reach) when ``n_local_reader < n_reader``. The response
queue of a worker is a MessageQueue of its own with one reader (the driver),
as vLLM's executors do.

Each MessageQueue owns an Engine (or uses the one given as ``engine=``);
``close()`` ends both.
"""
import itertools
import os
import pickle

from . import _ferry

__all__ = ["MessageQueue", "Handle"]

_seq = itertools.count()
_TAG = b"pyferry-mq1 "


class Handle(bytes):
    """The exported handle: bytes (picklable, printable ASCII)."""


def _engine_name(role):
    return f"mq-{role}-{os.getpid()}-{next(_seq)}"


class MessageQueue:
    """MessageQueue(n_reader, n_local_reader=None, local_reader_ranks=None,
    max_chunk_bytes=..., max_chunks=..., connect_ip=None, *, ns="pyferry-mq",
    engine=None, name=None, max_outstanding=None, pool_size=None)

    The writer's end. ``max_chunks`` (or ``max_outstanding``) bounds the
    messages written and not yet delivered to every live reader; a write past
    it waits (``enqueue(timeout=)``, then TimeoutError). ``max_chunk_bytes``
    sizes the writer's pool (max_chunks of them, at least 64 MiB).
    """

    def __init__(self, n_reader, n_local_reader=None, local_reader_ranks=None,
                 max_chunk_bytes=1024 * 1024 * 10, max_chunks=10, connect_ip=None, *,
                 ns="pyferry-mq", engine=None, name=None, max_outstanding=None,
                 pool_size=None):
        if n_local_reader is None:
            n_local_reader = n_reader
        self.n_reader = n_reader
        self.n_local_reader = n_local_reader
        self.n_remote_reader = n_reader - n_local_reader
        self.local_reader_ranks = (list(local_reader_ranks) if local_reader_ranks is not None
                                   else list(range(n_local_reader)))
        self._is_writer = True
        self._ns = ns
        self._own_engine = engine is None
        if engine is None:
            from . import Engine
            kw = {}
            if self.n_remote_reader > 0 or connect_ip:
                kw["control"] = f"tcp://{connect_ip or '127.0.0.1'}:0"
            # twice the window: blocks still held by readers releasing late
            # and the page allocator's fragmentation (a memfd: pages untouched
            # cost nothing)
            pool = pool_size or max(64 << 20, 2 * max_chunk_bytes * (max_chunks + 2))
            engine = Engine(_engine_name("w"), ns=ns, pool_size=pool, **kw)
        self._engine = engine
        window = max_outstanding if max_outstanding is not None else max_chunks
        self._chan = _ferry.ChanWriter(engine, name or "mq", n_reader, window)
        self._handle = Handle(_TAG + f"ns={ns} ".encode() + self._chan.handle().encode())

    # -- construction from a handle (the readers) -----------------------------

    @staticmethod
    def create_from_handle(handle, rank=0, *, engine=None, remote=None, pool_size=None,
                           attach_timeout=None, progress="thread"):
        """The reader's end of the queue a handle names (rank is kept for
        vLLM's signature; ferry needs none). progress="manual" runs the
        reader's own engine caller-driven (no reactor thread: the reader's
        dequeue and wait_until_ready drive it, so a message wakes the reader's
        thread itself, one cross-core wake-up instead of two; measured in
        docs/benchmarks.md). Then the reader attaches only inside its own
        wait_until_ready (call it while the writer waits in its), and what it
        released goes back to the writer on its next call."""
        self = MessageQueue.__new__(MessageQueue)
        h = bytes(handle)
        if not h.startswith(_TAG):
            raise ValueError("not a pyferry MessageQueue handle")
        rest = h[len(_TAG):].decode()
        nsfield, chan_handle = rest.split(" ", 1)
        ns = nsfield[len("ns="):]
        self._is_writer = False
        self._ns = ns
        self.rank = rank
        self._own_engine = engine is None
        if engine is None:
            from . import Engine
            kw = {}
            if remote or " addrs=ferry://" in chan_handle:
                # A reader elsewhere is called back over the control channel.
                ctl_ip = os.environ.get("PYFERRY_MQ_IP", "127.0.0.1") if not remote else \
                    (remote if isinstance(remote, str) else "127.0.0.1")
                kw["control"] = f"tcp://{ctl_ip}:0"
            engine = Engine(_engine_name("r"), ns=ns, pool_size=pool_size or (64 << 20),
                            progress=progress, **kw)
        self._engine = engine
        self._chan = _ferry.ChanReader(engine, chan_handle, remote=bool(remote),
                                       attach_timeout=attach_timeout)
        return self

    # -- both ends -------------------------------------------------------------

    def export_handle(self):
        """The handle (bytes) readers open with create_from_handle."""
        if not self._is_writer:
            raise RuntimeError("only the writer exports the handle")
        return self._handle

    def wait_until_ready(self, timeout=None):
        """Writer: until every reader attached (TimeoutError after timeout
        seconds). Reader: until the writer holds its attach."""
        try:
            self._chan.wait_ready(timeout=timeout)
        except _ferry.FerryTimeoutError as e:
            raise TimeoutError(str(e)) from None

    def enqueue(self, obj, timeout=None):
        """Pickle obj and write it to every reader (TimeoutError when the
        window stays full for timeout seconds)."""
        if not self._is_writer:
            raise RuntimeError("only the writer enqueues")
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            return self._chan.write(data, timeout=timeout)
        except _ferry.FerryTimeoutError as e:
            raise TimeoutError(str(e)) from None

    def enqueue_bytes(self, data, timeout=None):
        """Write bytes-like data as they are (no pickling)."""
        try:
            return self._chan.write(data, timeout=timeout)
        except _ferry.FerryTimeoutError as e:
            raise TimeoutError(str(e)) from None

    def dequeue_bytes(self, timeout=None):
        """The next message as a read-only pyferry.Buffer (zero copy; use it
        as a context manager or release() it)."""
        if self._is_writer:
            raise RuntimeError("only readers dequeue")
        try:
            _seq_no, buf = self._chan.dequeue(timeout=timeout)
        except _ferry.FerryTimeoutError as e:
            raise TimeoutError(str(e)) from None
        return buf

    def dequeue(self, timeout=None, cancel=None, indefinite=False):
        """The next object (unpickled from the writer's memory). TimeoutError
        after timeout seconds (None, or indefinite=True: wait forever);
        ConnectionResetError when the writer died, BrokenPipeError once it
        closed. cancel (a threading.Event) is polled every 100 ms."""
        if indefinite:
            timeout = None
        if cancel is None:
            buf = self.dequeue_bytes(timeout)
        else:
            import time
            end = None if timeout is None else time.monotonic() + timeout
            while True:
                if cancel.is_set():
                    raise RuntimeError("cancelled")
                step = 0.1 if end is None else max(0.0, min(0.1, end - time.monotonic()))
                try:
                    buf = self.dequeue_bytes(step)
                    break
                except TimeoutError:
                    if end is not None and time.monotonic() >= end:
                        raise
        with buf:
            return pickle.loads(memoryview(buf))

    def fileno(self):
        """Reader: an fd that is readable when a message came."""
        return self._chan.fileno()

    def stats(self):
        """Writer: the channel's counters (readers attached, live, dead, ...)."""
        return self._chan.stats()

    def flush(self, timeout=None):
        """Writer: until everything written reached every live reader."""
        self._chan.flush(timeout=timeout)

    def close(self):
        chan = getattr(self, "_chan", None)
        if chan is not None:
            chan.close()
            self._chan = None
        if getattr(self, "_own_engine", False) and self._engine is not None:
            self._engine.close()
            self._engine = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

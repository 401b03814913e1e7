"""pyferry: Python binding of ferry, an asynchronous transfer engine for
multi-stage inference pipelines.

    import pyferry
    with pyferry.Engine("prod", ns="demo") as prod, pyferry.Engine("cons", ns="demo") as cons:
        prod.put("cons", "k", b"hello")
        with cons.get("prod", "k", timeout=5) as buf:   # a Buffer: ferry's memory, no copy
            print(bytes(memoryview(buf)))

Blocking calls release the GIL; asyncio forms (aget, aput, aput_chunk,
astream) run on the loop's thread, driven by the completion queue's fd.
See python/README.md.
"""
import json as _json

from . import _ferry
from ._ferry import (  # noqa: F401  (the public names)
    Buffer,
    Peer,
    StreamIter,
    FerryError,
    FerryTimeoutError,
    FerryWouldBlockError,
    FerryCancelledError,
    FerryConnectionResetError,
    FerryConnectionRefusedError,
    FerryUnreachableError,
    FerryNotConnectedError,
    FerryBrokenPipeError,
    FerryExistsError,
    FerryNotFoundError,
    FerryPermissionError,
    FerryNoMemoryError,
    FerryMessageSizeError,
    FerryInvalidError,
    FerryBusyError,
    FerryAddressInUseError,
    FerryNotSupportedError,
    FerryShutdownError,
    version,
    features,
    strerror,
)
from . import aio as _aio
from .channel import MessageQueue, Handle  # noqa: E402,F401

__all__ = [
    "Engine", "Stage", "Peer", "Buffer", "StreamIter", "FerryError", "MessageQueue",
    "version", "features", "strerror",
]

__version__ = "0.1.0"


class Engine(_ferry.Engine):
    """A ferry engine.

    Engine(name, *, ns=None, progress="thread"|"manual", pool_size=0,
           listen=None, control=None, secret=None, max_keys=0, max_bufs=0,
           max_ops=0, heartbeat_ms=0, peer_timeout_ms=0, prefault=True,
           rdma_listen=None, busy_poll=False, single_poller=False)

    busy_poll=True: its callers poll (or their waits rarely sleep): the
    busy path's fences cost nothing and each sleep pays with membarrier(2)
    instead (5-17 us on a virtual machine while the peer runs); where the
    kernel refuses membarrier it changes nothing. health()["fences"] says
    which ("membarrier" or "symmetric"). FERRY_ENGINE_BUSY_POLL in C.

    single_poller=True (progress="manual" only; ValueError otherwise): one
    thread drives the engine, the first that waits or polls on it (a put,
    get, nop, progress() ...); those calls from any other thread raise
    FerryError (errno EPERM) before anything is submitted. Its rounds then
    take no lock and its completions are taken without locked
    instructions. health()["pollers"] says
    "single" (else "any"). FERRY_ENGINE_SINGLE_POLLER in C.

    rdma_listen: "rdma://ADDRESS:PORT" (an address of an RDMA device's
    interface; port 0: rdma_cm picks, see addresses()). Without an RDMA
    device creation raises FerryError (errno EADDRNOTAVAIL); in a build
    without the rdma transport (features() lacks "rdma"), errno
    EPROTONOSUPPORT; anything but "rdma://..." raises ValueError.

    A context manager; close() is idempotent. Blocking calls (put, get,
    put_chunk, stream iteration, nop, cleanup) take timeout= in seconds and
    release the GIL while they wait; the a* forms are awaitables.
    """

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if not self.closed and not getattr(self, "_borrowed", False):
            self._close_check()  # a close refused as busy leaves the asyncio ops alone
            _aio._shutdown(self)
        super().close()

    def health(self):
        """The engine's health as a dict (ferry_engine_health)."""
        return _json.loads(self.health_json())

    async def aget(self, peer, key, *, timeout=None, nowait=False):
        """Await a zero-copy get: a Buffer."""
        return await _aio.get(self, peer, key, timeout=timeout, nowait=nowait)

    async def aput(self, peer, key, data, *, timeout=None, replace=False, wait_peer=False):
        """Await a put: the bytes sent."""
        return await _aio.put(self, peer, key, data, timeout=timeout, replace=replace,
                              wait_peer=wait_peer)

    async def aput_chunk(self, peer, stream, data, *, end=False, timeout=None,
                         wait_peer=False):
        """Await a stream chunk's put: its index."""
        return await _aio.put_chunk(self, peer, stream, data, end=end, timeout=timeout,
                                    wait_peer=wait_peer)

    def astream(self, peer, stream, *, timeout=None, whole=False):
        """`async for buf in engine.astream(peer, key)`: the chunks, as Buffers."""
        return _aio.stream(self, peer, stream, timeout=timeout, whole=whole)


_ferry._set_engine_class(Engine)


class Stage(_ferry.Stage):
    """One rank of one stage of a vLLM-Omni stage YAML.

    Stage(config_path, stage_id, rank=0, *, ns=None, progress="thread",
          pool_size=0, timeout=None)

    put(from_stage, to_stage, key, data) -> (True, size, metadata)
    get(from_stage, to_stage, key, metadata=None, *, timeout=None, nowait=False)
        -> (Buffer, size), or None when nowait and the key is not there yet
    cleanup(request_id) -> int; health() -> dict; close() (idempotent)
    """

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        if not self.closed:
            self.engine._close_check()  # a close refused as busy leaves the asyncio ops alone
            _aio._shutdown(self.engine)
        super().close()

    def health(self):
        return _json.loads(self.health_json())

"""pyferry._device: FerryConnector's CUDA tensors sent as device memory.

A torch CUDA tensor in a payload is not copied to the host: put() sends it as
a PUT of device memory of its own, under key "<key>#cuda<i>", before the
frame that names it (ferry keeps the order of one sender's PUTs to one
receiver, so the device parts are there when the frame is). ferry carries it
by CUDA IPC to another process of the same host (the receiver copies it
device to device, no host copy at all), and staged through the pinned pools
anywhere else. The receiver's get() fetches each part into a tensor it
allocates on its device (FetchDevice), or, in a process without CUDA, into
host memory (ferry then asks the sender for a staged copy).

A PUT by CUDA IPC completes only once the receiver has copied the memory:
long after put() returned. DevicePuts submits those PUTs on a completion
queue of their own (no thread, no wait), keeps each tensor alive until its
completion is reaped (each put, health() and close() reap), bounds how many
may be out at once (a put that would pass the bound waits, up to the
connector's put_timeout, for receivers to read what is out; then its torch
tensors go through the host as before, one .cpu() copy each, said once),
and close() waits for the ones still out, bounded, before their engine may
go.
"""
import logging
import select
import time

from . import cuda as _cuda
from ._payload import FrameError

logger = logging.getLogger("pyferry.connector")

SUFFIX = "#cuda"  # "<key>#cuda<i>": '#' is one of cleanup()'s prefix separators


class DevicePuts:
    """The device PUTs of one engine that are out (submitted, not reaped)."""

    def __init__(self, engine, limit, timeout):
        self._aq = engine._async_queue()
        self._limit = limit
        self._timeout = timeout
        self._out = {}  # user_data -> key
        self.sent = self.failed = 0

    def room(self, n, wait):
        """Whether n more may go out: completions are reaped, and while the
        bound is reached the producer waits (for wait seconds at most) for
        receivers to read what is out, sleeping on the queue's fd."""
        self.reap()
        if n > self._limit:
            return False  # never: do not wait for it
        end = time.monotonic() + wait
        while len(self._out) + n > self._limit:
            left = end - time.monotonic()
            if left <= 0:
                return False
            if self._aq.arm():  # safe to sleep: a completion makes the fd readable
                select.select([self._aq.fileno()], [], [], left)
            self.reap()
        return True

    def put(self, peer, key, obj, nbytes):
        """Submit the PUT of obj's device memory (a contiguous torch CUDA
        tensor, or an object with __cuda_array_interface__), after the work
        its producer queued so far (ferry waits for it on the GPU: the caller
        does not synchronize): a torch tensor's device's current stream, or
        the array interface's "stream" (version 3); none when it names none."""
        ptr, n, dev = _cuda.device_memory(obj)
        if n != nbytes:
            raise ValueError(f"a CUDA part of {n} bytes, {nbytes} expected")
        ud = self._aq.put_device(peer, key, ptr, n, dev, stream=_producer_stream(obj),
                                 timeout=self._timeout, replace=True, wait_peer=True, hold=obj)
        self._out[ud] = key
        self.sent += 1
        return ud

    def cancel(self, uds):
        """Ask ferry to cancel those PUTs (a payload whose frame will not
        follow); one its receiver already reads ends as it would."""
        for ud in uds:
            if ud in self._out:
                try:
                    self._aq.cancel(ud)
                except Exception as e:  # the engine is closing: its ops end anyway
                    logger.debug("FerryConnector: cancel of %s: %s", self._out[ud], e)

    def reap(self):
        """Let go of the tensors whose PUT is over; a failed one is logged."""
        if not self._out:
            return
        for ud, res, _len, more, buf in self._aq.poll():
            if buf is not None:
                buf.release()
            key = self._out.pop(ud, None) if not more else None
            if key is not None and res < 0:
                self.failed += 1
                logger.warning("FerryConnector: the device part %s was not delivered: %s", key,
                               _errname(res))

    def close(self, wait):
        """Reap until none is out, for wait seconds at most; the ones still
        out are said (their tensors stay held by the engine's queue until the
        engine goes)."""
        end = time.monotonic() + wait
        self.reap()
        while self._out and time.monotonic() < end:
            time.sleep(0.001)
            self.reap()
        if self._out:
            logger.warning("FerryConnector: closing with %d device part(s) not yet read by "
                           "their receiver (%s)", len(self._out),
                           ", ".join(sorted(self._out.values())[:4]))

    def stats(self):
        return {"out": len(self._out), "sent": self.sent, "failed": self.failed}


def _producer_stream(obj):
    """The cudaStream_t (as int) whose queued work must end before obj is
    read, or 0."""
    dev = getattr(obj, "device", None)
    if getattr(dev, "type", None) == "cuda" and hasattr(obj, "data_ptr"):
        import torch
        return int(torch.cuda.current_stream(dev).cuda_stream)
    stream = (getattr(obj, "__cuda_array_interface__", None) or {}).get("stream")
    return int(stream) if isinstance(stream, int) and stream > 0 else 0


_alloc_streams = {}  # device -> the stream fetched tensors are allocated on


def _fresh(torch, nbytes, dev):
    """A new uint8 tensor for ferry to write on its own stream. Allocated
    on a stream of ours on which no work ever runs: torch's caching
    allocator hands a block of the current stream back while that stream's
    queued kernels may still use it, which is safe only for work on that
    same stream. record_stream: when the caller frees it, the block waits
    for the caller's stream before it is used again."""
    side = _alloc_streams.get(dev)
    if side is None:
        side = _alloc_streams.setdefault(dev, torch.cuda.Stream(device=dev))
    with torch.cuda.stream(side):
        out = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dev}")
    out.record_stream(torch.cuda.current_stream(dev))
    return out


def _errname(res):
    import os
    return f"{os.strerror(-res)} ({res})"


class FetchDevice:
    """decode()'s fetch for the frames one engine receives from one peer
    (made once per pair): part i of key is GET into a new 1-D uint8 tensor
    on the receiver's device (device: an index, or None for the current
    device when it is fetched); in a process where ferry or torch has no
    CUDA, into host memory (a CPU tensor; a numpy array where torch is not
    importable). Returns the tensor and its length in bytes."""

    __slots__ = ("engine", "peer", "device", "timeout")

    def __init__(self, engine, peer, device, timeout):
        self.engine, self.peer = engine, peer
        self.device, self.timeout = device, timeout

    def __call__(self, key, index, nbytes):
        key = f"{key}{SUFFIX}{index}"
        try:
            try:
                import torch
            except ImportError:
                torch = None
            if torch is not None and _cuda.available() and torch.cuda.is_available():
                dev = torch.cuda.current_device() if self.device is None else self.device
                out = _fresh(torch, nbytes, dev)
                n = _cuda.get_into(self.engine, self.peer, key, out, timeout=self.timeout)
            else:  # host memory: ferry asks the sender for a staged copy (its own, writable)
                with self.engine.get(self.peer, key, timeout=self.timeout) as b:
                    host = bytearray(memoryview(b))
                if torch is not None:
                    out = torch.frombuffer(host, dtype=torch.uint8) if host else \
                        torch.empty(0, dtype=torch.uint8)
                else:
                    import numpy as np
                    out = np.frombuffer(host, dtype=np.uint8)
                n = len(host)
        except Exception as e:
            raise FrameError(f"its CUDA tensor {key} could not be fetched: "
                             f"{type(e).__name__}: {e}") from None
        if n != nbytes:
            raise FrameError(f"its CUDA tensor {key} is {n} bytes, not {nbytes}")
        return out

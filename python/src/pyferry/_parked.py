"""pyferry._parked: the GETs a polling caller leaves waiting inside ferry.

vLLM-Omni's callers poll get(key) until it returns the payload (the chunk
adapter once a millisecond, other callers without a pause). A nowait GET
per poll is a round trip through the engine's reactor every time: a
submission, a round, a completion and a wake-up, for an answer that is
almost always "not yet", and the poll that finally finds the data pays one
more of them after it arrived.

ParkedGets turns the polls of a key into one GET: the first poll that misses
leaves a GET waiting for the key inside the engine, on a completion queue of
its own (an AsyncQueue, the CQ pyferry.aio uses). ferry hands the data to
that GET in the round it arrives in, and every later poll only reaps the
queue: no submission, no reactor round, no syscall. What a reap brings in
waits in `arrived` for the poll of its key.

Bounds: at most `limit` keys parked or arrived and not yet taken per engine;
past that a poll is a nowait GET, as before. A parked GET ends by itself
after `park_s` seconds (the key's next poll parks it again), and what an
engine's cleanup drops it ends with -ECANCELED.

Ownership: once a parked GET took a key's data, the data is this object's
(another FerryConnector of the process sharing the engine no longer finds
it); close() cancels the parked GETs and lets go of what arrived.

One lock per ParkedGets; the nowait GET of a first poll runs outside it.
"""
import errno
import logging
import threading
import time

from . import _ferry

logger = logging.getLogger("pyferry.connector")

_MISSING = object()
_ENDED = (-errno.ETIMEDOUT, -errno.ECANCELED)
CLEANUP_SEPARATORS = ("_", ":", "/", "#")  # ferry_prep_cleanup's rule (ferry.h)


class ParkedGets:
    """Parked GETs of one engine (see the module's docstring)."""

    def __init__(self, engine, limit=256, park_s=30.0):
        self._engine = engine
        self._aq = engine._async_queue()
        self._lock = threading.Lock()
        self._limit = limit
        self._park_s = park_s
        self._ud_of = {}     # (sender, key) -> user_data of its parked GET
        self._key_of = {}    # user_data -> (sender, key)
        self._arrived = {}   # (sender, key) -> Buffer, or the negative errno it ended with
        self.closed = False

    # --- under the lock -------------------------------------------------

    def _reap(self):
        for ud, res, _len, _more, buf in self._aq.poll():
            k = self._key_of.pop(ud, None)
            if k is None:  # a cancel's own completion
                if buf is not None:
                    buf.release()
                continue
            del self._ud_of[k]
            if res >= 0:
                self._arrived[k] = buf if buf is not None else b""
            elif res not in _ENDED:
                self._arrived[k] = res

    def _open_reap_take(self, k, key):
        """Reap, then take what arrived for k (_MISSING if nothing did)."""
        if self.closed:
            raise ValueError("FerryConnector is closed")
        self._reap()
        return self._take(k, key)

    def _take(self, k, key):
        got = self._arrived.pop(k, _MISSING)
        if got is _MISSING or not isinstance(got, int):
            return got
        raise _ferry._error(got, f"get '{key}'")

    def _park(self, peer, k):
        if (self.closed or k in self._ud_of or k in self._arrived
                or len(self._ud_of) + len(self._arrived) >= self._limit):
            return
        ud = self._aq.get(peer, k[1], timeout=self._park_s)
        self._ud_of[k] = ud
        self._key_of[ud] = k

    # --- the connector's calls --------------------------------------------

    def poll(self, peer, sender, key):
        """The key's data (a Buffer) if it is here, else None (and a GET is
        left waiting for it). Raises what the GET raised."""
        k = (sender, key)
        with self._lock:
            got = self._open_reap_take(k, key)
            if got is not _MISSING:
                return got
            if k in self._ud_of:
                return None
        try:
            return self._engine.get(peer, key, nowait=True)
        except _ferry.FerryWouldBlockError:
            with self._lock:
                self._park(peer, k)
            return None

    def wait(self, peer, sender, key, timeout):
        """The key's data, waiting up to timeout seconds (None when it did not
        come). A GET parked for the key is cancelled first, so that the one
        that waits is the only one."""
        k = (sender, key)
        end = time.monotonic() + timeout
        with self._lock:
            got = self._open_reap_take(k, key)
            if got is not _MISSING:
                return got
            ud = self._ud_of.get(k)
            if ud is not None:
                self._aq.cancel(ud)
        if ud is not None:  # its last completion comes within a reactor round or two
            give_up = time.monotonic() + 2.0
            while True:
                with self._lock:
                    self._reap()
                    got = self._take(k, key)
                    if got is not _MISSING:
                        return got
                    if k not in self._ud_of:
                        break
                if time.monotonic() > give_up:
                    logger.warning("FerryConnector: the GET parked for %s did not end 2 s "
                                   "after its cancel; waiting beside it", key)
                    break
                time.sleep(0.0001)
        left = end - time.monotonic()
        if left <= 0:
            return None
        try:
            return self._engine.get(peer, key, timeout=left)
        except _ferry.FerryTimeoutError:
            return None

    def cleanup(self, request_id):
        """Let go of what arrived for the request (keys equal to it or starting
        with it and one of '_', ':', '/', '#'). Called after the engine's own
        cleanup, which ends the GETs still parked for it (-ECANCELED): what
        they took before it is in the queue by then, and reaped here."""
        prefixes = tuple(request_id + s for s in CLEANUP_SEPARATORS)
        with self._lock:
            if self.closed:
                return
            self._reap()
            for k in [k for k in self._arrived if k[1] == request_id
                      or k[1].startswith(prefixes)]:
                got = self._arrived.pop(k)
                if not isinstance(got, (int, bytes)):
                    got.release()

    def abandon(self, key):
        """Cancel the GETs parked for key (from any sender): what comes for it
        later stays in the engine, as if it had never been polled."""
        with self._lock:
            if self.closed:
                return
            for k, ud in list(self._ud_of.items()):
                if k[1] == key:
                    self._aq.cancel(ud)

    def stats(self):
        with self._lock:
            if not self.closed:
                self._reap()
            return {"parked": len(self._ud_of), "arrived": len(self._arrived)}

    def close(self):
        """Cancel the parked GETs, wait (up to 1 s) for them to end, let go of
        what arrived. The engine may be closed already: nothing is left then."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                for ud in list(self._key_of):
                    self._aq.cancel(ud)
                give_up = time.monotonic() + 1.0
                while self._key_of and time.monotonic() < give_up:
                    self._reap()
                    if self._key_of:
                        time.sleep(0.0005)
            except ValueError:  # the engine is closed: its ops and buffers went with it
                self._arrived.clear()
            if self._key_of:
                logger.warning("FerryConnector: %d parked GETs did not end at close",
                               len(self._key_of))
            for got in self._arrived.values():
                if not isinstance(got, (int, bytes)):
                    got.release()
            self._arrived.clear()

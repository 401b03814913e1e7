"""The GIL is released in every wait; threads have their own queues."""
import threading
import time

import pyferry


def test_gil_released_while_waiting(pair):
    _, c = pair
    done = threading.Event()
    err = []

    def waiter():
        try:
            c.get("prod", "absent", timeout=1.0)
        except TimeoutError:
            pass
        except Exception as e:  # pragma: no cover
            err.append(e)
        done.set()

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.05)
    n = 0
    while not done.is_set():  # pure Python: runs only if the waiter let go of the GIL
        n += 1
    t.join(5)
    assert not err
    assert n > 10000, n


def test_threads_wait_on_their_own_queues(pair):
    p, c = pair
    results = {}

    def consumer(i):
        with c.get("prod", f"t{i}", timeout=10) as b:
            results[i] = b.tobytes()

    ts = [threading.Thread(target=consumer, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    time.sleep(0.05)
    for i in reversed(range(8)):  # completions come in the other order
        p.put("cons", f"t{i}", str(i).encode())
    for t in ts:
        t.join(10)
    assert results == {i: str(i).encode() for i in range(8)}
    assert c._thread_cqs() == 8


def test_close_while_another_thread_waits_is_ebusy(ns):
    e = pyferry.Engine("busy", ns=ns, pool_size=1 << 20)
    t = threading.Thread(target=lambda: _swallow(lambda: e.get("x", "k", timeout=0.5)))
    t.start()
    time.sleep(0.1)
    try:
        e.close()
        closed_early = True
    except pyferry.FerryBusyError:
        closed_early = False
    t.join(5)
    e.close()
    assert not closed_early


def _swallow(fn):
    try:
        fn()
    except pyferry.FerryError:
        pass


class _Interrupted(Exception):
    pass


def test_signal_interrupts_and_cancels_a_wait(pair):
    import os
    import signal

    p, c = pair

    def handler(signum, frame):
        raise _Interrupted()

    old = signal.signal(signal.SIGUSR1, handler)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        t0 = time.monotonic()
        try:
            c.get("prod", "sig", timeout=30)
            raised = False
        except _Interrupted:
            raised = True
        assert raised and time.monotonic() - t0 < 5
    finally:
        signal.signal(signal.SIGUSR1, old)
    # the interrupted GET was cancelled in ferry: the key is there for the next one
    p.put("cons", "sig", b"after")
    assert c.get("prod", "sig", nowait=True).tobytes() == b"after"


def _wait_in_call(engine, thread, timeout=5.0):
    """Cancel thread's blocking call on engine as soon as it is waiting
    (Engine.cancel counts only calls waiting now); how many it cancelled."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = engine.cancel(thread)
        if n:
            return n
        time.sleep(0.01)
    return 0


def test_cancel_from_another_thread(pair):
    """Engine.cancel(thread) from another thread: that thread's blocking GET
    raises FerryCancelledError soon (not at its 20 s deadline), its ferry op
    is cancelled (a later put stays for the next GET), and the call of a
    thread that was not named goes on."""
    import errno

    p, c = pair
    got = {}

    def waiter(name, key):
        t0 = time.monotonic()
        try:
            got[name] = c.get("prod", key, timeout=20)
        except Exception as e:
            got[name] = e
        got[name + "_s"] = time.monotonic() - t0

    a = threading.Thread(target=waiter, args=("a", "xa"))
    b = threading.Thread(target=waiter, args=("b", "xb"))
    a.start()
    b.start()
    assert c.cancel(threading.Thread()) == 0  # not started: no ident, nothing waits
    t0 = time.monotonic()
    assert _wait_in_call(c, a) == 1
    a.join(5)
    assert not a.is_alive() and time.monotonic() - t0 < 2
    assert isinstance(got["a"], pyferry.FerryCancelledError), got["a"]
    assert got["a"].errno == errno.ECANCELED and "Engine.cancel" in str(got["a"])
    assert b.is_alive()  # only the named thread's call was cancelled
    p.put("cons", "xb", b"for b")
    b.join(5)
    assert got["b"].tobytes() == b"for b"
    got["b"].release()
    # a's GET is gone from ferry: its key waits for the next GET
    p.put("cons", "xa", b"after")
    with c.get("prod", "xa", nowait=True) as buf:
        assert buf.tobytes() == b"after"
    # a cancel while nothing waits does not touch the next call
    assert c.cancel() == 0
    p.put("cons", "xc", b"next")
    with c.get("prod", "xc", timeout=5) as buf:
        assert buf.tobytes() == b"next"


def test_cancel_all_and_a_stream(pair):
    """Engine.cancel() cancels every thread's wait, a stream iteration too;
    bad arguments are TypeError."""
    p, c = pair
    errs = []

    def get_it():
        try:
            c.get("prod", "never", timeout=20)
        except Exception as e:
            errs.append(e)

    def read_stream():
        try:
            for chunk in c.stream("prod", "s-never", timeout=20):
                chunk.release()
        except Exception as e:
            errs.append(e)

    ts = [threading.Thread(target=get_it), threading.Thread(target=read_stream)]
    for t in ts:
        t.start()
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in ts) and time.monotonic() < deadline:
        c.cancel()  # flags whoever waits now; a thread not yet waiting, next round
        time.sleep(0.02)
    for t in ts:
        t.join(5)
        assert not t.is_alive()
    assert len(errs) == 2 and all(isinstance(e, pyferry.FerryCancelledError) for e in errs), errs
    import pytest
    with pytest.raises(TypeError):
        c.cancel("thread 1")

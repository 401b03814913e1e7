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

"""pyferry.MessageQueue (vLLM's MessageQueue shape) over ferry's broadcast
channels: readers in real processes on this host (shm) and over tcp through
the control channel, every message to every reader in order, a response
queue per reader, timeouts, a dead writer."""
import os
import signal
import time

import pytest

import pyferry
from conftest import child, finish

READER = r"""
import sys, pickle, pyferry
handle = sys.stdin.readline().strip().encode()
rank = int(sys.argv[1]); n = int(sys.argv[2]); remote = sys.argv[3] == "1"
mq = pyferry.MessageQueue.create_from_handle(handle, rank, remote=remote)
mq.wait_until_ready(timeout=30)
# the response queue of this reader: the driver is its one reader
resp = pyferry.MessageQueue(1, 0 if remote else 1, ns=mq._ns, name="resp%d" % rank,
                            connect_ip="127.0.0.1" if remote else None)
print(resp.export_handle().decode(), flush=True)
resp.wait_until_ready(timeout=30)
for i in range(n):
    method, k, payload = mq.dequeue(timeout=30)
    assert method == "call" and k == i, (method, k, i)
    assert payload == bytes([i % 251]) * (i * 37 % 5000), i
    resp.enqueue(("ok", rank, k))
try:
    mq.dequeue(timeout=30)
except BrokenPipeError:
    print("closed", flush=True)
resp.flush(timeout=10)
resp.close()
mq.close()
"""


def run_fanout(nreaders, nmsgs, remote=False):
    kw = {"connect_ip": "127.0.0.1"} if remote else {}
    mq = pyferry.MessageQueue(nreaders, 0 if remote else nreaders, **kw)
    handle = mq.export_handle()
    assert isinstance(handle, bytes)
    kids = [child(READER, r, nmsgs, int(remote)) for r in range(nreaders)]
    for k in kids:
        k.send(handle.decode())
    resps = [pyferry.MessageQueue.create_from_handle(k.stdout.readline().strip().encode(),
                                                     remote=remote) for k in kids]
    mq.wait_until_ready(timeout=30)
    for r in resps:
        r.wait_until_ready(timeout=30)
    for i in range(nmsgs):
        mq.enqueue(("call", i, bytes([i % 251]) * (i * 37 % 5000)), timeout=30)
        for rank, r in enumerate(resps):
            assert r.dequeue(timeout=30) == ("ok", rank, i)
    st = mq.stats()
    assert st["written"] == nmsgs and st["live"] == nreaders and st["dead"] == 0
    mq.close()
    for k in kids:
        finish(k)
    for r in resps:
        r.close()


@pytest.mark.parametrize("n", [1, 4])
def test_local_readers(n):
    run_fanout(n, 50)


def test_remote_readers():
    if "control" not in pyferry.features():
        pytest.skip("built without libzmq")
    run_fanout(2, 20, remote=True)


def test_timeout_and_bad_handle(ns):
    mq = pyferry.MessageQueue(1, 1, ns=ns)
    with pytest.raises(TimeoutError):
        mq.wait_until_ready(timeout=0.2)
    with pytest.raises(ValueError):
        pyferry.MessageQueue.create_from_handle(b"garbage")
    with pytest.raises(pyferry.FerryNotConnectedError):
        mq.enqueue("too early")
    with pytest.raises(RuntimeError):
        mq.dequeue(timeout=0)
    rd = pyferry.MessageQueue.create_from_handle(mq.export_handle())
    mq.wait_until_ready(timeout=10)
    rd.wait_until_ready(timeout=10)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        rd.dequeue(timeout=0.3)
    assert time.monotonic() - t0 >= 0.25
    mq.enqueue({"a": 1})
    assert rd.dequeue(timeout=5) == {"a": 1}
    mq.close()
    with pytest.raises(BrokenPipeError):
        rd.dequeue(timeout=5)
    rd.close()


def test_manual_reader(ns):
    """A reader whose engine is caller-driven (progress="manual"): it attaches
    inside its own wait_until_ready, receives in order, sees the writer close."""
    import threading
    mq = pyferry.MessageQueue(1, 1, ns=ns)
    rd = pyferry.MessageQueue.create_from_handle(mq.export_handle(), progress="manual")
    with pytest.raises(TimeoutError):  # no reactor thread: not attached before its own call
        mq.wait_until_ready(timeout=0.5)
    t = threading.Thread(target=rd.wait_until_ready, kwargs={"timeout": 10})
    t.start()
    mq.wait_until_ready(timeout=10)
    t.join(10)
    assert not t.is_alive()
    # more than the window (10): the writer waits for the reader, whose
    # dequeues drive its engine (a writer thread, bounded)
    w = threading.Thread(target=lambda: [mq.enqueue(("msg", i), timeout=20) for i in range(50)])
    w.start()
    assert [rd.dequeue(timeout=20) for _ in range(50)] == [("msg", i) for i in range(50)]
    w.join(20)
    assert not w.is_alive()
    mq.close()
    with pytest.raises(BrokenPipeError):
        rd.dequeue(timeout=5)
    rd.close()
    with pytest.raises(ValueError):
        pyferry.MessageQueue.create_from_handle(b"garbage", progress="manual")


WRITER = r"""
import sys, os, pyferry
mq = pyferry.MessageQueue(1, 1)
print(mq.export_handle().decode(), flush=True)
mq.wait_until_ready(timeout=30)
mq.enqueue("one")
print("sent", flush=True)
sys.stdin.readline()
"""


def test_writer_killed():
    w = child(WRITER)
    handle = w.stdout.readline().strip().encode()
    rd = pyferry.MessageQueue.create_from_handle(handle)
    rd.wait_until_ready(timeout=30)
    assert rd.dequeue(timeout=30) == "one"
    assert w.stdout.readline().strip() == "sent"
    os.kill(w.pid, signal.SIGKILL)
    w.wait(timeout=30)
    t0 = time.monotonic()
    with pytest.raises(ConnectionResetError):
        rd.dequeue(timeout=10)
    assert time.monotonic() - t0 < 5
    rd.close()

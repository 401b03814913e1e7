"""Engines, peers, put/get of every kind of buffer, deadlines, errors."""
import errno
import threading

import numpy as np
import pytest

import pyferry


def test_lifecycle_and_context_manager(ns):
    e = pyferry.Engine("solo", ns=ns, pool_size=1 << 20)
    assert e.name == "solo" and not e.closed
    e.close()
    e.close()  # idempotent
    assert e.closed
    with pytest.raises(ValueError):
        e.put("x", "k", b"1")
    with pyferry.Engine("solo", ns=ns, pool_size=1 << 20) as e2:  # the name is free again
        assert not e2.closed
    assert e2.closed


@pytest.mark.parametrize("kw,exc,err", [
    (dict(name=""), pyferry.FerryError, errno.EINVAL),
    (dict(name="x" * 100), pyferry.FerryError, errno.ENAMETOOLONG),
    (dict(name="ok", ns="n" * 100), pyferry.FerryError, errno.ENAMETOOLONG),
    (dict(name="ok", listen="not-an-endpoint"), pyferry.FerryError, errno.EINVAL),
])
def test_bad_params_raise_with_errno(ns, kw, exc, err):
    kw.setdefault("ns", ns)
    with pytest.raises(exc) as ei:
        pyferry.Engine(pool_size=1 << 20, **kw)
    assert ei.value.errno == err
    assert isinstance(ei.value, OSError)
    assert ei.value.errname == errno.errorcode[err]


def test_bad_python_args(ns):
    with pytest.raises(ValueError):
        pyferry.Engine("e", ns=ns, progress="sometimes")
    with pytest.raises(ValueError):
        pyferry.Engine("e", ns=ns, pool_size=-1)
    with pytest.raises(TypeError):
        pyferry.Engine(ns=ns)
    with pyferry.Engine("e", ns=ns, pool_size=1 << 20) as e:
        with pytest.raises(TypeError):
            e.put(3, "k", b"x")
        with pytest.raises(TypeError):
            e.put("p", "k", 12345)  # no buffer protocol
        with pytest.raises(ValueError):
            e.get("p", "k", timeout=-1)
        with pytest.raises(ValueError):
            e.alloc(-5)


def test_duplicate_name_is_eaddrinuse(ns):
    with pyferry.Engine("dup", ns=ns, pool_size=1 << 20):
        with pytest.raises(pyferry.FerryAddressInUseError) as ei:
            pyferry.Engine("dup", ns=ns, pool_size=1 << 20)
        assert ei.value.errno == errno.EADDRINUSE


def test_put_get_every_buffer_kind(pair):
    p, c = pair
    cons = p.peer("cons")
    assert cons.name == "cons"
    payloads = {
        "bytes": b"hello",
        "bytearray": bytearray(b"\x00\x01\x02"),
        "memoryview": memoryview(b"abcdefgh")[2:6],
        "numpy": np.arange(16, dtype=np.float32),
        "empty": b"",
    }
    for key, data in payloads.items():
        assert p.put(cons, key, data) == memoryview(data).nbytes
    for key, data in payloads.items():
        with c.get("prod", key, timeout=5) as buf:
            assert bytes(memoryview(buf)) == memoryview(data).tobytes()
            assert len(buf) == memoryview(data).nbytes


def test_vectored_put(pair):
    p, c = pair
    parts = [b"head", bytearray(b"-"), np.array([1, 2], dtype=np.uint16), memoryview(b"tail")]
    assert p.put("cons", "vec", parts) == 4 + 1 + 4 + 4
    with c.get("prod", "vec", timeout=5) as buf:
        assert buf.tobytes() == b"head-" + np.array([1, 2], dtype=np.uint16).tobytes() + b"tail"
    with pytest.raises(ValueError):
        p.put("cons", "big", [b"x"] * 5000)


def test_get_into_and_emsgsize(pair):
    p, c = pair
    p.put("cons", "k", b"0123456789")
    small = bytearray(4)
    with pytest.raises(pyferry.FerryMessageSizeError) as ei:
        c.get("prod", "k", into=small)
    assert ei.value.errno == errno.EMSGSIZE
    assert "10 bytes" in str(ei.value)
    out = np.zeros(16, dtype=np.uint8)
    assert c.get("prod", "k", into=out) == 10  # the key stayed after EMSGSIZE
    assert out[:10].tobytes() == b"0123456789"
    with pytest.raises(BufferError):
        c.get("prod", "k", into=b"readonly")


def test_deadlines_nowait_exists_replace(pair):
    p, c = pair
    with pytest.raises(TimeoutError) as ei:  # FerryTimeoutError is a TimeoutError
        c.get("prod", "absent", timeout=0.05)
    assert ei.value.errno == errno.ETIMEDOUT and "absent" in str(ei.value)
    with pytest.raises(BlockingIOError) as ei:
        c.get("prod", "absent", nowait=True)
    assert ei.value.errno == errno.EAGAIN
    p.put("cons", "once", b"1")
    with pytest.raises(FileExistsError) as ei:
        p.put("cons", "once", b"2")
    assert ei.value.errno == errno.EEXIST
    p.put("cons", "once", b"3", replace=True)
    assert c.get("prod", "once").tobytes() == b"3"


def test_unreachable_and_long_key(pair):
    p, _ = pair
    with pytest.raises(pyferry.FerryUnreachableError) as ei:
        p.put("nobody", "k", b"x", timeout=5)
    assert ei.value.errno == errno.EHOSTUNREACH
    with pytest.raises(pyferry.FerryError) as ei:
        p.put("cons", "k" * 300, b"x")
    assert ei.value.errno == errno.ENAMETOOLONG


def test_cleanup_cancels_waiting_get(pair):
    p, c = pair
    p.put("cons", "req1_0", b"a")
    p.put("cons", "req1_1", b"b")
    assert c.cleanup("req1") == 2
    with pytest.raises(BlockingIOError):
        c.get("prod", "req1_0", nowait=True)


def test_manual_progress_mode(ns):
    # A MANUAL engine moves only inside its own calls (the waits drive it),
    # so its partner here is a THREAD engine.
    with pyferry.Engine("mp", ns=ns, progress="manual", pool_size=1 << 20) as m, \
            pyferry.Engine("mt", ns=ns, pool_size=1 << 20) as t:
        m.put("mt", "k", b"manual", timeout=5)
        with t.get("mp", "k", timeout=5) as b:
            assert b.tobytes() == b"manual"
        # a put into the MANUAL engine lands while its own get drives it
        th = threading.Thread(target=t.put, args=("mp", "back", b"thread"),
                              kwargs=dict(timeout=10))
        th.start()
        with m.get("mt", "back", timeout=10) as b:
            assert b.tobytes() == b"thread"
        th.join(10)
        m.nop()
        assert m.progress() >= 0


def test_health_and_addresses(ns):
    with pyferry.Engine("h", ns=ns, pool_size=1 << 20, listen="tcp://127.0.0.1:0") as e:
        h = e.health()
        assert h["pool"]["size"] >= 1 << 20
        assert e.address().startswith("tcp://127.0.0.1:")
        assert e.address() in e.addresses()
        assert e.control_address() is None


def test_tcp_peer_by_uri(ns):
    with pyferry.Engine("srv", ns=ns, pool_size=1 << 20, listen="tcp://127.0.0.1:0") as s, \
            pyferry.Engine("cli", ns=ns, pool_size=1 << 20) as c:
        peer = c.connect("srv", s.address())
        c.put(peer, "over-tcp", b"x" * 1000, timeout=10)
        assert s.get("cli", "over-tcp", timeout=10).tobytes() == b"x" * 1000
        with pytest.raises(pyferry.FerryError) as ei:
            c.connect("other", "gopher://x")
        assert ei.value.errno in (errno.EPROTONOSUPPORT, errno.EINVAL)


def test_single_poller(ns):
    # single_poller: the first thread that drives the engine is the only one
    # that may; another thread's call raises EPERM; submitting stays free.
    with pytest.raises(ValueError):
        pyferry.Engine("sp-t", ns=ns, pool_size=1 << 20, single_poller=True)
    with pyferry.Engine("sp", ns=ns, progress="manual", pool_size=1 << 20,
                        single_poller=True) as m, \
            pyferry.Engine("spt", ns=ns, pool_size=1 << 20) as t:
        assert m.health()["pollers"] == "single"
        assert t.health()["pollers"] == "any"
        m.put("spt", "k", b"single", timeout=5)
        with t.get("sp", "k", timeout=5) as b:
            assert b.tobytes() == b"single"
        errs = []

        def other():
            try:
                m.progress()
            except pyferry.FerryError as e:
                errs.append(e.errno)

        th = threading.Thread(target=other)
        th.start()
        th.join(10)
        assert errs == [errno.EPERM]
        # put and get from another thread: refused before anything is submitted
        got = []

        def other_ops():
            buf = bytearray(6)
            for call in (lambda: m.put("spt", "x", b"nope", timeout=1),
                         lambda: m.get("spt", "k2", into=buf, timeout=1),
                         lambda: m.nop()):
                try:
                    call()
                except pyferry.FerryError as e:
                    got.append(e.errno)

        submitted = m.health()["ops"]["submitted"]
        th = threading.Thread(target=other_ops)
        th.start()
        th.join(10)
        assert got == [errno.EPERM] * 3
        for _ in range(10):
            m.progress()  # nothing of theirs was left queued for the poller to take
        assert m.health()["ops"]["submitted"] == submitted
        assert m.health()["ops"]["in_flight"] == 0
        # a put into it lands while its poller's own get drives it
        th = threading.Thread(target=t.put, args=("sp", "back", b"thread"),
                              kwargs=dict(timeout=10))
        th.start()
        with m.get("spt", "back", timeout=10) as b:
            assert b.tobytes() == b"thread"
        th.join(10)

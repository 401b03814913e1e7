"""Two real processes: shared memory (by name) and tcp (by address)."""
import numpy as np

import pyferry
from conftest import child, finish, mapping_of

PRODUCER = """
import sys, numpy as np, pyferry
ns, mode = sys.argv[1], sys.argv[2]
kw = dict(listen="tcp://127.0.0.1:0") if mode == "tcp" else {}
with pyferry.Engine("child", ns=ns, pool_size=8 << 20, **kw) as e:
    print(e.address() or "-", flush=True)
    peer = e.peer("parent")
    if mode == "tcp":
        peer.connect(sys.stdin.readline().strip())
    buf = e.alloc(1 << 20)
    np.frombuffer(buf, dtype=np.uint8)[:] = np.arange(1 << 20) % 251
    e.put(peer, "big", buf, timeout=20, wait_peer=True)
    e.put(peer, "vec", [b"a" * 10, b"b" * 20], timeout=20, wait_peer=True)
    for i in range(4):
        e.put_chunk(peer, "s", bytes([i]) * 100, end=(i == 3), timeout=20, wait_peer=True)
    e.get(peer, "done", timeout=20).release()   # keep the pool mapped until the parent is done
"""


def expected():
    return (np.arange(1 << 20) % 251).astype(np.uint8)


def test_shm_zero_copy_across_processes(ns):
    with pyferry.Engine("parent", ns=ns, pool_size=8 << 20) as e:
        proc = child(PRODUCER, ns, "shm")
        got = e.get("child", "big", timeout=30)
        # the child's pool, mapped read-only here: no byte was copied
        line = mapping_of(got.address)
        assert line is not None and "memfd:child" in line and line.split()[1].startswith("r-"), line
        assert got.readonly
        assert np.array_equal(np.frombuffer(got, dtype=np.uint8), expected())
        got.release()
        assert e.get("child", "vec", timeout=30).tobytes() == b"a" * 10 + b"b" * 20
        chunks = [b.tobytes() for b in e.stream("child", "s", timeout=30)]
        assert chunks == [bytes([i]) * 100 for i in range(4)]
        e.put("child", "done", b"", timeout=30)
        finish(proc)


def test_tcp_across_processes(ns):
    with pyferry.Engine("parent", ns=ns, pool_size=8 << 20,
                        listen="tcp://127.0.0.1:0") as e:
        proc = child(PRODUCER, ns, "tcp")
        assert proc.stdout.readline().startswith("tcp://127.0.0.1:")
        proc.send(e.address())  # the child reads our address from stdin
        got = e.get("child", "big", timeout=30)
        assert np.array_equal(np.frombuffer(got, dtype=np.uint8), expected())
        assert "memfd:parent" in mapping_of(got.address)  # received into our own pool
        got.release()
        assert e.get("child", "vec", timeout=30).tobytes() == b"a" * 10 + b"b" * 20
        assert [b.tobytes() for b in e.stream("child", "s", timeout=30)] == \
            [bytes([i]) * 100 for i in range(4)]
        e.put("child", "done", b"", timeout=30)
        finish(proc)

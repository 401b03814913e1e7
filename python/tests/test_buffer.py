"""Buffers: ferry's pool memory through the buffer protocol, zero copy."""
import gc

import numpy as np
import pytest

import pyferry
from conftest import mapping_of, pool_bytes_in_use, pool_settles


def test_alloc_views_share_memory(pair):
    p, _ = pair
    buf = p.alloc(64)
    assert len(buf) == 64 and not buf.readonly and buf.exports == 0
    arr = np.frombuffer(buf, dtype=np.uint8)     # no copy: numpy sees ferry's memory
    assert arr.ctypes.data == buf.address
    m = memoryview(buf)
    m[0:4] = b"abcd"
    assert arr[:4].tobytes() == b"abcd"
    assert buf.exports == 2
    with pytest.raises(BufferError):
        buf.release()
    del arr, m
    gc.collect()
    buf.release()
    buf.release()  # idempotent
    assert buf.released
    with pytest.raises(BufferError):
        memoryview(buf)


def test_alloc_lies_in_the_pool_mapping(pair):
    p, _ = pair
    with p.alloc(4096) as buf:
        line = mapping_of(buf.address)
        assert line is not None and "memfd:prod" in line, line


def test_zero_copy_put_get_same_memory(pair):
    p, c = pair
    start = pool_bytes_in_use(p)
    buf = p.alloc(1 << 16)
    np.frombuffer(buf, dtype=np.uint8)[:] = 7
    addr = buf.address
    assert p.put("cons", "zc", buf) == 1 << 16
    assert buf.released  # ownership went to ferry
    got = c.get("prod", "zc", timeout=5)
    assert got.readonly
    assert got.address == addr  # the very bytes the producer wrote: no copy
    assert "memfd:prod" in mapping_of(got.address)
    view = np.frombuffer(got, dtype=np.uint8)
    assert view.ctypes.data == addr and int(view.sum()) == 7 << 16
    with pytest.raises(BufferError):
        got.release()  # numpy still exports it
    del view
    got.release()
    assert pool_settles([p], start)


def test_exported_buffer_cannot_be_put(pair):
    p, _ = pair
    buf = p.alloc(16)
    m = memoryview(buf)
    with pytest.raises(BufferError):
        p.put("cons", "k", buf)
    assert not buf.released
    m.release()
    p.put("cons", "k", buf)


def test_received_buffer_is_not_put_zero_copy(pair):
    p, c = pair
    p.put("cons", "k", b"abc")
    got = c.get("prod", "k")
    with pytest.raises(BufferError):
        c.put("prod", "back", got)
    c.put("prod", "back", memoryview(got))  # its bytes can be
    got.release()


def test_collected_buffer_goes_back(pair):
    p, c = pair
    start = pool_bytes_in_use(c) + pool_bytes_in_use(p)
    for i in range(50):
        p.put("cons", f"k{i}", b"x" * 3000)
        c.get("prod", f"k{i}")  # dropped at once: collected, released
    p.alloc(1000)
    gc.collect()
    assert pool_settles([p, c], start)


def test_set_len_and_exhaustion(pair):
    p, c = pair
    buf = p.alloc(100)
    buf.set_len(10)
    assert len(buf) == 10
    with pytest.raises(pyferry.FerryMessageSizeError):
        buf.set_len(10 ** 6)
    p.put("cons", "short", buf)
    assert len(c.get("prod", "short")) == 10
    with pytest.raises(pyferry.FerryNoMemoryError):
        p.alloc(1 << 30)


def test_buffer_outlives_engine(ns):
    p = pyferry.Engine("bp", ns=ns, pool_size=1 << 20)
    c = pyferry.Engine("bc", ns=ns, pool_size=1 << 20)
    p.put("bc", "k", b"survivor")
    got = c.get("bp", "k")
    c.close()
    p.close()
    assert got.tobytes() == b"survivor"
    got.release()

"""Streams: put_chunk with an end flag, the iterator of chunks."""
import errno

import pytest

import pyferry
from conftest import pool_bytes_in_use, pool_settles


def test_chunks_in_order_with_end(pair):
    p, c = pair
    it = c.stream("prod", "req1_0", timeout=5)
    for i in range(5):
        assert p.put_chunk("cons", "req1_0", bytes([i]) * (i + 1), end=(i == 4)) == i
    got = []
    for buf in it:
        got.append(buf.tobytes())
        buf.release()  # gives the credit back
    assert got == [bytes([i]) * (i + 1) for i in range(5)]
    assert it.last_index == 4
    with pytest.raises(StopIteration):
        next(it)


def test_more_chunks_than_credits(pair):
    p, c = pair
    p.peer("cons").set_stream_limits(per_stream=2)
    it = c.stream("prod", "credit", timeout=5)
    for i in range(2):
        p.put_chunk("cons", "credit", b"x", timeout=5)
    with pytest.raises(TimeoutError):  # no credit until the consumer releases one
        p.put_chunk("cons", "credit", b"y", timeout=0.2)
    it.close()


def test_abort_carries_reason(pair):
    p, c = pair
    it = c.stream("prod", "ab", timeout=5)
    p.put_chunk("cons", "ab", b"first")
    p.abort_stream("cons", "ab", "model crashed")
    assert next(it).tobytes() == b"first"
    with pytest.raises(pyferry.FerryCancelledError) as ei:
        next(it)
    assert ei.value.errno == errno.ECANCELED and "model crashed" in str(ei.value)


def test_gap_timeout(pair):
    p, c = pair
    it = c.stream("prod", "gap", timeout=0.1)
    p.put_chunk("cons", "gap", b"a")
    assert next(it).tobytes() == b"a"
    with pytest.raises(TimeoutError):
        next(it)


def test_close_early_returns_memory(pair):
    p, c = pair
    start = pool_bytes_in_use(p) + pool_bytes_in_use(c)
    with c.stream("prod", "early", timeout=5) as it:
        for i in range(3):
            p.put_chunk("cons", "early", b"z" * 5000)
        next(it).release()
    assert pool_settles([p, c], start)

"""No leaks: 100k small puts/gets return every buffer; RSS stays bounded
(not checked under asan.sh: ASan's quarantine keeps freed memory)."""
import os
import resource

from conftest import pool_bytes_in_use, pool_settles


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def test_100k_put_get(pair):
    p, c = pair
    payload = b"x" * 64
    start = (pool_bytes_in_use(p), pool_bytes_in_use(c))
    for i in range(2000):  # warm up (allocator, caches)
        p.put("cons", "w", payload)
        c.get("prod", "w").release()
    rss0 = rss_kib()
    for i in range(100_000):
        p.put("cons", "k", payload)
        with c.get("prod", "k") as b:
            if i % 10000 == 0:
                assert b.tobytes() == payload
    grown = rss_kib() - rss0
    assert pool_settles([p, c], sum(start))
    if os.environ.get("FERRY_TEST_ASAN") != "1":
        assert grown < 8 * 1024, f"RSS grew {grown} KiB"
    h = c.health()
    assert h["pool"]["bad_frees"] == 0

"""Fixtures of pyferry's tests: every test gets its own FERRY_RUNTIME_DIR
(tmp_path) and namespace; children are real processes (subprocess) bounded
in time; pytest-timeout bounds every test (pyproject.toml: 120 s)."""
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

import pyferry


@pytest.fixture(autouse=True)
def runtime_dir(tmp_path, monkeypatch):
    d = tmp_path / "run"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("FERRY_RUNTIME_DIR", str(d))
    return d


@pytest.fixture
def ns():
    return "py-" + uuid.uuid4().hex[:12]


@pytest.fixture
def pair(ns):
    """Two engines of one process (the loop transport): (producer, consumer)."""
    p = pyferry.Engine("prod", ns=ns, pool_size=8 << 20)
    c = pyferry.Engine("cons", ns=ns, pool_size=8 << 20)
    yield p, c
    c.close()
    p.close()


def child(code, *args, timeout=60):
    """Start `python -c code args...` (a real process); returns the Popen.
    proc.send(line) writes a line to its stdin."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ))

    def send(line):
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    proc.send = send
    return proc


def finish(proc, timeout=60):
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"child timed out\nstdout:{out}\nstderr:{err}")
    assert proc.returncode == 0, f"child exit {proc.returncode}\nstdout:{out}\nstderr:{err}"
    return out


def pool_bytes_in_use(engine):
    return engine.health()["pool"]["bytes_in_use"]


def mapping_of(address):
    """The /proc/self/maps line whose range holds address (None: none)."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return line.strip()
    return None


def pool_settles(engines, want, timeout=5.0):
    """Whether the pools' bytes_in_use come back to want within timeout: a
    buffer lent by another engine goes home asynchronously once released."""
    import time
    deadline = time.monotonic() + timeout
    while True:
        now = sum(pool_bytes_in_use(e) for e in engines)
        if now == want:
            return True
        if time.monotonic() > deadline:
            print("bytes_in_use", now, "want", want)
            return False
        time.sleep(0.01)

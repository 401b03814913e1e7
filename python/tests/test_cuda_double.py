"""pyferry.cuda driven through a TEST DOUBLE of the CUDA runtime
(tests/cuda_double/cudart_double.c, compiled here: host memory behind
"device" pointers, completions from its own threads). It tests the
binding's logic (the array interface read, put_device/get_device, the
caller's stream first, the refusals), NOT a GPU. Each case runs in a child
process: ferry loads its CUDA runtime once per process."""
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import pytest
from conftest import finish

import pyferry
import pyferry.cuda as fc

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def double(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler for the CUDA runtime double")
    out = tmp_path_factory.mktemp("cudadouble") / "libcudart_double.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-fvisibility=hidden", "-pthread", "-D_GNU_SOURCE",
                    "-I", str(ROOT / "engine"), "-o", str(out),
                    str(ROOT / "tests/cuda_double/cudart_double.c")], check=True, timeout=120)
    return str(out)


PRELUDE = textwrap.dedent("""
    import ctypes, errno, sys, pyferry, pyferry.cuda as fc
    dbl = ctypes.CDLL(sys.argv[1])
    dbl.cudadouble_malloc.restype = ctypes.c_void_p
    dbl.cudadouble_malloc.argtypes = [ctypes.c_int, ctypes.c_size_t]
    class Dev:                      # a CUDA array as CuPy or torch show one
        def __init__(self, n, dev=0):
            self.n, self.ptr = n, dbl.cudadouble_malloc(dev, n)
            self.device = type("D", (), {"index": dev})()
            self.__cuda_array_interface__ = {"data": (self.ptr, False), "shape": (n,),
                                             "typestr": "|u1", "version": 3}
        def fill(self, b): ctypes.memmove(self.ptr, b, len(b))
        def bytes(self, n=None): return ctypes.string_at(self.ptr, self.n if n is None else n)
""")


def run(double, ns, body):
    code = PRELUDE + textwrap.dedent(body)
    env = dict(os.environ, FERRY_CUDA_RUNTIME=double, NS=ns)
    p = subprocess.run([sys.executable, "-c", code, double], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_double_put_get_device(double, ns):
    out = run(double, ns, """
        import os
        assert fc.available()
        a = pyferry.Engine("a", ns=os.environ["NS"], pool_size=8 << 20)
        b = pyferry.Engine("b", ns=os.environ["NS"], pool_size=8 << 20)
        src, dst = Dev(3 << 20), Dev(4 << 20)
        data = bytes((i * 7 + (i >> 9)) & 255 for i in range(3 << 20))
        src.fill(data)
        assert fc.put_tensor(a, "b", "kv", src) == 3 << 20
        assert fc.get_into(b, "a", "kv", dst, timeout=5) == 3 << 20
        assert dst.bytes(3 << 20) == data
        # device -> host: a plain get of a device PUT
        fc.put_tensor(a, "b", "k2", src)
        with b.get("a", "k2", timeout=5) as buf:
            assert bytes(memoryview(buf)) == data
        # host -> device
        a.put("b", "k3", b"host bytes")
        assert fc.get_into(b, "a", "k3", dst, timeout=5) == 10
        assert dst.bytes(10) == b"host bytes"
        # too small a destination
        fc.put_tensor(a, "b", "k4", src)
        small = Dev(100)
        try:
            fc.get_into(b, "a", "k4", small, timeout=5)
            raise SystemExit("no EMSGSIZE")
        except pyferry.FerryError as e:
            assert e.errno == errno.EMSGSIZE, e
        h = a.health()
        print("cuda-puts", h["cuda"]["puts"])
        a.close(); b.close()
    """)
    assert "cuda-puts 3" in out


def test_double_caller_stream_first(double, ns):
    run(double, ns, """
        import os, threading, time
        dbl.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        dbl.cudadouble_gate.argtypes = [ctypes.c_void_p]
        dbl.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                        ctypes.c_int, ctypes.c_void_p]
        a = pyferry.Engine("a", ns=os.environ["NS"], pool_size=8 << 20)
        b = pyferry.Engine("b", ns=os.environ["NS"], pool_size=8 << 20)
        src, dst = Dev(4096), Dev(4096)
        src.fill(b"old" * 1000)
        st = ctypes.c_void_p()
        assert dbl.cudaStreamCreateWithFlags(ctypes.byref(st), 1) == 0
        fresh = ctypes.create_string_buffer(b"new" * 1365, 4096)
        dbl.cudadouble_gate_close()
        dbl.cudadouble_gate(st)                            # the producer's long kernel
        dbl.cudaMemcpyAsync(src.ptr, fresh, 4096, 4, st)   # ... writes the tensor
        threading.Timer(0.2, dbl.cudadouble_gate_open).start()
        t0 = time.monotonic()
        fc.put_tensor(a, "b", "t", src, stream=st.value)
        assert time.monotonic() - t0 >= 0.15
        fc.get_into(b, "a", "t", dst, timeout=5)
        assert dst.bytes() == fresh.raw
        a.close(); b.close()
    """)


def test_double_refusals(double, ns):
    run(double, ns, """
        import os
        a = pyferry.Engine("a", ns=os.environ["NS"], pool_size=8 << 20)
        host = ctypes.create_string_buffer(64)
        try:
            a.put_device("b", "k", ctypes.addressof(host), 64)
            raise SystemExit("host memory taken for device memory")
        except pyferry.FerryError as e:
            assert e.errno == errno.EINVAL, e
        try:
            fc.device_memory(b"bytes")
            raise SystemExit("bytes taken for device memory")
        except TypeError:
            pass
        a.close()
    """)


def test_no_cuda_runtime(ns, monkeypatch):
    """Without a runtime (FERRY_CUDA_RUNTIME=none): unavailable, ENODEV, the rest unchanged."""
    code = textwrap.dedent("""
        import errno, os, pyferry, pyferry.cuda as fc
        assert not fc.available()
        a = pyferry.Engine("a", ns=os.environ["NS"], pool_size=1 << 20)
        try:
            a.put_device("b", "k", 4096, 64)
            raise SystemExit("no ENODEV")
        except pyferry.FerryError as e:
            assert e.errno == errno.ENODEV, e
        a.close()
    """)
    env = dict(os.environ, FERRY_CUDA_RUNTIME="none", NS=ns)
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


CONNECTOR_RAW = textwrap.dedent("""
    import os, pyferry.connector as pc
    c = pc.FerryConnector({"stage_id": 0, "role": "sender", "namespace": os.environ["NS"],
                           "pool_size": 1 << 20})
    # what upstream's KV transfer reads (an instance attribute, through getattr)
    print("raw", getattr(c, "supports_raw_data", None), pc.FerryConnector.supports_raw_data)
    c.close()
""")


def test_connector_supports_raw_data_with_cuda(double, ns):
    """With a CUDA runtime that sees a device (the DOUBLE here): upstream may hand device tensors."""
    out = run(double, ns, CONNECTOR_RAW)
    assert "raw True False" in out


def test_connector_supports_raw_data_without_cuda(double, ns):
    """The double with no device, and no runtime at all: bytes, not device tensors."""
    env = dict(os.environ, FERRY_CUDA_RUNTIME=double, FERRY_CUDA_DOUBLE_DEVICES="0", NS=ns)
    p = subprocess.run([sys.executable, "-c", CONNECTOR_RAW], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "raw False False" in p.stdout
    env = dict(os.environ, FERRY_CUDA_RUNTIME="none", NS=ns)
    p = subprocess.run([sys.executable, "-c", CONNECTOR_RAW], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "raw False False" in p.stdout


def test_double_get_buffer_device_memory(double, ns, tmp_path):
    """pyferry.cuda.get_buffer across two processes (the double's IPC): the
    Buffer is the sender's device memory itself (its array interface names
    it, the buffer protocol refuses it), and the sender's put_tensor returns
    only once the Buffer is released."""
    stamp = tmp_path / "released"
    recv = subprocess.Popen([sys.executable, "-c", PRELUDE + textwrap.dedent("""
        import os, time
        b = pyferry.Engine("gbr", ns=os.environ["NS"], pool_size=8 << 20)
        print("up", flush=True)
        buf = fc.get_buffer(b, "gbs", "kv", timeout=20)
        cai = buf.__cuda_array_interface__
        assert buf.device == 0 and cai["shape"] == (300000,) and cai["typestr"] == "|u1", cai
        want = bytes((i * 7 + (i >> 9)) & 255 for i in range(300000))
        assert ctypes.string_at(cai["data"][0], 300000) == want   # (the double's memory is host)
        for read in (memoryview, lambda x: x.tobytes()):
            try:
                read(buf)
                raise SystemExit("the CPU got to read device memory")
            except BufferError:
                pass
        assert b.health()["cuda"]["handouts_out"] == 1
        time.sleep(0.3)                                  # the sender's put still waits
        with open(sys.argv[2], "w") as f:
            f.write(repr(time.monotonic()))
        buf.release()
        assert buf.device == -1 and not hasattr(buf, "__cuda_array_interface__")
        h = b.get("gbs", "host", timeout=20, device_buf=True)   # host data: a host Buffer
        assert h.device == -1 and bytes(memoryview(h)) == b"host bytes"
        h.release()
        b.close()
        print("ok", flush=True)
    """), double, str(stamp)], env=dict(os.environ, FERRY_CUDA_RUNTIME=double, NS=ns),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_up(recv)
    out = run(double, ns, """
        import os, time
        a = pyferry.Engine("gbs", ns=os.environ["NS"], pool_size=8 << 20)
        src = Dev(300000)
        src.fill(bytes((i * 7 + (i >> 9)) & 255 for i in range(300000)))
        assert fc.put_tensor(a, "gbr", "kv", src, timeout=20, wait_peer=True) == 300000
        print("put-ended", repr(time.monotonic()))
        a.put("gbr", "host", b"host bytes", wait_peer=True)
        print("ipc", a.health()["cuda"]["ipc_puts"])
        a.close()
    """)
    assert "ok" in finish(recv)
    ended = float(out.split("put-ended ")[1].split()[0])
    assert ended >= float(stamp.read_text()), "the sender's put ended before the release"
    assert "ipc 1" in out, out


def test_double_get_buffer_refusals(double, ns):
    run(double, ns, """
        import os
        a = pyferry.Engine("a", ns=os.environ["NS"], pool_size=8 << 20)
        try:
            a.get("b", "k", into=bytearray(8), device_buf=True)
            raise SystemExit("device_buf with into= taken")
        except ValueError:
            pass
        a.close()
    """)


# --- FerryConnector: CUDA arrays sent as device memory (pyferry._device) ------------
# Two processes, the DOUBLE as their runtime: the sender's array goes by CUDA IPC
# (the double maps the sender's memfd), the receiver here has no torch, so it takes
# the part into host memory (ferry asks the sender for a staged copy). This tests
# the connector's logic, not a GPU: tests/gpu/py_check.py does that with torch.

CONN_PRELUDE = PRELUDE + textwrap.dedent("""
    import json, os, time, pyferry.connector as pc
    NS = os.environ["NS"]
    def conn(stage, **kw):
        return pc.FerryConnector(dict({"stage_id": stage, "namespace": NS,
                                       "pool_size": 8 << 20}, **kw))
    def pattern(n, seed):
        return bytes((i * 7 + seed + (i >> 9)) & 255 for i in range(n))
""")


def spawn(double, ns, body):
    code = CONN_PRELUDE + textwrap.dedent(body)
    env = dict(os.environ, FERRY_CUDA_RUNTIME=double, NS=ns)
    return subprocess.Popen([sys.executable, "-c", code, double], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_up(p):
    """Read the child's lines until it says "up" (its connector's engine is
    there: a PUT to a peer not up yet is staged, not sent by IPC)."""
    for line in p.stdout:
        if line.strip() == "up":
            return
    raise AssertionError("the receiver ended before it was up: " + p.stderr.read())


def test_connector_device_parts_two_processes(double, ns):
    """A payload with a CUDA array: the array goes as a device PUT of its own
    (held until the receiver read it), the frame names it; the receiver gets
    the same bytes, viewed as the array's dtype and shape."""
    recv = spawn(double, ns, """
        c = conn(1)
        print("up", flush=True)
        got = c.get_with_deadline("0", "1", "req1", deadline=time.monotonic() + 20)
        assert got is not None, "nothing came"
        payload, size = got
        kv = payload["kv"]
        assert payload["meta"] == {"layer": 3}, payload
        assert kv.dtype.name == "float32" and kv.shape == (25000, 3), (kv.dtype, kv.shape)
        assert kv.view("uint8").tobytes() == pattern(300000, 5)
        print("size", size)
        print("health", json.dumps(c.health()["device_parts"]))
        c.close()
    """)
    wait_up(recv)
    send = spawn(double, ns, """
        c = conn(0)
        assert c.supports_raw_data and c.health()["device_puts"] is True
        a = Dev(300000)
        a.fill(pattern(300000, 5))
        a.__cuda_array_interface__.update(shape=(25000, 3), typestr="<f4")
        ok, size, meta = c.put("0", "1", "req1", {"kv": a, "meta": {"layer": 3}})
        assert ok and size > 300000, (ok, size)
        assert c.engine().health()["cuda"]["ipc_puts"] == 1   # by CUDA IPC
        end = time.monotonic() + 20            # held until the receiver has read it
        while c.health()["device_parts"]["out"] and time.monotonic() < end:
            time.sleep(0.01)
        print("health", json.dumps(c.health()["device_parts"]))
        print("restaged", c.engine().health()["cuda"]["ipc_restaged"])
        c.close()
    """)
    out_s, out_r = finish(send), finish(recv)
    assert 'health {"out": 0, "sent": 1, "failed": 0, "through_host": 0}' in out_s, out_s
    assert "restaged 1" in out_s, out_s   # the receiver (no torch) took it in host memory
    assert "size 300" in out_r and '"sent": 0' in out_r, out_r


def test_connector_device_parts_bounded(double, ns):
    """device_puts_max: a producer whose parts are all out waits for its
    receiver to read one before the next goes (no unbounded holding)."""
    recv = spawn(double, ns, """
        c = conn(1)
        print("up", flush=True)
        time.sleep(1.0)                       # the producer runs ahead meanwhile
        for i in range(3):
            print("read", i, time.monotonic())  # from now on r{i}'s part may be read
            got = c.get_with_deadline("0", "1", f"r{i}", deadline=time.monotonic() + 20)
            assert got is not None and got[0]["x"].tobytes() == pattern(5000, i), i
        c.close()
    """)
    wait_up(recv)
    send = spawn(double, ns, """
        c = conn(0, device_puts_max=1, put_timeout=20)
        arrays = []
        for i in range(3):
            a = Dev(5000)
            a.fill(pattern(5000, i))
            arrays.append(a)
            ok, _, _ = c.put("0", "1", f"r{i}", {"x": a})
            assert ok, i
            print("put", i, time.monotonic())
        c.close()
    """)
    out_s, out_r = finish(send), finish(recv)
    put = {int(l.split()[1]): float(l.split()[2]) for l in out_s.splitlines() if l.startswith("put")}
    read = {int(l.split()[1]): float(l.split()[2]) for l in out_r.splitlines() if l.startswith("read")}
    # Each put after the first returned only after the receiver began to read the one
    # before (it held the only slot): causal order, one clock (CLOCK_MONOTONIC) for both.
    assert put[1] >= read[0] and put[2] >= read[1], (put, read)


def test_connector_more_parts_than_the_bound(double, ns):
    """A payload with more CUDA parts than device_puts_max can never fit: put does
    not wait for room it cannot get (arrays that cannot go through the host fail
    it at once, logged)."""
    out = run(double, ns, CONN_PRELUDE.replace(PRELUDE, "") + textwrap.dedent("""
        c = conn(0, device_puts_max=1, put_timeout=20)
        a, b = Dev(4096), Dev(4096)
        t0 = time.monotonic()
        ok, size, _ = c.put("0", "1", "two", {"a": a, "b": b})
        print("took", time.monotonic() - t0, ok, c.health()["device_parts"])
        c.close()
    """))
    took, ok = out.split()[1:3]
    assert ok == "False" and float(took) < 10, out   # not put_timeout (20 s) later
    assert "'through_host': 1" in out and "'sent': 0" in out, out

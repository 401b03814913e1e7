"""FerryConnector (pyferry.connector): vLLM-Omni's connector calls over ferry.

In-process cases use two stages of one process (the loop transport); the
two-process cases run a producer stage in a child over shm and over tcp with
the chunk adapter's keys ("{req}_{stage}_{chunk}", get polled without metadata).
vllm_omni itself is not installed here: register() is checked against a
stand-in factory with upstream's duplicate-name rule.
"""
import dataclasses
import errno
import subprocess
import sys
import threading
import time
import types

import msgpack
import numpy as np
import pytest

import pyferry
from pyferry import _payload
from pyferry.connector import FerryConnector, RawPayload
from conftest import child, finish, mapping_of, pool_settles

BIG = 1 << 20


@pytest.fixture
def stages(ns):
    """(stage 0, stage 1) connectors of one process."""
    p = FerryConnector({"stage_id": 0, "role": "sender", "namespace": ns, "pool_size": 32 << 20})
    c = FerryConnector({"stage_id": 1, "role": "receiver", "namespace": ns,
                        "pool_size": 32 << 20})
    yield p, c
    c.close()
    p.close()


def roundtrip(p, c, key, data):
    ok, size, meta = p.put("0", "1", key, data)
    assert ok and size > 0 and meta["size"] == size
    got = c.get("0", "1", key)
    assert got is not None and got[1] == size
    return got[0]


class FakeStruct:
    """What a msgspec Struct with omit_defaults looks like to the encoder."""
    __struct_fields__ = ("kind", "hidden", "meta", "ids")
    __struct_defaults__ = (None, None, None)
    __struct_config__ = types.SimpleNamespace(omit_defaults=True)

    def __init__(self, kind, hidden=None, meta=None, ids=None):
        self.kind, self.hidden, self.meta, self.ids = kind, hidden, meta, ids


@dataclasses.dataclass
class DC:
    a: int
    b: bytes


def test_every_payload_kind_round_trips(stages):
    p, c = stages
    big = bytes(range(256)) * (BIG // 256)
    # bytes-like roots come back as a RawPayload (small or large)
    for i, raw in enumerate([b"", b"abc", big, bytearray(big), memoryview(big)[5:70000]]):
        got = roundtrip(p, c, f"raw{i}", raw)
        assert isinstance(got, RawPayload) and bytes(got) == bytes(raw) and len(got) == len(raw)
        got.release()
    # numpy roots and fields: dtype, shape, values exactly
    arrays = [np.arange(300000, dtype=np.float32).reshape(300, 1000), np.arange(5, dtype=np.int64),
              np.array(3.5), np.zeros((0, 4), dtype=np.uint16),
              np.arange(200000, dtype=np.float64).reshape(400, 500)[:, ::2]]  # non-contiguous
    for i, a in enumerate(arrays):
        got = roundtrip(p, c, f"arr{i}", a)
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)
    # a dict like the chunk adapter's, a Struct, a dataclass, tuples, slices
    payload = {"meta": {"finished": True, "chunk_seq": 3, "req_id": ["r1"]},
               "ids": {"prompt": [1, 2, 3]}, "big": big, "small": b"xy",
               "arr": arrays[0], "pair": (1, (2, 3)), "sl": slice(1, 9, 2), "none": None,
               "f": 1.25, "s": "ünï", "np_scalar": np.int32(7)}
    got = roundtrip(p, c, "dict", payload)
    assert isinstance(got, dict)
    assert got["meta"] == payload["meta"] and got["ids"] == payload["ids"]
    assert isinstance(got["big"], memoryview) and got["big"] == big
    assert got["small"] == b"xy" and type(got["small"]) is bytes
    assert np.array_equal(got["arr"], arrays[0])
    assert got["pair"] == [1, [2, 3]] and got["sl"] == [1, 9, 2] and got["none"] is None
    assert got["f"] == 1.25 and got["s"] == "ünï" and got["np_scalar"] == 7
    got["new"] = 1  # the result is a mutable dict, as upstream's callers expect
    s = FakeStruct("chunk", hidden=np.ones(4, np.float32), meta={"finished": False})
    got = roundtrip(p, c, "struct", s)
    assert set(got) == {"kind", "hidden", "meta"} and got["kind"] == "chunk"  # defaults omitted
    assert np.array_equal(got["hidden"], np.ones(4, np.float32))
    assert roundtrip(p, c, "dc", DC(1, b"q")) == {"a": 1, "b": b"q"}
    assert roundtrip(p, c, "list", [1, "a", [b"b"]]) == [1, "a", [b"b"]]


def test_tensors_round_trip(stages):
    torch = pytest.importorskip("torch")
    p, c = stages
    ts = [torch.arange(300000, dtype=torch.float32).reshape(300, 1000),
          torch.tensor(True), torch.zeros(0, 3), torch.arange(10, dtype=torch.bfloat16),
          torch.arange(100000, dtype=torch.int64)[::3]]
    for i, t in enumerate(ts):
        got = roundtrip(p, c, f"t{i}", {"codes": {"audio": t}})["codes"]["audio"]
        assert isinstance(got, torch.Tensor) and got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got, t)
    raw = roundtrip(p, c, "kv", bytes(BIG))
    assert raw.tensor.dtype == torch.uint8 and raw.tensor.numel() == BIG  # KV's ManagedBuffer shape
    raw.release()


def test_get_polls_none_until_the_key_is_there(stages):
    p, c = stages
    key = "req7_0_0"
    for _ in range(3):
        assert c.get("0", "1", key) is None          # the chunk adapter polls again
    assert c.get("0", "1", key, {"source_host": "h", "source_port": 1}) is None
    ok, _, meta = p.put("0", "1", key, {"meta": {"finished": False}, "n": 1})
    payload, size = c.get("0", "1", key)
    assert payload == {"meta": {"finished": False}, "n": 1}
    assert c.get("0", "1", key) is None               # a get consumes the key
    p.put("0", "1", "req7_0_1", b"x")
    assert bytes(c.get("0", "1", "req7_0_1", meta)[0]) == b"x"  # metadata is optional
    assert c.health()["get_errors"] == 0  # "not there yet" is no error


def test_get_with_deadline_blocks_releases_the_gil_and_times_out(stages):
    p, c = stages
    ticks = [0]
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            ticks[0] += 1
            time.sleep(0.001)
    t = threading.Thread(target=spin)
    t.start()
    try:
        t0 = time.monotonic()
        assert c.get_with_deadline("0", "1", "late_0_0", deadline=t0 + 0.5) is None
        waited = time.monotonic() - t0
        assert 0.45 <= waited < 2.0, waited
        assert ticks[0] >= 50, ticks[0]  # the other thread ran while we waited
        # an elapsed deadline is one look, no wait
        t0 = time.monotonic()
        assert c.get_with_deadline("0", "1", "late_0_0", deadline=t0 - 1) is None
        assert time.monotonic() - t0 < 0.2
        # data that comes while it waits ends the wait
        threading.Timer(0.2, p.put, ("0", "1", "late_0_1", {"v": 1})).start()
        t0 = time.monotonic()
        got = c.get_with_deadline("0", "1", "late_0_1", None, deadline=t0 + 10)
        assert got[0] == {"v": 1} and time.monotonic() - t0 < 5
    finally:
        stop.set()
        t.join()


def test_cleanup_drops_a_requests_keys(stages):
    p, c = stages
    start = sum(e.health()["pool"]["bytes_in_use"] for e in (p.engine(), c.engine()))
    for i in range(3):
        p.put("0", "1", f"reqA_0_{i}", {"big": bytes(BIG)})
    p.put("0", "1", "reqB_0_0", {"v": 2})
    c.cleanup("reqA_0_1")                          # upstream's exact key: that one only
    assert c.get("0", "1", "reqA_0_1") is None
    c.cleanup("reqA")                              # the request: all its chunks
    assert c.get("0", "1", "reqA_0_0") is None and c.get("0", "1", "reqA_0_2") is None
    assert c.get("0", "1", "reqB_0_0")[0] == {"v": 2}
    assert pool_settles([p.engine(), c.engine()], start)


def test_close_is_idempotent_and_engines_are_shared(ns):
    with FerryConnector({"stage_id": 0, "namespace": ns}) as a:
        b = FerryConnector({"stage_id": 0, "namespace": ns})  # same stage: the same engine
        assert a.engine() is b.engine()
        b.close()
        b.close()
        assert not a.engine().closed  # still a's
        assert a.health()["status"] == "healthy"
    a.close()
    assert a.closed and a.health()["status"] == "closed"
    with pytest.raises(ValueError, match="closed"):
        a.put("0", "1", "k", b"x")
    with pytest.raises(ValueError, match="closed"):
        a.get("1", "0", "k")
    c = FerryConnector({"stage_id": 0, "namespace": ns})  # the name is free again
    del c  # __del__ closes


def test_close_cancels_a_call_still_waiting(ns):
    """close() while another thread waits in get_with_deadline: that call is
    cancelled (it returns None) and the engine goes now, so the stage can be
    opened again."""
    cfg = {"stage_id": 1, "namespace": ns, "pool_size": 4 << 20}
    a = FerryConnector(cfg)
    out = []

    def waiter():
        try:
            out.append(a.get_with_deadline(0, 1, "k", deadline=time.monotonic() + 30))
        except Exception as e:
            out.append(e)
    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    a.close()
    b = FerryConnector(cfg)   # the engine's name is free again at once
    b.close()
    t.join(10)
    assert not t.is_alive()   # cancelled, long before its 30 s deadline
    assert out == [None]      # a failed get is None (and logged), as upstream's


def test_deadline_nan_is_refused(stages):
    _, c = stages
    with pytest.raises(ValueError, match="NaN"):
        c.get_with_deadline("0", "1", "k", deadline=float("nan"))


def test_zero_copy_send_and_receive(stages, monkeypatch):
    p, c = stages
    big = np.random.default_rng(1).integers(0, 255, 8 << 20, dtype=np.uint8).tobytes()
    packed = []
    real_packb = _payload.msgpack.packb
    monkeypatch.setattr(_payload.msgpack, "packb",
                        lambda *a, **k: packed.append(real_packb(*a, **k)) or packed[-1])
    sent = []
    real_send = p._send
    monkeypatch.setattr(p, "_send", lambda eng, peer, key, parts: (sent.append(list(parts)),
                                                                   real_send(eng, peer, key,
                                                                             parts)))
    ok, size, _ = p.put("0", "1", "zc_0_0", {"meta": {"finished": True}, "audio": big})
    assert ok and size >= len(big)
    # send side: no blob of the payload's size was packed; the PUT's parts
    # include the bytes object's own memory
    assert max(map(len, packed)) < 4096, max(map(len, packed))
    assert any(isinstance(x, memoryview) and x.obj is big for x in sent[0]), sent[0]
    # receive side: a read-only view inside ferry's pool memory
    got, _ = c.get("0", "1", "zc_0_0")
    view = got["audio"]
    assert isinstance(view, memoryview) and view.readonly and view == big
    addr = np.frombuffer(view, dtype=np.uint8).ctypes.data
    line = mapping_of(addr)
    assert line is not None and "memfd:stage" in line, line


def test_views_hold_the_buffer_and_release_returns_it(stages):
    p, c = stages
    engines = [p.engine(), c.engine()]
    start = sum(e.health()["pool"]["bytes_in_use"] for e in engines)
    p.put("0", "1", "h_0_0", {"a": bytes(BIG), "b": np.ones(BIG, np.uint8)})
    got, _ = c.get("0", "1", "h_0_0")
    b = got["b"]
    del got
    time.sleep(0.05)
    assert not pool_settles(engines, start, timeout=0.2)  # the array still uses it
    assert b.sum() == BIG
    del b
    assert pool_settles(engines, start)
    p.put("0", "1", "h_0_1", bytes(BIG))
    raw, _ = c.get("0", "1", "h_0_1")
    arr = raw.numpy()
    assert raw.release() is False  # a view is alive: not freed under it
    assert arr[0] == 0 and not pool_settles(engines, start, timeout=0.2)
    del arr
    assert pool_settles(engines, start)
    p.put("0", "1", "h_0_2", bytes(BIG))
    with c.get("0", "1", "h_0_2")[0] as raw:
        assert len(raw) == BIG
    assert raw.released and pool_settles(engines, start)


def test_zero_copy_off_gives_private_copies(ns):
    p = FerryConnector({"stage_id": 0, "namespace": ns})
    c = FerryConnector({"stage_id": 1, "namespace": ns, "zero_copy": False})
    try:
        start = sum(e.health()["pool"]["bytes_in_use"] for e in (p.engine(), c.engine()))
        p.put("0", "1", "k", {"a": bytes(BIG), "b": np.ones(BIG // 8)})
        got, _ = c.get("0", "1", "k")
        assert type(got["a"]) is bytes and got["b"].sum() == BIG // 8
        assert pool_settles([p.engine(), c.engine()], start)  # released while got lives
    finally:
        c.close()
        p.close()


def test_many_cycles_return_the_pool_to_its_start(stages):
    p, c = stages
    engines = [p.engine(), c.engine()]
    start = sum(e.health()["pool"]["bytes_in_use"] for e in engines)
    big = np.ones(256 << 10, np.uint8)
    for i in range(3000):
        data = {"meta": {"i": i}, "arr": big} if i % 10 == 0 else {"meta": {"i": i}}
        assert p.put("0", "1", f"L_0_{i}", data)[0]
        got, _ = c.get("0", "1", f"L_0_{i}")
        assert got["meta"]["i"] == i
        del got
    assert pool_settles(engines, start)
    h = c.health()
    assert h["gets"] == 3000 and h["engines"]["stage1.rank0"]["pool"]["alloc_failures"] == 0


def test_bad_input_raises_clear_errors(stages, ns):
    p, c = stages
    with pytest.raises(TypeError, match="put_key must be a str"):
        p.put("0", "1", 5, b"x")
    with pytest.raises(ValueError, match="1 to 127 bytes"):
        p.put("0", "1", "k" * 128, b"x")
    with pytest.raises(ValueError, match="1 to 127 bytes"):
        c.get("0", "1", "")
    with pytest.raises(TypeError, match="from_stage must be a stage id"):
        p.put(None, "1", "k", b"x")
    # valid stage ids are remembered; a bool equal to one of them is still refused
    assert p.put(0, 1, "k-int", b"x")[0] and c.get(0, 1, "k-int") is not None
    with pytest.raises(TypeError, match="from_stage must be a stage id"):
        p.put(False, 1, "k", b"x")
    with pytest.raises(TypeError, match="to_stage must be a stage id"):
        p.put(0, True, "k", b"x")
    with pytest.raises(ValueError, match="bad to_stage"):
        p.put("0", "1/2", "k", b"x")
    with pytest.raises(TypeError, match="cannot send an object of type object"):
        p.put("0", "1", "k", {"x": object()})
    with pytest.raises(TypeError, match="dtype object"):
        p.put("0", "1", "k", np.array([object()]))
    with pytest.raises(ValueError, match="deeper than"):
        loop = []
        loop.append(loop)
        p.put("0", "1", "k", loop)
    with pytest.raises(TypeError, match="metadata must be a dict"):
        c.get("0", "1", "k", ["meta"])
    with pytest.raises(TypeError, match="deadline"):
        c.get_with_deadline("0", "1", "k", deadline="soon")
    with pytest.raises(ValueError, match="unknown transport 'udp'"):
        FerryConnector({"stage_id": 0, "namespace": ns, "transport": "udp"})
    with pytest.raises(TypeError, match="must be a URI or a list of URIs"):
        FerryConnector({"stage_id": 0, "namespace": ns, "transport": "tcp", "peers": {1: 5}})
    with pytest.raises(ValueError, match="is not a URI"):
        FerryConnector({"stage_id": 0, "namespace": ns, "transport": "tcp",
                        "listen": "127.0.0.1:0"})
    with pytest.raises(TypeError, match="config must be a dict"):
        FerryConnector(["stage_id", 0])
    with pytest.raises(ValueError, match="other settings"):
        FerryConnector({"stage_id": 0, "namespace": ns, "transport": "tcp"})  # stage 0 is shm here
    # a put ferry cannot deliver is upstream's (False, 0, None), logged
    q = FerryConnector({"stage_id": 5, "namespace": ns, "put_timeout": 0.3})
    try:
        assert q.put("5", "6", "k", b"x") == (False, 0, None)  # nobody is stage 6
        assert q.health()["put_failures"] == 1
    finally:
        q.close()
    # something that is no FerryConnector frame: None (logged), counted
    c.engine().peer("stage0.rank0")
    p.engine().put("stage1.rank0", "junk", b"not a frame", timeout=5)
    assert c.get("0", "1", "junk") is None and c.health()["get_errors"] == 1


class _Received(bytearray):
    """A received buffer as _payload.decode takes it (buffer, len, release)."""
    released = False

    def release(self):
        self.released = True


@pytest.mark.parametrize("n", [0, 1, 2, 3, 12, 63, 64, 65, 250, 251, 252, 255, 256, 4096,
                               65000])
def test_small_bytes_frames_are_the_general_encoders(n, monkeypatch):
    """The small-bytes path (written from a cached prefix, read by prefix)
    gives the frame the general encoder gives, byte for byte, and reads back
    what it wrote; the general decoder reads it too."""
    data = bytes((i * 7 + n) & 0xFF for i in range(n))
    fast, fast_size = _payload.encode(data, 1 << 20)
    general, general_size = _payload.Encoder(1 << 20).encode(data)
    assert fast == general and fast_size == general_size
    buf = _Received(fast[0])
    got, size = _payload.decode(buf)
    assert isinstance(got, RawPayload) and bytes(got) == data and size == fast_size
    assert buf.released  # an inline payload is a private copy: the buffer goes back
    monkeypatch.setattr(_payload, "_small_raw", lambda buf: None)
    got, _ = _payload.decode(_Received(fast[0]))
    assert bytes(got) == data


def test_frames_near_the_small_bytes_form_go_to_the_general_decoder():
    """Frames that look like the small-bytes form but are not it (a table
    entry, a cut header, a wrong ext type) are not taken by its reader."""
    frame = bytearray(_payload.encode(b"x" * 64, 1 << 20)[0][0])
    ok = _payload._small_raw(bytes(frame))
    assert ok == b"x" * 64
    wrong_type = bytearray(frame)
    wrong_type[11] = _payload.EXT_NDARRAY  # the ext's type byte (ext 8: c7, length, type)
    assert _payload._small_raw(bytes(wrong_type)) is None
    with pytest.raises(_payload.FrameError):
        _payload.decode(_Received(wrong_type))
    cut = bytes(frame[:40])  # the header says more than there is
    assert _payload._small_raw(cut) is None
    with pytest.raises(_payload.FrameError):
        _payload.decode(_Received(cut))
    # hostile headers the general decoder meets: FrameError, never another error
    def frame_of(root):
        header = b"\x92" + msgpack.packb(root, use_bin_type=True) + msgpack.packb([])
        return _Received(b"FYC1" + len(header).to_bytes(4, "little") + header)
    for root in (msgpack.ExtType(_payload.EXT_NDARRAY, msgpack.packb(["zz", [1], None, b"x"])),
                 msgpack.ExtType(_payload.EXT_NDARRAY, msgpack.packb([None])),
                 msgpack.ExtType(_payload.EXT_RAW, msgpack.packb(5)),
                 msgpack.ExtType(_payload.EXT_RAW, msgpack.packb([7])),
                 msgpack.ExtType(_payload.EXT_TENSOR, msgpack.packb(["float32", [9], None, b"x"]))):
        with pytest.raises(_payload.FrameError):
            _payload.decode(frame_of(root))
    # a segment-carrying frame (its table is not empty) is the general one's
    seg_parts, _ = _payload.encode(b"y" * 128, 64)
    seg = b"".join(bytes(x) for x in seg_parts)
    assert _payload._small_raw(seg) is None


@pytest.mark.parametrize("n", [0, 4, 12, 64, 255, 256, 300])
def test_the_small_bytes_reader_takes_nothing_else(n):
    """The C reader of the small-bytes frame (_ext/frame.c) on every cut and
    every one-byte change of a frame: the bytes, only where the frame is still
    exactly one the encoder writes (a change inside the data, or in the
    padding after the header), else None; never an error. The same payload
    with a header msgpack would not write (ext 16 or bin 16 for a length that
    fits a shorter one) is not taken either."""
    data = bytes((i * 5 + 1) & 0xFF for i in range(n))
    frame = _payload.encode(data, 1 << 20)[0][0]
    assert _payload._small_raw(frame) == data
    assert _payload._small_raw(bytearray(frame)) == data
    assert _payload._small_raw(memoryview(frame)) == data
    end = 8 + int.from_bytes(frame[4:8], "little")
    start = end - 1 - n  # where the data begins
    for cut in range(len(frame)):
        got = _payload._small_raw(frame[:cut])
        assert got is None or (cut >= end and got == data), cut
    for i in range(len(frame)):
        for flip in (0x01, 0x80):
            bad = bytearray(frame)
            bad[i] ^= flip
            got = _payload._small_raw(bytes(bad))
            if start <= i < end - 1:
                assert got == bytes(bad[start:end - 1]), i
            elif i >= end:
                assert got == data, i
            else:
                assert got is None, (i, flip)
    # the same root with a longer (non-canonical) bin or ext header
    def frame_with(bin_header, ext16):
        body = b"\x92\xc0" + bin_header + data
        ext = (b"\xc8" + len(body).to_bytes(2, "big") if ext16 or len(body) > 0xFF else
               b"\xc7" + bytes((len(body),))) + bytes((_payload.EXT_RAW,))
        header = b"\x92" + ext + body + b"\x90"
        return b"FYC1" + len(header).to_bytes(4, "little") + header
    if n < 0x100:
        assert _payload._small_raw(frame_with(b"\xc5" + n.to_bytes(2, "big"), False)) is None
    if 2 + 2 + n < 0x100 and 2 + 2 + n not in (4, 8, 16):
        assert _payload._small_raw(frame_with(b"\xc4" + bytes((n,)), False)) == data
        assert _payload._small_raw(frame_with(b"\xc4" + bytes((n,)), True)) is None
    with pytest.raises(TypeError):
        _payload._small_raw("not a buffer")


def test_the_methods_of_upstreams_base(stages):
    p, _ = stages
    for name in ("put", "get", "get_with_deadline", "cleanup", "health", "close", "abandon_get",
                 "reap_consumed", "_make_key", "__enter__", "__exit__", "__del__"):
        assert callable(getattr(FerryConnector, name)), name
    # Per instance: whether ferry's CUDA runtime sees a device (test_cuda_double.py, both ways).
    assert FerryConnector.supports_raw_data is False
    assert p.supports_raw_data is pyferry.cuda.available()
    assert p._make_key("r1", "0", "1") == "r1@0_1"
    assert p.stage_id == 0 and p.role == "sender" and p.config["stage_id"] == 0
    p.abandon_get("anything")
    p.reap_consumed()


def test_importing_pyferry_imports_no_connector_dependency():
    code = ("import sys, pyferry; bad = [m for m in ('pyferry.connector', 'msgpack', 'torch', "
            "'vllm', 'vllm_omni') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_register_with_upstreams_factory(monkeypatch):
    from importlib.metadata import entry_points
    for group in ("vllm.general_plugins", "vllm_omni.general_plugins"):
        eps = [ep for ep in entry_points(group=group) if ep.name == "ferry"]
        assert eps and eps[0].value == "pyferry.connector:register", group

    import pyferry.connector as pc
    assert pc.register() is False  # no vllm_omni here
    factory = types.ModuleType("vllm_omni.distributed.omni_connectors.factory")

    class OmniConnectorFactory:  # upstream's rule: a duplicate name raises
        _registry = {}

        @classmethod
        def register_connector(cls, name, ctor):
            if name in cls._registry:
                raise ValueError(f"Connector '{name}' is already registered.")
            cls._registry[name] = ctor

        @classmethod
        def list_registered_connectors(cls):
            return list(cls._registry)
    factory.OmniConnectorFactory = OmniConnectorFactory
    for name in ("vllm_omni", "vllm_omni.distributed", "vllm_omni.distributed.omni_connectors"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, factory.__name__, factory)
    assert pc.register() is True and pc.register() is True
    assert list(OmniConnectorFactory._registry) == ["FerryConnector", "RayConnector",
                                                    "FerryRayConnector"]
    conn = OmniConnectorFactory._registry["FerryConnector"]({"stage_id": 3,
                                                              "namespace": "py-reg-test"})
    assert isinstance(conn, FerryConnector) and conn.stage_id == 3
    conn.close()


PRODUCER = """
import sys, time, numpy as np
from pyferry.connector import FerryConnector
ns, mode, req = sys.argv[1], sys.argv[2], sys.argv[3]
extra = {"stage_id": 0, "role": "sender", "namespace": ns, "pool_size": 16 << 20,
         "transport": mode}
if mode != "shm":
    extra["peers"] = {"1": sys.stdin.readline().strip()}
with FerryConnector(extra) as conn:
    for chunk in range(5):
        payload = {"meta": {"finished": chunk == 4, "chunk_seq": chunk},
                   "codes": {"audio": (np.arange(1 << 18, dtype=np.int32) + chunk)},
                   "ids": {"prompt": [chunk] * 3}}
        ok, size, meta = conn.put("0", "1", f"{req}_0_{chunk}", payload)
        assert ok, chunk
    print("sent", conn.health()["routes"]["0->1"], flush=True)
    sys.stdin.readline()   # keep the pool until the parent is done with its views
"""


def consume(conn, req, timeout=30):
    got = []
    chunk = 0
    deadline = time.monotonic() + timeout
    while chunk < 5:  # the chunk adapter's loop: get without metadata, poll again on None
        r = conn.get("0", "1", f"{req}_0_{chunk}")
        if r is None:
            assert time.monotonic() < deadline, f"chunk {chunk} never came"
            time.sleep(0.001)
            continue
        got.append(r[0])
        chunk += 1
    for i, payload in enumerate(got):
        assert payload["meta"] == {"finished": i == 4, "chunk_seq": i}
        assert payload["ids"] == {"prompt": [i] * 3}
        assert np.array_equal(payload["codes"]["audio"], np.arange(1 << 18, dtype=np.int32) + i)
    return got


def test_two_processes_over_shm(ns):
    with FerryConnector({"stage_id": 1, "role": "receiver", "namespace": ns,
                         "pool_size": 16 << 20}) as conn:
        proc = child(PRODUCER, ns, "shm", "reqS")
        got = consume(conn, "reqS")
        addr = got[0]["codes"]["audio"].ctypes.data
        line = mapping_of(addr)  # the producer's pool, mapped read-only here: no copy
        assert line is not None and "memfd:stage0.rank0" in line and \
            line.split()[1].startswith("r-"), line
        del got
        proc.send("done")
        finish(proc)


def producer_to_listener(ns, mode, req):
    """A receiving stage 1 of this process listening on tcp://127.0.0.1:0
    (transport mode), the PRODUCER child sending to its address: (the
    /proc/self/maps line of the first chunk's array here, the child's
    output)."""
    with FerryConnector({"stage_id": 1, "role": "receiver", "namespace": ns,
                         "transport": mode, "listen": "tcp://127.0.0.1:0",
                         "pool_size": 16 << 20}) as conn:
        addr = conn.address()
        assert addr.startswith("tcp://127.0.0.1:")
        proc = child(PRODUCER, ns, mode, req)
        proc.send(addr)
        got = consume(conn, req)
        line = mapping_of(got[0]["codes"]["audio"].ctypes.data)
        del got
        proc.send("done")
        return line, finish(proc)


def test_two_processes_over_tcp(ns):
    line, out = producer_to_listener(ns, "tcp", "reqT")
    assert "memfd:stage1.rank0" in line and out.split() == ["sent", "tcp"]


# --- transport rdma and auto ---------------------------------------------
# This host has no RDMA device (the real-verbs case runs in the RDMA guest:
# tests/rdma-vm/py_connector.py); FERRY_RDMA_SYSFS, which the stage YAML and the
# rdma transport read as well, makes "no device" certain here.

@pytest.fixture
def no_rdma(tmp_path, monkeypatch):
    d = tmp_path / "no-infiniband"
    d.mkdir()
    monkeypatch.setenv("FERRY_RDMA_SYSFS", str(d))
    return d


def own_ipv4():
    """An IPv4 address of this host other than loopback (None: none)."""
    import socket
    for fam, _, _, _, sa in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
        if not sa[0].startswith("127."):
            return sa[0]
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        return line.split()[3].split("/")[0]
    return None


def peer_entry(conn, peer_name):
    eng = next(iter(conn.health()["engines"].values()))
    return next(p for p in eng["peers"] if p["name"] == peer_name)


def test_engine_rdma_listen_is_checked(ns, no_rdma):
    with pytest.raises(TypeError, match="rdma_listen"):
        pyferry.Engine("e", ns=ns, rdma_listen=5)
    with pytest.raises(ValueError, match="rdma_listen must be 'rdma://ADDRESS:PORT'"):
        pyferry.Engine("e", ns=ns, rdma_listen="tcp://127.0.0.1:0")
    built = "rdma" in pyferry.features()
    with pytest.raises(pyferry.FerryError) as ei:
        pyferry.Engine("e", ns=ns, rdma_listen="rdma://no-port")
    assert ei.value.errno == (errno.EINVAL if built else errno.EPROTONOSUPPORT), ei.value
    assert ("rdma://ADDRESS:PORT?" if built else "no rdma transport") in str(ei.value)
    with pytest.raises(pyferry.FerryError) as ei:
        pyferry.Engine("e", ns=ns, rdma_listen="rdma://127.0.0.1:0")
    assert ei.value.errno == (errno.EADDRNOTAVAIL if built else errno.EPROTONOSUPPORT), ei.value
    assert ("no RDMA device here" if built else "no rdma transport") in str(ei.value)
    with pyferry.Engine("e", ns=ns, rdma_listen=None) as e:  # None: no rdma listener
        assert e.addresses() == []


def test_transport_rdma_without_a_device_is_tcp_with_a_warning(ns, no_rdma, caplog):
    with caplog.at_level("WARNING", logger="pyferry.connector"):
        c = FerryConnector({"stage_id": 1, "role": "receiver", "namespace": ns,
                            "transport": "rdma", "listen": "rdma://127.0.0.1:0",
                            "pool_size": 8 << 20})
    assert "transport rdma but no RDMA device" in caplog.text and "tcp instead" in caplog.text
    try:
        addr = c.address()
        assert addr.startswith("tcp://127.0.0.1:"), addr  # the same HOST:PORT, over tcp
        assert c.health()["fell_back"] is True and c.health()["rdma"] is False
        port = addr.rsplit(":", 1)[1]
        with FerryConnector({"stage_id": 0, "namespace": ns, "transport": "rdma",
                             "peers": {"1": f"rdma://127.0.0.1:{port}"}}) as p:
            roundtrip(p, c, "r1", {"a": np.arange(100000)})
            assert p.health()["routes"] == {"0->1": "tcp"}
            e = peer_entry(p, "stage1.rank0")
            assert e["transport"] == "tcp" and e["addresses"] == [addr], e
    finally:
        c.close()


def test_transport_rdma_with_a_device_that_cannot_be_opened_fails(ns, tmp_path, monkeypatch):
    d = tmp_path / "infiniband"
    (d / "rxe0").mkdir(parents=True)  # sysfs says a device; the verbs find none here
    monkeypatch.setenv("FERRY_RDMA_SYSFS", str(d))
    if "rdma" not in pyferry.features():
        with pytest.raises(pyferry.FerryError, match="no rdma transport") as ei:
            FerryConnector({"stage_id": 0, "namespace": ns, "transport": "rdma"})
        assert ei.value.errno == errno.EPROTONOSUPPORT
        return
    with pytest.raises(pyferry.FerryError, match="no RDMA device here") as ei:
        FerryConnector({"stage_id": 0, "namespace": ns, "transport": "rdma",
                        "listen": "rdma://127.0.0.1:0"})
    assert ei.value.errno == errno.EADDRNOTAVAIL  # not a silent fallback
    from pyferry import connector
    assert not connector._engines  # nothing left open


def test_transport_auto_on_one_host_is_shm(ns, no_rdma):
    # the peer's address is on this host: auto takes shm all the same
    line, out = producer_to_listener(ns, "auto", "reqA")
    assert line is not None and "memfd:stage0.rank0" in line, line  # the sender's pool
    assert out.split() == ["sent", "shm"]


def test_transport_auto_across_hosts_is_tcp_without_rdma(ns, no_rdma, monkeypatch):
    ip = own_ipv4()
    if ip is None:
        pytest.skip("this host has no address but loopback")
    monkeypatch.setenv("FERRY_SECRET", "auto-across-hosts-test")  # not loopback: a secret
    with FerryConnector({"stage_id": 1, "role": "receiver", "namespace": ns,
                         "transport": "auto", "listen": f"tcp://{ip}:0",
                         "pool_size": 8 << 20}) as c:
        addr = c.address()
        assert addr.startswith(f"tcp://{ip}:") and " " not in addr, addr  # no device: no rdma
        # the receiver's address set may name rdma; without a device here it is left out
        with FerryConnector({"stage_id": 0, "namespace": ns, "transport": "auto",
                             "peers": {"1": [f"rdma://{ip}:4791", addr]}}) as p:
            roundtrip(p, c, "x1", {"a": np.arange(50000), "b": b"y" * 100})
            assert p.health()["routes"] == {"0->1": "tcp"}
            e = peer_entry(p, "stage1.rank0")
            assert e["transport"] == "tcp" and e["addresses"] == [addr], e


def test_device_config_refused(ns):
    for bad, err in (({"device_puts": "yes"}, TypeError), ({"device_puts_max": 0}, ValueError),
                     ({"device": "cuda:0"}, TypeError), ({"device": True}, TypeError),
                     ({"device_snapshot": 1}, TypeError)):
        with pytest.raises(err):
            FerryConnector(dict({"stage_id": 0, "namespace": ns}, **bad))


def test_cuda_frame_refused_without_fetch():
    """A frame naming a CUDA tensor sent apart: decoded only with a fetch; a
    malformed CUDA value is a FrameError."""
    import msgpack
    from pyferry import _payload

    class Buf(bytearray):
        released = False

        def release(self):
            self.released = True

    def frame(body):
        root = msgpack.ExtType(_payload.EXT_CUDA, msgpack.packb(body))
        header = b"\x92" + msgpack.packb(root) + msgpack.packb([])
        return Buf(_payload._PREFIX.pack(_payload.MAGIC, len(header)) + header)

    with pytest.raises(_payload.FrameError, match="fetches none"):
        _payload.decode(frame(["uint8", [4], 0, 4]))
    seen = []

    def fetch(key, i, n):
        seen.append((key, i, n))
        np = pytest.importorskip("numpy")
        return np.arange(n, dtype=np.uint8)

    out, size = _payload.decode(frame(["uint16", [2], 0, 4]), fetch=fetch, key="kv")
    assert seen == [("kv", 0, 4)] and out.dtype.name == "uint16" and out.shape == (2,)
    assert size == len(frame(["uint16", [2], 0, 4])) + 4   # the part's bytes counted
    for bad in (["uint8", [4], -1, 4], ["uint8", [4], 0, 0], ["uint8", "x", 0, 4], ["uint8", [4], 0],
                [1, [4], 0, 4]):
        with pytest.raises(_payload.FrameError):
            _payload.decode(frame(bad), fetch=fetch)
    with pytest.raises(_payload.FrameError, match="not its length"):
        _payload.decode(frame(["uint8", [5], 0, 4]), fetch=fetch)

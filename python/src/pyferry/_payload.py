"""pyferry._payload: the wire format of FerryConnector's payloads (encode to
the parts of one vectored PUT, decode from one received Buffer).

Upstream (vLLM-Omni's OmniSerializer) packs a whole payload, tensor bytes
included, into one msgpack blob. Here only a small msgpack header is built;
every large bytes-like, numpy array or torch tensor of the payload is sent
as a segment of its own, straight from the object's memory (the PUT's
vectored copy into the pool is the only copy), and the receiver rebuilds it
as a read-only view of the received buffer (no copy either).

A frame, as the receiver's buffer holds it:

    0   4  magic  b"FYC1"
    4   4  H, the header's length (unsigned, little endian)
    8   H  the header: msgpack of [root, [[offset, length], ...]]
    ...    zero padding up to D = the first multiple of 64 at or after 8 + H
    D+off  segment i (offsets relative to D, each a multiple of 64)

`root` is the payload with each special value replaced by an ExtType:
    1 RAW     bytes-like; data: msgpack [seg] (a segment) or [None, bytes]
    2 NDARRAY data: msgpack [dtype.str, shape, seg, inline-bytes-or-None]
    3 TENSOR  data: msgpack [dtype name, shape, seg, inline-bytes-or-None]
    4 CUDA    a torch CUDA tensor sent apart, as device memory (encode_device):
              data: msgpack [dtype name, shape, index, nbytes]; its bytes are
              the PUT of key "<key>#cuda<index>", which goes before the frame
              (decode's fetch takes it)
msgspec Structs (their non-default fields, as msgspec encodes them with
omit_defaults), dataclasses and mappings become maps; tuples become lists
(as in upstream's msgpack round trip); a slice becomes [start, stop, step].
Everything else msgpack takes as it is (None, bool, int, float, str,
small bytes).

Decoding: a segment comes back as a read-only memoryview slice of the
received buffer (nested RAW), a read-only numpy array over it (NDARRAY), a
torch tensor over it (TENSOR; numpy when torch is not importable), or,
at the root, a RawPayload (RAW). Views keep the received Buffer alive; it
goes back to ferry when the last one is collected (RawPayload.release() for
the root kind). With copy=True every segment is copied out and the buffer
is released before decode returns.
"""
import dataclasses
import functools
import struct
import sys
import warnings

import msgpack

from ._ferry import _small_raw

MAGIC = b"FYC1"
ALIGN = 64
EXT_RAW, EXT_NDARRAY, EXT_TENSOR, EXT_CUDA = 1, 2, 3, 4
MAX_PARTS = 1024  # the binding's vectored-put limit (PYF_IOV_MAX)
_ZEROS = bytes(ALIGN)
MAX_DEPTH = 64
_PREFIX = struct.Struct("<4sI")


class Encoder:
    """One payload's encoding: encode(obj) gives the parts of its PUT."""

    def __init__(self, min_segment, device=False):
        self.min_segment = min_segment
        self.device = device   # CUDA tensors go apart as device memory (else .cpu())
        self.device_parts = []  # (contiguous CUDA tensor or array, nbytes), by index
        self.segs = []    # (offset in the data area, memory, length)
        self.offset = 0   # where the next segment may start
        self.max_segs = (MAX_PARTS - 1) // 2  # a segment may need a pad part
        self.np = sys.modules.get("numpy")
        self.torch = sys.modules.get("torch")  # a tensor implies torch was imported

    def _segment(self, mem, n):
        """The index of a new segment for mem (n bytes), or None: inline it."""
        if n == 0 or n < self.min_segment or len(self.segs) >= self.max_segs:
            return None
        off = -(-self.offset // ALIGN) * ALIGN
        self.segs.append((off, mem, n))
        self.offset = off + n
        return len(self.segs) - 1

    def _raw(self, obj):
        mem = obj if isinstance(obj, memoryview) else memoryview(obj)
        if not mem.contiguous:
            raise TypeError("a non-contiguous memoryview cannot be sent; copy it first")
        if mem.ndim != 1 or mem.format != "B":
            mem = mem.cast("B")
        idx = self._segment(mem, mem.nbytes)
        body = [idx] if idx is not None else [None, mem.tobytes()]
        return msgpack.ExtType(EXT_RAW, msgpack.packb(body))

    def _ndarray(self, arr):
        np = self.np
        if arr.dtype.kind in "OV":
            raise TypeError(f"a numpy array of dtype {arr.dtype} cannot be sent")
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)
        mem = memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b"")
        idx = self._segment(mem, arr.nbytes)
        body = [arr.dtype.str, list(arr.shape), idx, None if idx is not None else mem.tobytes()]
        return msgpack.ExtType(EXT_NDARRAY, msgpack.packb(body))

    def _tensor(self, t):
        torch = self.torch
        shape = list(t.shape)
        t = t.detach()
        if self.device and t.device.type == "cuda" and t.numel():
            if not t.is_contiguous():
                t = t.contiguous()  # (a copy on the device, on the current stream)
            n = t.numel() * t.element_size()
            self.device_parts.append((t, n))
            body = [str(t.dtype).removeprefix("torch."), shape, len(self.device_parts) - 1, n]
            return msgpack.ExtType(EXT_CUDA, msgpack.packb(body))
        if t.device.type != "cpu":
            t = t.cpu()      # ferry moves host memory: one device-to-host copy
        if not t.is_contiguous():
            t = t.contiguous()
        n = t.numel() * t.element_size()
        mem = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if n else memoryview(b"")
        idx = self._segment(mem, n)
        body = [str(t.dtype).removeprefix("torch."), shape, idx,
                None if idx is not None else mem.tobytes()]
        return msgpack.ExtType(EXT_TENSOR, msgpack.packb(body))

    def _cuda_array(self, a):
        """An object with __cuda_array_interface__ (contiguous), sent apart as
        device memory; its dtype by numpy's name (torch's for the common ones)."""
        import numpy as np
        cai = a.__cuda_array_interface__
        shape = [int(d) for d in cai["shape"]]
        n = int(np.prod(shape, dtype=np.int64)) * int(cai["typestr"][2:])
        if n == 0:
            raise TypeError("an empty CUDA array cannot be sent; send None or b''")
        self.device_parts.append((a, n))
        body = [np.dtype(cai["typestr"]).name, shape, len(self.device_parts) - 1, n]
        return msgpack.ExtType(EXT_CUDA, msgpack.packb(body))

    def walk(self, obj, depth=0):
        """obj with every special value replaced by what msgpack takes."""
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if depth > MAX_DEPTH:
            raise ValueError(f"payload nested deeper than {MAX_DEPTH} levels (a cycle?)")
        if isinstance(obj, bytes):
            if len(obj) < self.min_segment:
                return obj
            return self._raw(obj)
        if isinstance(obj, (bytearray, memoryview)):
            return self._raw(obj)
        if isinstance(obj, dict):
            return {k: self.walk(v, depth + 1) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.walk(v, depth + 1) for v in obj]
        np, torch = self.np, self.torch
        if np is not None and isinstance(obj, np.ndarray):
            return self._ndarray(obj)
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if self.device and hasattr(obj, "__cuda_array_interface__"):
            return self._cuda_array(obj)  # CuPy, Numba, ...: as device memory too
        fields = getattr(type(obj), "__struct_fields__", None)
        if fields is not None:  # a msgspec Struct: as msgspec encodes it
            return {k: self.walk(v, depth + 1) for k, v in _struct_map(obj, fields).items()}
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return {f.name: self.walk(getattr(obj, f.name), depth + 1)
                    for f in dataclasses.fields(obj)}
        if isinstance(obj, slice):
            return [self.walk(obj.start), self.walk(obj.stop), self.walk(obj.step)]
        if np is not None and isinstance(obj, np.generic):
            return obj.item()
        if hasattr(obj, "keys") and hasattr(obj, "__getitem__"):  # other mappings
            return {k: self.walk(obj[k], depth + 1) for k in obj.keys()}
        raise TypeError(
            f"FerryConnector cannot send an object of type {type(obj).__name__}: it takes "
            "bytes, bytearray, memoryview, numpy arrays, torch tensors, msgspec Structs, "
            "dataclasses, mappings, lists, tuples and None/bool/int/float/str")

    def encode(self, obj):
        """(parts, size): the parts of one vectored PUT carrying obj."""
        if isinstance(obj, (bytes, bytearray, memoryview)):
            root = self._raw(obj)   # a bytes-like root is always RAW (a RawPayload)
        else:
            root = self.walk(obj)
        table = [[off, n] for off, _, n in self.segs]
        try:
            header = b"\x92" + msgpack.packb(root, use_bin_type=True) + msgpack.packb(table)
        except (TypeError, ValueError, OverflowError) as e:
            raise TypeError(f"FerryConnector cannot pack the payload: {e}") from None
        head = _PREFIX.pack(MAGIC, len(header)) + header
        data_start = -(-len(head) // ALIGN) * ALIGN
        parts = [head + _ZEROS[:data_start - len(head)]]
        at = 0
        for off, mem, n in self.segs:
            if off > at:
                parts.append(_ZEROS[:off - at])
            parts.append(mem)
            at = off + n
        return parts, data_start + at


def _struct_map(obj, fields):
    """A msgspec Struct's fields as a dict; with omit_defaults, the ones whose
    value is not the default are left out, as msgspec's encoder does."""
    cfg = getattr(type(obj), "__struct_config__", None)
    omit = bool(getattr(cfg, "omit_defaults", False))
    defaults = getattr(type(obj), "__struct_defaults__", ())
    first_default = len(fields) - len(defaults)
    out = {}
    for i, name in enumerate(fields):
        value = getattr(obj, name)
        if omit and i >= first_default:
            d = defaults[i - first_default]
            if value is d or (type(value) is type(d) and
                              isinstance(d, (bool, int, float, str, bytes)) and value == d):
                continue
        out[name] = value
    return out


def _bin_header(n):
    """msgpack's bin header for n bytes (the form msgpack.packb writes)."""
    if n < 0x100:
        return b"\xc4" + n.to_bytes(1, "big")
    if n < 0x10000:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


_FIXEXT = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}


def _ext_header(code, n):
    """msgpack's ext header for n bytes of type code (as msgpack.packb)."""
    fixed = _FIXEXT.get(n)
    if fixed is not None:
        return bytes((fixed, code))
    if n < 0x100:
        return bytes((0xC7, n, code))
    if n < 0x10000:
        return b"\xc8" + n.to_bytes(2, "big") + bytes((code,))
    return b"\xc9" + n.to_bytes(4, "big") + bytes((code,))


# The inline RAW root's header around its bytes: [ExtType(RAW, [None, bin]), []].
_INLINE_BODY = b"\x92\xc0"   # msgpack [None, ...
_EMPTY_TABLE = b"\x90"        # msgpack []


@functools.lru_cache(maxsize=512)
def _small_raw_frame(n):
    """(prefix, suffix, size) of the frame of an n-byte inline bytes root:
    prefix + the bytes + suffix is byte for byte what Encoder writes."""
    body_len = 2 + len(_bin_header(n)) + n
    header_len = 1 + len(_ext_header(EXT_RAW, body_len)) + body_len + 1
    head_len = 8 + header_len
    data_start = -(-head_len // ALIGN) * ALIGN
    prefix = b"".join((_PREFIX.pack(MAGIC, header_len), b"\x92",
                       _ext_header(EXT_RAW, body_len), _INLINE_BODY, _bin_header(n)))
    return prefix, _EMPTY_TABLE + _ZEROS[:data_start - head_len], data_start


def _encode_small_raw(data):
    """The frame of a bytes root carried inline (shorter than the segment
    threshold), written directly from a cached prefix and suffix, without
    Encoder's packers (the 64 B path's cost: see docs/benchmarks.md)."""
    prefix, suffix, size = _small_raw_frame(len(data))
    return [b"".join((prefix, data, suffix))], size


def encode(obj, min_segment):
    """(parts, size): the parts of one vectored PUT carrying obj."""
    t = type(obj)
    if t is bytes and len(obj) < min_segment and len(obj) < 0xFF00:
        return _encode_small_raw(obj)
    return Encoder(min_segment).encode(obj)


def encode_device(obj, min_segment):
    """(parts, size, device_parts): as encode, but each torch CUDA tensor of
    obj (not empty), and each object with __cuda_array_interface__, is left
    out of the frame, named by an EXT_CUDA value, and listed in device_parts
    as (contiguous tensor or array, nbytes), index i to be PUT as key
    "<key>#cuda<i>" before the frame."""
    t = type(obj)
    if t is bytes and len(obj) < min_segment and len(obj) < 0xFF00:
        return (*_encode_small_raw(obj), [])
    enc = Encoder(min_segment, device=True)
    parts, size = enc.encode(obj)
    return parts, size, enc.device_parts


class RawPayload:
    """A bytes-like payload received by FerryConnector (the root of the
    payload was bytes, bytearray or memoryview).

    len(p), bytes(p) (a copy), p.data (a read-only memoryview, no copy),
    p.tensor (a 1-D torch.uint8 tensor over the same memory, when torch is
    importable: the shape vLLM-Omni's KV transfer takes), p.numpy() (a
    read-only uint8 array). release() (or leaving `with`) gives the memory
    back to ferry at once if no view of it remains; views still alive keep
    it until they are collected (never freed under them).
    """

    __slots__ = ("_buf", "_data", "_tensor", "size")

    def __init__(self, buf, data):
        self._buf = buf        # the received pyferry Buffer, or None (copied)
        self._data = data      # a read-only memoryview (or bytes when copied)
        self._tensor = None
        self.size = len(data)

    def _check(self):
        if self._data is None:
            raise ValueError("RawPayload already released")

    @property
    def data(self):
        self._check()
        return self._data if isinstance(self._data, memoryview) else memoryview(self._data)

    @property
    def tensor(self):
        self._check()
        if self._tensor is None:
            try:
                import torch
            except ImportError:
                raise AttributeError("RawPayload.tensor needs torch") from None
            self._tensor = _tensor_over(torch, self._data, torch.uint8, [self.size])
        return self._tensor

    def numpy(self):
        import numpy as np
        self._check()
        return np.frombuffer(self._data, dtype=np.uint8)

    def __len__(self):
        return self.size

    def __bytes__(self):
        self._check()
        return bytes(self._data)

    def __eq__(self, other):
        if isinstance(other, RawPayload):
            other = other.data
        try:
            return self.data == memoryview(other).cast("B")
        except TypeError:
            return NotImplemented

    __hash__ = None

    @property
    def released(self):
        return self._data is None

    def release(self):
        """Drop this object's hold on the memory (idempotent). Returns True
        when ferry has it back now, False when views of it still exist."""
        buf, data = self._buf, self._data
        self._buf = self._data = self._tensor = None
        if isinstance(data, memoryview):
            data.release()
        if buf is None or buf.released:
            return True
        try:
            buf.release()
            return True
        except BufferError:
            return False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __repr__(self):
        state = "released" if self._data is None else f"{self.size} bytes"
        return f"<pyferry.connector.RawPayload {state}>"


def _tensor_over(torch, mem, dtype, shape):
    """A tensor of dtype/shape over mem (a read-only view: no copy)."""
    if len(mem) == 0:
        return torch.empty(shape, dtype=dtype)
    with warnings.catch_warnings():
        # torch warns that the buffer is not writable: it is ferry's
        # received memory, read-only by design (see python/README.md).
        warnings.simplefilter("ignore", UserWarning)
        t = torch.frombuffer(mem, dtype=torch.uint8)
    return t.view(dtype).reshape(shape)


class FrameError(ValueError):
    """A received payload that is not a FerryConnector frame."""


def decode(buf, copy=False, fetch=None, key=None):
    """(payload, size) of a received Buffer. copy=False: segments come back
    as views that keep buf alive (buf is released here at once when the
    payload has none); copy=True: they are copied out and buf is released
    before returning. fetch(key, index, nbytes) -> a 1-D uint8 torch tensor
    (or numpy array) of nbytes: the device part index of the payload of key
    (an EXT_CUDA value), viewed here as its dtype and shape; a frame that
    has one when fetch is None is a FrameError. The size returned counts
    the device parts' bytes too."""
    size = len(buf)
    whole = memoryview(buf)
    state = None
    try:
        small = _small_raw(buf)  # (_ext/frame.c: _encode_small_raw's frame, or None)
        if small is not None:  # the inline bytes root: a private copy
            return RawPayload(None, small), size
        if size < 8:
            raise FrameError(f"a {size}-byte payload is no FerryConnector frame")
        magic, hlen = _PREFIX.unpack_from(whole, 0)
        if magic != MAGIC or 8 + hlen > size:
            raise FrameError("the payload is no FerryConnector frame (bad magic or header)")
        try:
            root, table = msgpack.unpackb(whole[8:8 + hlen], ext_hook=_ext, raw=False,
                                          strict_map_key=False)
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            raise FrameError(f"bad FerryConnector header: {e}") from None
        state = _Decode(whole, -(-(8 + hlen) // ALIGN) * ALIGN, table, copy, fetch, key)
        try:
            root = state.fill(root, True)
        except FrameError:
            raise
        except (ValueError, TypeError, AttributeError, IndexError) as e:
            # a dtype, shape or segment the header names wrongly
            raise FrameError(f"bad FerryConnector payload: {type(e).__name__}: {e}") from None
        if type(root) is _RootRaw:
            root = RawPayload(buf if root.view else None, root.mem)
    finally:
        whole.release()
        if state is None or not state.views:
            buf.release()
    return root, size + state.fetched


class _Seg:
    """What the ext hook leaves for a special value (filled in later)."""
    __slots__ = ("kind", "idx", "dtype", "shape", "inline")

    def __init__(self, kind, idx, dtype=None, shape=None, inline=None):
        self.kind, self.idx, self.dtype, self.shape, self.inline = kind, idx, dtype, shape, inline


class _RootRaw:
    __slots__ = ("mem", "view")

    def __init__(self, mem, view):
        self.mem, self.view = mem, view


def _ext(code, data):
    body = msgpack.unpackb(data, raw=False)
    if code == EXT_RAW:
        if (type(body) is not list or not 1 <= len(body) <= 2 or
                (body[0] is None) != (len(body) == 2)):
            raise FrameError("a malformed bytes value in a FerryConnector header")
        return _Seg(code, body[0], inline=body[1] if body[0] is None else None)
    if code in (EXT_NDARRAY, EXT_TENSOR):
        if (type(body) is not list or len(body) != 4 or type(body[0]) is not str or
                type(body[1]) is not list):
            raise FrameError("a malformed array value in a FerryConnector header")
        return _Seg(code, body[2], body[0], body[1], body[3])
    if code == EXT_CUDA:
        if (type(body) is not list or len(body) != 4 or type(body[0]) is not str or
                type(body[1]) is not list or type(body[2]) is not int or
                type(body[3]) is not int or not 0 <= body[2] < MAX_PARTS or body[3] <= 0):
            raise FrameError("a malformed CUDA tensor value in a FerryConnector header")
        return _Seg(code, body[2], body[0], body[1], body[3])
    raise FrameError(f"unknown ext type {code} in a FerryConnector header")


class _Decode:
    def __init__(self, whole, data_start, table, copy, fetch=None, key=None):
        self.whole, self.data_start, self.table, self.copy = whole, data_start, table, copy
        self.fetch, self.key = fetch, key
        self.fetched = 0  # bytes of the device parts fetched
        self.views = False  # whether a view of the buffer was handed out

    def device_value(self, seg):
        """An EXT_CUDA value: its bytes fetched (seg.inline: their count; a
        torch uint8 tensor, or a numpy one where torch is not importable),
        viewed as the dtype and shape the header names."""
        if self.fetch is None:
            raise FrameError("the payload names CUDA device memory sent apart, and this "
                             "receiver fetches none")
        count = 1
        for d in seg.shape:
            if type(d) is not int or d < 0:
                raise FrameError("a CUDA tensor of a malformed shape")
            count *= d
        t = self.fetch(self.key, seg.idx, seg.inline)
        self.fetched += seg.inline
        if hasattr(t, "element_size"):  # torch
            import torch
            dtype = getattr(torch, seg.dtype, None)
            if not isinstance(dtype, torch.dtype):
                raise FrameError(f"a CUDA tensor of unknown dtype {seg.dtype!r}")
            size = dtype.itemsize
        else:
            import numpy as np
            try:
                dtype = np.dtype(seg.dtype)
            except TypeError:
                raise FrameError(f"a CUDA tensor of dtype {seg.dtype!r}, which numpy lacks "
                                 "(torch is not importable here)") from None
            size = dtype.itemsize
        if count * size != seg.inline:
            raise FrameError("a CUDA tensor whose shape and dtype are not its length")
        return t.view(dtype).reshape(seg.shape)

    def mem(self, seg):
        """(memory, private): the segment's bytes, a view or a private copy."""
        if seg.idx is None:
            return seg.inline, True
        try:
            off, n = self.table[seg.idx]
        except (IndexError, TypeError, ValueError):
            raise FrameError("a segment that the header's table lacks") from None
        start = self.data_start + off
        if off < 0 or n < 0 or start + n > len(self.whole):
            raise FrameError("a segment lies outside the received payload")
        m = self.whole[start:start + n]
        if self.copy:
            b = bytes(m)
            m.release()
            return b, True
        self.views = True
        return m, False

    def value(self, seg, root):
        mem, private = self.mem(seg)
        if seg.kind == EXT_RAW:
            return _RootRaw(mem, not private) if root else mem
        import numpy as np
        if seg.kind == EXT_TENSOR:
            try:
                import torch
            except ImportError:
                torch = None
            if torch is not None:
                if private:  # inline or copied: a writable tensor of its own
                    mem = bytearray(mem)
                return _tensor_over(torch, mem, getattr(torch, seg.dtype), seg.shape)
            try:  # no torch here: numpy where numpy has the dtype
                return np.frombuffer(mem, dtype=np.dtype(seg.dtype)).reshape(seg.shape)
            except TypeError:
                return mem  # bfloat16 & co. without torch: the raw bytes
        return np.frombuffer(mem, dtype=np.dtype(seg.dtype)).reshape(seg.shape)

    def fill(self, obj, root=False):
        if type(obj) is _Seg:
            if obj.kind == EXT_CUDA:
                return self.device_value(obj)
            return self.value(obj, root)
        if type(obj) is dict:
            for k, v in obj.items():
                if type(v) in (_Seg, dict, list):
                    obj[k] = self.fill(v)
        elif type(obj) is list:
            for i, v in enumerate(obj):
                if type(v) in (_Seg, dict, list):
                    obj[i] = self.fill(v)
        return obj

"""pyferry.cuda: CUDA device memory through ferry's PUT and GET.

ferry copies device memory itself, on its own CUDA stream (the runtime is
loaded at run time: one build, with or without a GPU), so the caller never
moves a tensor to the host nor synchronizes the GPU to send one:

    import pyferry.cuda as fc
    if fc.available():
        fc.put_tensor(engine, "cons", "kv", t, stream=torch.cuda.current_stream())
        fc.get_into(engine, "prod", "kv", out)        # out: a CUDA tensor that fits
        buf = fc.get_buffer(engine, "prod", "kv")     # or the sender's memory itself

A tensor is anything with __cuda_array_interface__ (torch, CuPy, Numba) or,
for DLPack producers, __dlpack_device__ (kDLCUDA) with data_ptr(); it must
be contiguous. stream= (a torch.cuda.Stream, or a cudaStream_t as int)
or event= (a torch.cuda.Event, or a cudaEvent_t) names the producer's work
that must finish before ferry's copy starts; ferry waits for it on the GPU.
Without a CUDA runtime or device, available() is False and both calls raise
FerryError (ENODEV).
"""
import math

from ._ferry import features

_KDL_CUDA = 2  # DLPack's kDLCUDA
_KDL_CUDA_MANAGED = 13


def available():
    """True when ferry's CUDA runtime loaded and sees a device."""
    return "cuda" in features()


def _device_of(obj, default):
    dev = getattr(obj, "device", None)
    idx = getattr(dev, "index", None)
    if isinstance(idx, int):
        return idx
    if hasattr(obj, "__dlpack_device__"):
        return int(obj.__dlpack_device__()[1])
    return default


def device_memory(obj, device=None):
    """(pointer, nbytes, device) of a contiguous CUDA array or tensor."""
    if hasattr(obj, "detach"):
        obj = obj.detach()   # torch refuses the interface on tensors that need grad
    dev = getattr(obj, "device", None)
    if getattr(dev, "type", None) == "cuda" and hasattr(obj, "data_ptr") and \
            hasattr(obj, "element_size"):
        # a torch CUDA tensor: its own accessors (its array interface refuses
        # dtypes it has no typestr for: bfloat16, the float8 kinds)
        if not obj.is_contiguous():
            raise ValueError("pyferry.cuda: the tensor is not contiguous")
        return int(obj.data_ptr()), obj.numel() * obj.element_size(), \
            dev.index if dev.index is not None else (device or 0)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        ptr = int(cai["data"][0])
        shape = tuple(cai["shape"])
        itemsize = int(cai["typestr"][2:])
        strides = cai.get("strides")
        if strides is not None:
            want, acc = [], itemsize
            for n in reversed(shape):
                want.append(acc)
                acc *= n
            if tuple(strides) != tuple(reversed(want)) and math.prod(shape) > 1:
                raise ValueError("pyferry.cuda: the array is not contiguous")
        return ptr, math.prod(shape) * itemsize, _device_of(obj, device or 0)
    if hasattr(obj, "__dlpack_device__") and hasattr(obj, "data_ptr"):
        kind, dev = obj.__dlpack_device__()
        if int(kind) not in (_KDL_CUDA, _KDL_CUDA_MANAGED):
            raise TypeError("pyferry.cuda: not CUDA memory (DLPack device type %d)" % kind)
        if hasattr(obj, "is_contiguous") and not obj.is_contiguous():
            raise ValueError("pyferry.cuda: the tensor is not contiguous")
        return int(obj.data_ptr()), obj.numel() * obj.element_size(), int(dev)
    raise TypeError(f"pyferry.cuda: {type(obj).__name__} is not CUDA device memory "
                    "(no __cuda_array_interface__ nor __dlpack_device__)")


def _handle(x, attr):
    if x is None:
        return 0
    if isinstance(x, int):
        return x
    v = getattr(x, attr, None)   # torch.cuda.Stream.cuda_stream, torch.cuda.Event.cuda_event
    if v is None:
        raise TypeError(f"pyferry.cuda: {type(x).__name__} has no {attr}")
    return int(v)


def put_tensor(engine, peer, key, tensor, *, stream=None, event=None, device=None, **kw):
    """PUT the tensor's device memory under key; returns the bytes sent.
    kw: timeout=, replace=, wait_peer= as Engine.put."""
    ptr, n, dev = device_memory(tensor, device)
    return engine.put_device(peer, key, ptr, n, dev, stream=_handle(stream, "cuda_stream"),
                             event=_handle(event, "cuda_event"), **kw)


def get_buffer(engine, peer, key, **kw):
    """The data of key as it is, with no copy: when it is another process's
    CUDA device memory (its put_tensor over shared memory), a pyferry.Buffer
    of that memory itself (buf.device >= 0, buf.__cuda_array_interface__:
    torch.as_tensor(buf, device=f"cuda:{buf.device}") views it); else a
    Buffer of host memory, as Engine.get gives. The sender's put ends when
    the Buffer is released (buf.release(), or its end): release it only
    once no tensor over it is used any more. kw: Engine.get's (timeout=,
    nowait=)."""
    return engine.get(peer, key, device_buf=True, **kw)


def get_into(engine, peer, key, tensor, *, device=None, **kw):
    """GET key into the tensor's device memory; returns the bytes received
    (FerryMessageSizeError when the payload does not fit). kw: timeout=."""
    ptr, n, dev = device_memory(tensor, device)
    return engine.get_device(peer, key, ptr, n, dev, **kw)

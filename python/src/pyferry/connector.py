"""pyferry.connector: FerryConnector, a drop-in vLLM-Omni connector on ferry.

A pipeline switches to ferry by naming the connector in its stage YAML
(`name: FerryConnector`, optional `extra:` keys below); the package's plugin
entry points (`vllm.general_plugins`, `vllm_omni.general_plugins`, both named
"ferry") call register(), which adds it to upstream's OmniConnectorFactory.

FerryConnector subclasses vLLM-Omni's OmniConnectorBase when vllm_omni is
importable, else a minimal base of this module with the same methods
(_ConnectorBase); the class works the same either way. Importing pyferry
never imports vllm, vllm_omni or torch; importing pyferry.connector imports
vllm_omni's connector base only when vllm_omni is installed.

Config (what upstream's factory hands a connector: the YAML's `extra` dict,
with `stage_id` and `role` added by upstream for each stage worker):
    transport       "shm" (default: peers found by name on this host),
                    "tcp" (peers at addresses), "rdma" (peers at rdma://
                    addresses; on a host without an RDMA device: tcp at the
                    same HOST:PORT, with a warning, as the stage YAML does
                    for `protocol: rdma`), "auto" (a peer on this host, or
                    without an address: shm, by name; on another host: rdma
                    when both ends have an RDMA device, else tcp)
    namespace       ferry namespace of the pipeline (default "vllm-omni")
    rank            this process's rank in its stage (default 0); the peer
                    is the same rank of the other stage
    pool_size       bytes of this process's pool (alias memory_pool_size;
                    default 0: ferry's default, 64 MiB)
    put_timeout     seconds a put waits for the receiving stage (30)
    zero_copy       true (default): large fields arrive as read-only views of
                    the received memory; false: private copies
    zero_copy_min   bytes from which a field travels as a segment of its own
                    (65536); smaller ones ride in the msgpack header
    park_gets       true (default): a polled get that misses leaves one GET
                    waiting for the key inside ferry, and later polls only
                    reap it (pyferry._parked); false: every poll is a nowait
                    GET through the engine (what upstream's connectors do)
    device_puts     true (default): where ferry has CUDA here, each torch CUDA
                    tensor of a payload goes as device memory of its own
                    (pyferry._device: by CUDA IPC on one host, no host copy;
                    staged through the pinned pools across hosts) and get()
                    returns it as a CUDA tensor on the receiver's device;
                    false: through the host (one .cpu() copy; get() returns
                    a CPU tensor)
    device_puts_max device PUTs out at once, not yet read by their receiver
                    (256); a put past it waits for receivers to read (up to
                    put_timeout), then sends its tensors through the host
    device          the receiver's CUDA device for tensors it gets (an index;
                    default: the current device of the calling thread)
    device_snapshot true (default): put() sends a copy of each CUDA tensor made
                    on the device at put time (one device-to-device copy, on
                    the tensor's stream), so the caller may change or reuse
                    the tensor at once, as with upstream's connectors; false:
                    the tensor itself, read by the receiver when it gets it
                    (no copy at all: the caller must not write it until the
                    receiver has read it, health()["device_parts"]["out"]).
                    Objects with __cuda_array_interface__ are always sent
                    themselves.
    addresses (transport tcp/rdma/auto):
    listen          this process's data address, "tcp://HOST:PORT" (tcp, auto)
                    or "rdma://HOST:PORT" (rdma: HOST an address of an RDMA
                    device's interface); port 0: picked, see address()
    peers           {stage_id: URI}: the receiving stages' addresses, each
                    one URI or an address set (a list, or URIs one space
                    apart, as address() prints them); a peer gets those of
                    its URIs this end can use (rdma:// only with a device)
    host, base_port the computed scheme instead: stage s, rank r listens on
                    host:base_port + s + 16*r (hosts: {stage_id: host} per
                    stage); rdma on the same port (rdma_cm has its own ports)
    auto across hosts: the receiving engine listens on tcp, and on rdma at
    the same HOST (and the same port with base_port) when it has a device;
    its address() is then both ("rdma://H:P tcp://H:P"). A sender with a
    device uses a peer's rdma address when its address set has one; with
    host/base_port it assumes the other host is like this one (the stage
    YAML's rule): where only some hosts have devices, give peers address sets.
    health() says what each route took ("routes": {"0->1": "shm"|"tcp"|"rdma"}).
Engines: one per (stage, rank) per process, named "stage<id>.rank<r>" (the
names of ferry's stage layer: `ferry health -n NS stage1.rank0` finds them),
shared by every FerryConnector of the process; a put(from, to, ...) goes
from engine "stage<from>" to peer "stage<to>", a get(from, to, ...) takes at
"stage<to>" what "stage<from>" sent.
"""
import errno
import logging
import os
import threading
import time

from . import _ferry
from . import _payload
from . import cuda as _cuda
from ._device import DevicePuts, FetchDevice, SUFFIX as _DEV_SUFFIX
from ._parked import ParkedGets
from ._payload import RawPayload, FrameError  # noqa: F401  (public)

__all__ = ["FerryConnector", "RawPayload", "register", "NAME"]

NAME = "FerryConnector"
DEFAULT_NAMESPACE = "vllm-omni"
TRANSPORTS = ("shm", "tcp", "rdma", "auto")
KEY_MAX = 127  # ferry's keys: FERRY_KEY_MAX - 1 bytes

logger = logging.getLogger("pyferry.connector")


class _ConnectorBase:
    """The minimal base used when vllm_omni is not importable: the methods of
    vLLM-Omni's OmniConnectorBase with its defaults (get_with_deadline raises
    NotImplementedError, abandon_get and reap_consumed do nothing, close() on
    __del__ and __exit__, _make_key's "{key}@{from}_{to}")."""

    supports_raw_data = False

    def put(self, from_stage, to_stage, put_key, data):
        raise NotImplementedError

    def get(self, from_stage, to_stage, get_key, metadata=None):
        raise NotImplementedError

    def cleanup(self, request_id):
        raise NotImplementedError

    def get_with_deadline(self, from_stage, to_stage, get_key, metadata=None, *, deadline):
        raise NotImplementedError(f"{type(self).__name__} does not support deadline-aware receive")

    def abandon_get(self, get_key):
        pass

    def reap_consumed(self):
        pass

    def health(self):
        raise NotImplementedError

    def close(self):
        raise NotImplementedError

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.close()

    @staticmethod
    def _make_key(key, from_stage, to_stage, separator="@"):
        return f"{key}{separator}{from_stage}_{to_stage}"


def _upstream_base():
    """vLLM-Omni's OmniConnectorBase, or None when vllm_omni is not importable."""
    import importlib.util
    try:
        if importlib.util.find_spec("vllm_omni") is None:
            return None
        from vllm_omni.distributed.omni_connectors.connectors.base import OmniConnectorBase
        return OmniConnectorBase
    except Exception as e:  # installed but broken (a missing dependency): say so
        logger.warning("vllm_omni is installed but its connector base does not import "
                       "(%s: %s); FerryConnector uses its own base", type(e).__name__, e)
        return None


_Base = _upstream_base() or _ConnectorBase
UPSTREAM_BASE = _Base is not _ConnectorBase


# --- engines: one per (namespace, stage, rank) per process -----------------

_engines_lock = threading.Lock()
_engines = {}  # (ns, name) -> [Engine, settings, refcount]


def _acquire_engine(ns, name, settings, kwargs):
    """The process's engine (ns, name), made with Engine(name, ns=ns,
    **kwargs) when it is not open yet; settings (comparable, printable: no
    secret in it) must match those of an engine already open."""
    from . import Engine
    with _engines_lock:
        ent = _engines.get((ns, name))
        if ent is not None:
            if ent[1] != settings:
                raise ValueError(
                    f"FerryConnector: engine {name!r} of namespace {ns!r} is open in this "
                    f"process with other settings ({ent[1]}); give every FerryConnector of "
                    f"a stage the same transport, listen and pool_size")
            ent[2] += 1
            return ent[0]
        eng = Engine(name, ns=ns, **kwargs)
        _engines[(ns, name)] = [eng, settings, 1]
        return eng


def _release_engine(ns, name):
    with _engines_lock:
        ent = _engines.get((ns, name))
        if ent is None:
            return
        ent[2] -= 1
        if ent[2] > 0:
            return
        del _engines[(ns, name)]
    # A thread still waiting in a call on it (a get_with_deadline of the connector
    # being closed) is cancelled (FerryCancelledError there), so that the engine,
    # and its name, go now rather than when that call ends.
    eng = ent[0]
    for _ in range(40):
        try:
            eng.close()
            return
        except _ferry.FerryBusyError:
            eng.cancel()
            time.sleep(0.025)
        except Exception as e:
            logger.warning("FerryConnector: closing engine %s: %s", name, e)
            return
    logger.warning("FerryConnector: engine %s still has a call in progress after 1 s of "
                   "cancels; it is closed when its last user lets go of it", name)


_stage_ok = {}  # stage ids seen valid (str or int, not bool) -> their str form


def _stage_str(v, what):
    t = type(v)
    if t is str or t is int:  # (a bool is not: True == 1 would find 1's entry)
        s = _stage_ok.get(v)
        if s is not None:
            return s
    s = _stage_check(v, what)
    if (t is str or t is int) and len(_stage_ok) < 4096:
        _stage_ok[v] = s
    return s


def _stage_check(v, what):
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise TypeError(f"FerryConnector: {what} must be a stage id (str or int), "
                        f"not {type(v).__name__}")
    s = str(v)
    if not s or len(s) > 20 or not all(c.isalnum() or c in "-_" for c in s):
        raise ValueError(f"FerryConnector: bad {what} {s!r} (letters, digits, '-', '_'; "
                         "at most 20)")
    return s


def _key_str(key, what="key"):
    if not isinstance(key, str):
        raise TypeError(f"FerryConnector: {what} must be a str, not {type(key).__name__}")
    n = len(key.encode())
    if n == 0 or n > KEY_MAX or "\0" in key:
        raise ValueError(f"FerryConnector: {what} {key[:40]!r}... is {n} bytes; ferry takes "
                         f"1 to {KEY_MAX} bytes without NUL")
    return key


def rdma_device_present():
    """Whether this machine has an RDMA device: what the stage YAML asks
    (an entry in /sys/class/infiniband, or in $FERRY_RDMA_SYSFS)."""
    d = os.environ.get("FERRY_RDMA_SYSFS") or "/sys/class/infiniband"
    try:
        return any(not n.startswith(".") for n in os.listdir(d))
    except OSError:
        return False


def _host_is_local(host):
    """The stage YAML's test of "this host" (a host named in the config)."""
    return (not host or host in ("auto", "localhost", "::1", "[::1]")
            or host.startswith("127."))


def _split_uri(uri, what):
    """(scheme, HOST:PORT, HOST) of "scheme://HOST:PORT"."""
    if not isinstance(uri, str) or "://" not in uri:
        raise ValueError(f"FerryConnector: {what} {uri!r} is not a URI (scheme://HOST:PORT)")
    scheme, rest = uri.split("://", 1)
    host = rest.rsplit(":", 1)[0] if ":" in rest else rest
    return scheme.lower(), rest, host.strip("[]")


def _uri_list(v, what):
    """A peer's address set: one URI, URIs one space apart, or a list."""
    if isinstance(v, str):
        uris = v.split()
    elif isinstance(v, (list, tuple)) and all(isinstance(u, str) for u in v):
        uris = [u for one in v for u in one.split()]
    else:
        raise TypeError(f"FerryConnector: {what} must be a URI or a list of URIs, "
                        f"not {type(v).__name__}")
    if not uris:
        raise ValueError(f"FerryConnector: {what} is empty")
    for u in uris:
        _split_uri(u, what)
    return uris


class FerryConnector(_Base):
    """vLLM-Omni connector over ferry (see the module's docstring for config).

    Base: vLLM-Omni's OmniConnectorBase when vllm_omni is importable (then
    isinstance(c, OmniConnectorBase) holds), else pyferry.connector's
    _ConnectorBase with the same methods.

    put(from_stage, to_stage, put_key, data) -> (True, size, metadata), or
        (False, 0, None) when ferry could not deliver (logged; upstream's
        callers retry); data it cannot send raises TypeError/ValueError.
    get(from_stage, to_stage, get_key, metadata=None) -> (payload, size), or
        None while the key is not there yet (never waits; the first miss
        parks a GET for the key in ferry and later polls only reap it:
        pyferry._parked).
    get_with_deadline(..., metadata=None, *, deadline) -> the same, waiting
        until deadline (absolute, time.monotonic() seconds, as upstream's
        callers pass it) inside ferry with the GIL released.
    cleanup(request_id): drops what this process holds of the request (keys
        equal to it or starting with it and '_', ':', '/', '#').
    """

    # Upstream reads it on the instance (getattr(connector, "supports_raw_data")): its KV
    # transfer then hands over device tensors (to_gpu_tensor) instead of bytes. Set in
    # __init__ to whether ferry's CUDA runtime loaded and sees a device (pyferry.cuda);
    # the class says False, what holds before an instance looked.
    supports_raw_data = False

    def __init__(self, config=None):
        self._closed = True  # until the end of __init__ (close() may run via __del__)
        self._held = []
        if config is None:
            config = {}
        if not isinstance(config, dict):
            raise TypeError(f"FerryConnector: config must be a dict (the connector's extra), "
                            f"not {type(config).__name__}")
        self.config = config
        self.supports_raw_data = _cuda.available()
        self.stage_id = config.get("stage_id", -1)
        self.role = config.get("role")
        transport = str(config.get("transport", "shm")).lower()
        if transport not in TRANSPORTS:
            raise ValueError(f"FerryConnector: unknown transport {transport!r} "
                             f"(shm, tcp, rdma, auto)")
        self.transport = transport
        self.fell_back = False
        self._rdma = transport in ("rdma", "auto") and self._rdma_usable(transport)
        if transport == "rdma" and not self._rdma:
            self.fell_back = True
            logger.warning("FerryConnector: transport rdma but no RDMA device "
                           "(/sys/class/infiniband is empty): tcp instead, at the same "
                           "HOST:PORT (as the stage YAML does for protocol: rdma)")
        ns = config.get("namespace", DEFAULT_NAMESPACE)
        if not isinstance(ns, str) or not ns:
            raise TypeError("FerryConnector: namespace must be a non-empty str")
        self.namespace = ns
        self.rank = int(config.get("rank", 0))
        self._pool_size = int(config.get("pool_size", config.get("memory_pool_size", 0)) or 0)
        self._put_timeout = float(config.get("put_timeout", 30.0))
        self._copy = not bool(config.get("zero_copy", True))
        self._min_segment = int(config.get("zero_copy_min", 64 << 10))
        park = config.get("park_gets", True)
        if not isinstance(park, bool):
            raise TypeError(f"FerryConnector: park_gets must be true or false, not {park!r}")
        self._park_limit = 256 if park else 0  # 0: ParkedGets never parks
        dev_puts = config.get("device_puts", True)
        if not isinstance(dev_puts, bool):
            raise TypeError(f"FerryConnector: device_puts must be true or false, "
                            f"not {dev_puts!r}")
        self._device_puts = dev_puts and self.supports_raw_data
        self._device_puts_max = int(config.get("device_puts_max", 256))
        if self._device_puts_max < 1:
            raise ValueError("FerryConnector: device_puts_max must be at least 1")
        device = config.get("device")
        if device is not None and (isinstance(device, bool) or not isinstance(device, int)
                                   or device < 0):
            raise TypeError(f"FerryConnector: device must be a CUDA device index, "
                            f"not {device!r}")
        self._device = device
        snap = config.get("device_snapshot", True)
        if not isinstance(snap, bool):
            raise TypeError(f"FerryConnector: device_snapshot must be true or false, "
                            f"not {snap!r}")
        self._device_snapshot = snap
        peers = config.get("peers") or {}
        if not isinstance(peers, dict):
            raise TypeError("FerryConnector: peers must be a dict {stage_id: 'tcp://HOST:PORT'}")
        self._peer_addrs = {str(k): _uri_list(v, f"peers[{k!r}]") for k, v in peers.items()}
        self._host = str(config.get("host", "127.0.0.1"))
        self._hosts = {str(k): str(v) for k, v in (config.get("hosts") or {}).items()}
        self._base_port = config.get("base_port")
        self._listen = config.get("listen")
        if self._listen is not None:
            _split_uri(self._listen, "listen")
        if transport in ("tcp", "rdma") and not (self._peer_addrs or self._base_port is not None) \
                and self.role != "receiver":
            logger.info("FerryConnector: tcp without peers or base_port: this process "
                        "can receive, and sends only to stages of this host by name")
        self._lock = threading.Lock()
        self._engine_of = {}   # stage id -> Engine
        self._peer_of = {}     # (stage id, peer stage id) -> Peer
        self._routes = {}      # "stage->peer stage" -> "shm" | "tcp" | "rdma"
        self._parked = {}      # stage id -> ParkedGets of its engine (polled gets)
        self._devputs = {}     # stage id -> DevicePuts of its engine (CUDA tensors out)
        self._fetch_of = {}    # Peer a stage receives from -> FetchDevice (CUDA parts in)
        self._dev_fallbacks = 0
        self._metrics = {"puts": 0, "gets": 0, "bytes_transferred": 0,
                         "put_failures": 0, "get_errors": 0}
        self._closed = False
        self._open_own_engine()

    def _open_own_engine(self):
        """Make the configured stage's engine now, so a bad config fails at
        construction (a subclass may defer or skip it)."""
        if self.stage_id not in (None, -1):
            self._engine(_stage_str(self.stage_id, "stage_id"))

    # --- engines and peers ---------------------------------------------

    def _engine_name(self, stage):
        return f"stage{stage}.rank{self.rank}"

    @staticmethod
    def _rdma_usable(transport):
        """Whether this end takes rdma: a device here and the transport in
        the build. A device in a build without it fails transport rdma (as
        the stage YAML does); auto then takes tcp."""
        if not rdma_device_present():
            return False
        from . import features, FerryError
        if "rdma" in features():
            return True
        if transport == "rdma":
            raise FerryError(errno.EPROTONOSUPPORT,
                             "FerryConnector: transport rdma: this machine has an RDMA "
                             "device but this build of ferry has no rdma transport "
                             "(libibverbs-dev, librdmacm-dev)")
        logger.info("FerryConnector: an RDMA device but no rdma transport in this build: "
                    "tcp across hosts")
        return False

    def _listen_for(self, stage):
        """(tcp listen URI or None, rdma listen URI or None) of this
        process's engine of a stage."""
        if self.transport == "shm":
            return None, None
        if self._listen and stage == str(self.stage_id):
            hp, host = _split_uri(self._listen, "listen")[1:]
        elif self._base_port is not None and stage.isdigit():
            host = self._hosts.get(stage, self._host)
            hp = f"{host}:{int(self._base_port) + int(stage) + 16 * self.rank}"
        elif self.transport in ("tcp", "rdma"):
            host, hp = self._host, f"{self._host}:0"
        else:
            return None, None
        if self.transport == "rdma":
            return (None, f"rdma://{hp}") if self._rdma else (f"tcp://{hp}", None)
        if self.transport == "auto" and self._rdma and not _host_is_local(host):
            return f"tcp://{hp}", f"rdma://{hp}"
        return f"tcp://{hp}", None

    def _engine_settings(self, stage):
        """(settings, Engine kwargs) of this process's engine of a stage:
        connectors sharing an engine must agree on settings (a subclass
        changes how its engines listen)."""
        listen, rdma = self._listen_for(stage)
        kw = {"pool_size": self._pool_size, "listen": listen}
        if rdma:
            kw["rdma_listen"] = rdma
        return (listen, rdma, self._pool_size), kw

    def _engine_opened(self, stage, eng):
        """Called once this connector holds its engine of a stage (outside
        the lock; a subclass publishes it)."""

    def _engine(self, stage):
        eng = self._engine_of.get(stage)
        if eng is not None:
            return eng
        with self._lock:
            if self._closed:
                raise ValueError("FerryConnector is closed")
            eng = self._engine_of.get(stage)
            if eng is None:
                name = self._engine_name(stage)
                eng = _acquire_engine(self.namespace, name, *self._engine_settings(stage))
                self._held.append(name)
                self._engine_of[stage] = eng
                opened = True
            else:
                opened = False
        if opened:
            self._engine_opened(stage, eng)
        return eng

    def _peer(self, stage, peer_stage):
        p = self._peer_of.get((stage, peer_stage))
        if p is not None:
            return p
        eng = self._engine(stage)
        p = eng.peer(self._engine_name(peer_stage))
        addr = self._peer_address(stage, peer_stage)
        uris = [] if addr is None else _uri_list(addr, f"the address of stage {peer_stage}")
        for uri in uris:
            p.connect(uri)
        schemes = {u.split("://", 1)[0] for u in uris}
        self._routes[f"{stage}->{peer_stage}"] = (
            "rdma" if "rdma" in schemes and self._rdma else
            "shm" if not uris else "control" if schemes == {"ferry"} else
            "tcp" if "tcp" in schemes else "/".join(sorted(schemes)))
        self._peer_of[(stage, peer_stage)] = p
        return p

    def _recv_peer(self, stage, peer_stage):
        """The Peer this process's engine of stage receives from peer_stage
        through (a GET names its sender)."""
        return self._peer(stage, peer_stage)

    def _peer_address(self, stage, peer_stage):
        """The address(es) to connect this process's engine of stage to peer
        stage peer_stage at (one URI, "tcp://...", "rdma://..." or
        "ferry://...", or a list of them), or None: found by name (shm), or
        it calls us."""
        if self.transport == "shm":
            return None
        uris = self._peer_addrs.get(peer_stage)
        if uris is None and self._base_port is not None and peer_stage.isdigit():
            port = int(self._base_port) + int(peer_stage) + 16 * self.rank
            hp = f"{self._hosts.get(peer_stage, self._host)}:{port}"
            uris = {"tcp": [f"tcp://{hp}"], "rdma": [f"rdma://{hp}"],
                    "auto": [f"rdma://{hp}", f"tcp://{hp}"]}[self.transport]
        if uris is None:
            return None
        if self.transport == "auto" and all(_host_is_local(_split_uri(u, "peer")[2])
                                            for u in uris):
            return None  # on this host: shared memory, by name
        if self.transport == "rdma" and not self._rdma:  # the fallback: tcp at HOST:PORT
            uris = [f"tcp://{u.split('://', 1)[1]}" if u.startswith("rdma://") else u
                    for u in uris]
        if not self._rdma:
            uris = [u for u in uris if not u.startswith("rdma://")]
        return list(dict.fromkeys(uris)) or None

    def _put_failed(self, src, dst, error):
        """Called when a put from src to dst could not be delivered (a
        subclass forgets what it knew of dst)."""

    def engine(self, stage=None):
        """The pyferry Engine of a stage of this process (default: stage_id)."""
        return self._engine(_stage_str(self.stage_id if stage is None else stage, "stage"))

    def address(self, stage=None):
        """This process's data address for a stage, what a sender's peers
        entry names: "tcp://HOST:PORT", "rdma://HOST:PORT", or both one
        space apart (auto across hosts with a device); None on shm."""
        eng = self.engine(stage)
        if self.transport in ("rdma", "auto") and self._rdma:
            uris = [u for u in (eng.addresses() or [])
                    if u.startswith(("rdma://", "tcp://"))]
            return " ".join(sorted(uris)) or None  # rdma:// before tcp://
        return eng.address()

    # --- the connector calls -------------------------------------------

    def put(self, from_stage, to_stage, put_key, data):
        src, dst = _stage_str(from_stage, "from_stage"), _stage_str(to_stage, "to_stage")
        key = _key_str(put_key, "put_key")
        if self._device_puts:
            parts, size, dev = _payload.encode_device(data, self._min_segment)
        else:
            (parts, size), dev = _payload.encode(data, self._min_segment), ()
        eng = self._engine(src)
        try:
            peer = self._peer(src, dst)
            if dev:
                parts, size = self._put_device_parts(src, eng, peer, key, data, parts, size,
                                                     dev)
            self._send(eng, peer, key, parts)
        except Exception as e:
            self._metrics["put_failures"] += 1
            logger.error("%s put %s (%s -> %s) failed: %s", type(self).__name__, key, src, dst, e)
            self._put_failed(src, dst, e)
            return False, 0, None
        self._metrics["puts"] += 1
        self._metrics["bytes_transferred"] += size
        meta = {"ferry": {"from": eng.name, "to": self._engine_name(dst), "key": key},
                "size": size}
        return True, size, meta

    def _devputs_of(self, stage, eng):
        dp = self._devputs.get(stage)
        if dp is None:
            with self._lock:
                if self._closed:
                    raise ValueError("FerryConnector is closed")
                dp = self._devputs.get(stage)
                if dp is None:
                    dp = self._devputs[stage] = DevicePuts(eng, self._device_puts_max,
                                                           self._put_timeout)
        return dp

    def _put_device_parts(self, src, eng, peer, key, data, parts, size, dev):
        """The payload's CUDA tensors PUT as device memory, before its frame:
        (parts, size) of the frame to send. Past device_puts_max out, or with
        a key too long for the suffix, the whole payload goes through the host."""
        dp = self._devputs_of(src, eng)
        too_long = len(key) + len(_DEV_SUFFIX) + len(str(len(dev) - 1)) > KEY_MAX
        if too_long or not dp.room(len(dev), self._put_timeout):
            self._dev_fallbacks += 1
            if self._dev_fallbacks == 1:
                logger.warning("FerryConnector: put %s: its CUDA tensors go through the host "
                               "(%s; said once)", key,
                               "its key is too long for the device parts' suffix" if too_long
                               else f"{self._device_puts_max} device parts stayed out, not "
                               f"read by their receivers for {self._put_timeout} s "
                               "(device_puts_max)")
            return _payload.encode(data, self._min_segment)  # (TypeError: not torch)
        uds = []
        try:
            for i, (t, n) in enumerate(dev):
                if self._device_snapshot and hasattr(t, "clone"):
                    t = t.clone()  # on its stream: what it holds now is what goes
                uds.append(dp.put(peer, f"{key}{_DEV_SUFFIX}{i}", t, n))
                size += n
        except BaseException:
            dp.cancel(uds)  # no frame will name them
            raise
        return parts, size

    def _send(self, eng, peer, key, parts):
        """One vectored PUT of the parts (the payload's own memory)."""
        eng.put(peer, key, parts, timeout=self._put_timeout, wait_peer=True)

    def _check_meta(self, metadata):
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"FerryConnector: metadata must be a dict or None, "
                            f"not {type(metadata).__name__}")

    def get(self, from_stage, to_stage, get_key, metadata=None):
        """(payload, size), or None while it is not there yet. Metadata (ours,
        upstream's per-key dict, or source_host/port) is not needed: the key
        finds the data."""
        src, dst = _stage_str(from_stage, "from_stage"), _stage_str(to_stage, "to_stage")
        key = _key_str(get_key, "get_key")
        self._check_meta(metadata)
        return self._get(src, dst, key, nowait=True, timeout=None)

    def get_with_deadline(self, from_stage, to_stage, get_key, metadata=None, *, deadline):
        """Wait for the key until deadline (absolute time.monotonic() seconds),
        inside ferry (the GET's own timeout), the GIL released; None when the
        deadline passes first."""
        src, dst = _stage_str(from_stage, "from_stage"), _stage_str(to_stage, "to_stage")
        key = _key_str(get_key, "get_key")
        self._check_meta(metadata)
        if isinstance(deadline, bool) or not isinstance(deadline, (int, float)):
            raise TypeError("FerryConnector: deadline must be a time.monotonic() value (float)")
        if deadline != deadline:
            raise ValueError("FerryConnector: deadline is NaN")
        left = deadline - time.monotonic()
        if left <= 0:
            return self._get(src, dst, key, nowait=True, timeout=None)
        return self._get(src, dst, key, nowait=False, timeout=left)

    def _parked_of(self, stage):
        pk = self._parked.get(stage)
        if pk is None:
            eng = self._engine(stage)
            with self._lock:
                if self._closed:
                    raise ValueError("FerryConnector is closed")
                pk = self._parked.get(stage)
                if pk is None:
                    pk = self._parked[stage] = ParkedGets(eng, limit=self._park_limit)
        return pk

    def _get(self, src, dst, key, nowait, timeout):
        pk = self._parked_of(dst)  # closed: ValueError
        try:
            peer = self._recv_peer(dst, src)
            if nowait:  # a poll: the first miss leaves a GET waiting (pyferry._parked)
                buf = pk.poll(peer, src, key)
            else:
                buf = pk.wait(peer, src, key, timeout)
            if buf is None:
                return None
        except (_ferry.FerryWouldBlockError, _ferry.FerryTimeoutError):
            return None
        except Exception as e:
            self._metrics["get_errors"] += 1
            logger.error("FerryConnector get %s (%s -> %s) failed: %s", key, src, dst, e)
            return None
        fetch = self._fetch_of.get(peer)
        if fetch is None:
            fetch = self._fetch_of[peer] = FetchDevice(self._engine(dst), peer, self._device,
                                                       self._put_timeout)
        try:
            payload, size = _payload.decode(buf, copy=self._copy, fetch=fetch, key=key)
        except FrameError as e:
            self._metrics["get_errors"] += 1
            logger.error("FerryConnector get %s (%s -> %s): %s", key, src, dst, e)
            return None
        self._metrics["gets"] += 1
        return payload, size

    def cleanup(self, request_id):
        """Drop what this process's engines hold of a request (upstream passes
        the exact key; a request id prefix drops all its chunks)."""
        key = _key_str(request_id, "request_id")
        for eng in list(self._engine_of.values()):
            try:
                eng.cleanup(key)
            except Exception as e:
                logger.warning("FerryConnector cleanup %s: %s", key, e)
        for pk in list(self._parked.values()):  # after: what came in before is reaped
            pk.cleanup(key)

    def abandon_get(self, get_key):
        """The caller stopped polling the key: cancel the GET its polls left
        parked (data that comes for it later stays in the engine until
        cleanup, as if it had never been polled)."""
        key = _key_str(get_key, "get_key")
        for pk in list(self._parked.values()):
            pk.abandon(key)

    def reap_consumed(self):
        """A put completes once the receiving stage holds the key; only CUDA
        tensors sent as device memory are held until their receiver has read
        them (by CUDA IPC): those that were are let go here (and at each put)."""
        for dp in list(self._devputs.values()):
            dp.reap()

    def health(self):
        engines = {}
        for stage, eng in list(self._engine_of.items()):
            try:
                engines[eng.name] = eng.health()
            except Exception as e:
                engines[self._engine_name(stage)] = {"error": str(e)}
        parked = [pk.stats() for pk in list(self._parked.values())]
        dev = {"out": 0, "sent": 0, "failed": 0}
        for dp in list(self._devputs.values()):
            dp.reap()
            for k, v in dp.stats().items():
                dev[k] += v
        dev["through_host"] = self._dev_fallbacks
        return {"status": "closed" if self._closed else "healthy", "connector": NAME,
                "transport": self.transport, "fell_back": self.fell_back,
                "rdma": self._rdma, "routes": dict(self._routes), "namespace": self.namespace,
                "stage_id": self.stage_id, "rank": self.rank, **self._metrics,
                "parked_gets": sum(p["parked"] for p in parked),
                "arrived_untaken": sum(p["arrived"] for p in parked),
                "device_puts": self._device_puts, "device_parts": dev,
                "engines": engines}

    @property
    def closed(self):
        return self._closed

    def close(self):
        """Release this connector's engines (idempotent; an engine shared with
        another FerryConnector of the process stays open until both close)."""
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            if getattr(self, "_closed", True):
                return
            self._closed = True
            held, self._held = self._held, []
            parked, self._parked = list(self._parked.values()), {}
            devputs, self._devputs = list(self._devputs.values()), {}
            self._fetch_of = {}
            self._engine_of = {}
            self._peer_of = {}
        for dp in devputs:  # their receivers may still be reading the tensors
            dp.close(wait=min(self._put_timeout, 5.0))
        for pk in parked:  # before the engines go: a shared engine stays open
            pk.close()
        for name in held:
            _release_engine(self.namespace, name)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.close()

    @staticmethod
    def _make_key(key, from_stage, to_stage, separator="@"):
        return f"{key}{separator}{from_stage}_{to_stage}"

    def __repr__(self):
        return (f"<FerryConnector stage {self.stage_id} rank {self.rank} {self.transport} "
                f"ns {self.namespace}{' closed' if self._closed else ''}>")


def _create(config):
    return FerryConnector(config)


def _create_ray(config):
    from .ray_connector import RayConnector
    return RayConnector(config)


def register():
    """Add FerryConnector to vLLM-Omni's OmniConnectorFactory (the plugin
    entry points call this). Returns True when it is registered (now or
    before), False when vllm_omni is not importable. Safe to call again."""
    try:
        from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
    except Exception as e:
        logger.debug("pyferry.connector.register: vllm_omni not importable (%s)", e)
        return False
    # RayConnector (pyferry.ray_connector) too: Ray is imported only when a
    # stage makes one. "FerryRayConnector" names it where another
    # RayConnector holds that name.
    for name, create in ((NAME, _create), ("RayConnector", _create_ray),
                         ("FerryRayConnector", _create_ray)):
        if name in OmniConnectorFactory.list_registered_connectors():
            continue
        try:
            OmniConnectorFactory.register_connector(name, create)
        except ValueError:  # registered meanwhile by another thread
            pass
    return True

"""pyferry.ray_connector: RayConnector, a vLLM-Omni connector that needs
nothing but a running Ray cluster, with ferry as its data plane.

Ray is the directory, ferry moves the bytes. A detached named actor
(RayRefStore: lifetime "detached", in a fixed Ray namespace, found with
get_if_exists, restarted by Ray) maps each stage/rank of the pipeline to
its ferry engine: the Ray node it runs on, the engine's addresses
(`ferry://HOST:PORT` control endpoint, `tcp://HOST:PORT` data address),
its ferry namespace and the Ray identity of the process that owns it.

- An engine registers once when its stage opens (the connector's
  construction, or a stage's first use) and unregisters when the last
  connector of the process that holds it closes.
- A put to a stage asks the actor once for that stage (then cached): on the
  same Ray node the peer is found by name and the data goes over ferry's
  shared memory; on another node the engine connects to the peer's control
  address and the data goes over tcp. A get asks the actor nothing: ferry
  delivers the key to the consumer's engine (a GET names its sender), so no
  put or get makes an actor call per key.
- Entries of dead processes are dropped by the actor: every few seconds
  (and on each lookup, for the entry looked up) it asks Ray's control store
  (GCS) whether the owner is alive: its node, its job for a driver, its
  worker for an actor or task process.
- Each process keeps one call outstanding on the actor (watch): it returns
  when the actor has lost one of the process's entries (a restart of the
  actor, with max_restarts, or a wrong drop) and fails when the actor dies;
  the process then registers again. An entry is missing for at most one
  re-registration.
- The cluster secret of ferry's tcp (needed for addresses other than
  loopback) is `extra.secret`, else $FERRY_SECRET, else one made once per
  directory and kept in Ray's internal KV (GCS), so the cluster is all
  the configuration there is.
- Streams, deadlines, abort and cleanup are FerryConnector's (this class is
  one): put/get/get_with_deadline/cleanup/health/close behave the same.

`extra: {mode: object_store}` is the RFC's own design: the payload (the
same frame FerryConnector sends) is ray.put into the object store and its
ObjectRef kept under the key in the actor; a get takes the ref from the
actor (the actor call waits for the key until the deadline: no polling)
and ray.get()s it. The fallback where ferry's transports cannot reach (only
Ray's ports open) and the baseline of bench_ray.py.

Config (`extra`), besides FerryConnector's pool_size, put_timeout,
zero_copy, zero_copy_min, park_gets, rank:
    ray_address     "auto": the cluster (ray.init(address=...)); unused when
                    this process already called ray.init
    ray_namespace   the Ray namespace of the directory actor (None: "vllm_omni",
                    so stages that are separate drivers find the same actor)
    actor_name      "vllm_omni_ray_ref_store": the directory actor; another
                    name (or namespace) isolates another pipeline
    mode            "ferry" (default) | "object_store"
    transport       "auto" (default: shm on one node, tcp across nodes),
                    "tcp" (tcp always), "shm" (this node only)
    namespace       the ferry namespace (default: made from ray_namespace and
                    actor_name)
    host            the address this process's engines listen on (default:
                    the Ray node's IP)
    secret          the cluster secret of ferry's tcp (see above)
    max_restarts    of the directory actor, when this process creates it (-1)
    sweep_s         how often the actor drops dead entries (2.0)
"""
import hashlib
import logging
import os
import secrets
import threading
import time
import uuid

from . import _payload
from .connector import FerryConnector, _key_str, _stage_str

__all__ = ["RayConnector", "NAME", "DEFAULT_ACTOR_NAME", "DEFAULT_RAY_NAMESPACE"]

NAME = "RayConnector"
DEFAULT_ACTOR_NAME = "vllm_omni_ray_ref_store"
DEFAULT_RAY_NAMESPACE = "vllm_omni"
MODES = ("ferry", "object_store")
RAY_TRANSPORTS = ("auto", "tcp", "shm")
CLEANUP_SEPARATORS = ("@", "_", ":", "/", "#")
WATCH_S = 20.0  # how long one watch call waits before it is made again

logger = logging.getLogger("pyferry.ray_connector")

_ray_lock = threading.Lock()


def _ray(address, namespace):
    """The ray module, connected (ray.init(address) unless this process
    already is)."""
    import ray
    with _ray_lock:
        if not ray.is_initialized():
            ray.init(address=address, namespace=namespace, ignore_reinit_error=True,
                     log_to_driver=False)
    return ray


def _owner():
    """This process's Ray identity, as the directory checks its liveness."""
    import ray
    ctx = ray.get_runtime_context()
    w = ray._private.worker.global_worker
    return {"node": ctx.get_node_id(), "job": ctx.get_job_id(), "worker": ctx.get_worker_id(),
            "actor": ctx.get_actor_id(), "driver": w.mode == ray.SCRIPT_MODE,
            "pid": os.getpid()}


def _node_ip():
    import ray
    ip = getattr(ray._private.worker.global_worker, "node_ip_address", None)
    return ip or ray.util.get_node_ip_address()


# --- the directory actor ----------------------------------------------------

_liveness_warned = False


class _Liveness:
    """What Ray's control store (GCS) says of owners: dead or not (unknown
    counts as alive). Runs inside the actor."""

    def __init__(self):
        import ray
        from ray._private import state
        self.nodes = {n["NodeID"]: n["Alive"] for n in ray.nodes()}
        self.jobs = {j["JobID"]: j["IsDead"] for j in state.state.job_table()}
        self._state = state

    def dead(self, owner):
        if not owner:
            return False
        if self.nodes.get(owner.get("node")) is False:
            return True
        if owner.get("driver"):
            return self.jobs.get(owner.get("job")) is True
        try:
            from ray._raylet import WorkerID
            from ray.core.generated import gcs_pb2
            acc = self._state.state._connect_and_get_accessor()
            raw = acc.get_worker_info(WorkerID.from_hex(owner["worker"]))
            return raw is not None and not gcs_pb2.WorkerTableData.FromString(raw).is_alive
        except Exception as e:  # an API this Ray lacks: unknown, so alive (said once)
            global _liveness_warned
            if not _liveness_warned:
                _liveness_warned = True
                logging.getLogger("pyferry.ray_connector").warning(
                    "RayRefStore: cannot ask Ray whether worker %s lives (%s: %s); entries of "
                    "dead worker processes stay until re-registered", owner.get("worker"),
                    type(e).__name__, e)
            return False


class _RefStore:
    """RayRefStore, the detached named actor (an asyncio actor: waits are
    awaits, no call blocks another).

    The RFC's object-store map: put(key, [ref], owner), get(key), take(key,
    timeout), delete(keys), delete_by_prefix(prefix), keys().
    The directory of ferry engines: register(entry), unregister(stage, rank,
    incarnation), lookup(stage, rank, timeout), watch(incarnations,
    timeout), engines()."""

    def __init__(self, sweep_s=2.0):
        import asyncio
        self._refs = {}       # key -> (ref, owner)
        self._tombs = {}      # key -> when its owner was found dead (a take fails at once)
        self._key_waiters = {}  # key -> asyncio.Event
        self._engines = {}    # "stage/rank" -> entry
        self._changed = asyncio.Condition()
        self._sweep_s = float(sweep_s)
        self._sweeper = None
        self.started = time.time()

    def _start(self):
        import asyncio
        if self._sweeper is None and self._sweep_s > 0:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def _sweep_loop(self):
        import asyncio
        while True:
            await asyncio.sleep(self._sweep_s)
            try:
                await self.sweep()
            except Exception as e:  # GCS busy: next round
                logging.getLogger("pyferry.ray_connector").warning("sweep: %s", e)

    async def sweep(self):
        """Drop the entries and refs of dead owners; returns how many."""
        if not self._engines and not self._refs and not self._tombs:
            return 0
        live = _Liveness()
        gone = [k for k, e in self._engines.items() if live.dead(e.get("owner"))]
        for k in gone:
            del self._engines[k]
        refs = [k for k, (_, o) in self._refs.items() if live.dead(o)]
        now = time.time()
        for k in refs:
            del self._refs[k]
            self._tombs[k] = now
        for k in [k for k, t in self._tombs.items() if now - t > 120]:
            del self._tombs[k]
        if gone:
            async with self._changed:
                self._changed.notify_all()
        return len(gone) + len(refs)

    # the directory

    async def register(self, entry):
        self._start()
        self._engines[f"{entry['stage']}/{entry['rank']}"] = dict(entry)
        async with self._changed:
            self._changed.notify_all()
        return True

    async def unregister(self, stage, rank, incarnation):
        k = f"{stage}/{rank}"
        e = self._engines.get(k)
        if e is None or e["incarnation"] != incarnation:
            return False
        del self._engines[k]
        async with self._changed:
            self._changed.notify_all()
        return True

    async def lookup(self, stage, rank, timeout=0.0):
        """The entry of stage/rank, waiting up to timeout seconds for it to
        register; None when it is not there (or its owner is dead)."""
        import asyncio
        self._start()
        k = f"{stage}/{rank}"

        def live():
            return self._engines.get(k)
        e = live()
        if e is not None and _Liveness().dead(e.get("owner")):
            self._engines.pop(k, None)
            e = None
        if e is not None or timeout <= 0:
            return e
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(live), timeout)
        except asyncio.TimeoutError:
            return None
        return live()

    async def watch(self, incarnations, timeout=WATCH_S):
        """Those of incarnations the directory does not hold, as soon as
        there are any (at once after a restart); [] after timeout."""
        import asyncio
        self._start()
        want = set(incarnations)

        def missing():
            have = {e["incarnation"] for e in self._engines.values()}
            return sorted(want - have)
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(missing), timeout)
        except asyncio.TimeoutError:
            return []
        return missing()

    async def engines(self):
        return dict(self._engines)

    async def pid(self):
        return os.getpid()

    # the RFC's object-store map

    async def put(self, key, refs, owner=None):
        self._refs[key] = (refs[0], owner)
        ev = self._key_waiters.pop(key, None)
        if ev is not None:
            ev.set()
        return True

    async def get(self, key):
        ent = self._refs.get(key)
        return None if ent is None else [ent[0]]

    async def take(self, key, timeout=0.0):
        """[ref] of key, removed from the map (a get consumes); waits up to
        timeout seconds for it to be put; None if it is not there; "dead"
        when its producer died before it was taken."""
        import asyncio
        self._start()
        if self._tombs.pop(key, None) is not None:
            return "dead"
        ent = self._refs.pop(key, None)
        if ent is None and timeout > 0:
            ev = self._key_waiters.get(key)
            if ev is None:
                ev = self._key_waiters[key] = asyncio.Event()
            try:
                await asyncio.wait_for(ev.wait(), timeout)
            except asyncio.TimeoutError:
                pass
            ent = self._refs.pop(key, None)
        return None if ent is None else [ent[0]]

    async def delete(self, keys):
        return [self._refs.pop(k)[0] for k in keys if k in self._refs]

    async def delete_by_prefix(self, prefix, suffix=None):
        """Remove the keys starting with prefix (a str or a list of them) and,
        when suffix is given, ending with it; returns their refs."""
        prefixes = (prefix,) if isinstance(prefix, str) else tuple(prefix)
        ks = [k for k in self._refs if k.startswith(prefixes) and
              (suffix is None or k.endswith(suffix))]
        return [self._refs.pop(k)[0] for k in ks]

    async def keys(self):
        return list(self._refs)


_actor_cls = None


def _store_actor(ray, namespace, name, max_restarts, sweep_s):
    """The directory actor's handle: made detached in namespace when no
    actor of that name exists yet, else the existing one."""
    global _actor_cls
    if _actor_cls is None:
        _actor_cls = ray.remote(_RefStore)
    return _actor_cls.options(name=name, namespace=namespace, lifetime="detached",
                              get_if_exists=True, num_cpus=0, max_restarts=max_restarts,
                              max_concurrency=1000).remote(sweep_s)


class _Directory:
    """One per (Ray namespace, actor name) in a process: the actor's handle,
    the engines this process registered (refcounted: connectors share
    engines), and the watcher thread that registers them again when the
    actor lost them."""

    _all = {}
    _all_lock = threading.Lock()

    @classmethod
    def of(cls, ray, namespace, name, max_restarts, sweep_s):
        with cls._all_lock:
            d = cls._all.get((namespace, name))
            if d is None:
                d = cls._all[(namespace, name)] = cls(ray, namespace, name, max_restarts, sweep_s)
            return d

    def __init__(self, ray, namespace, name, max_restarts, sweep_s):
        self.ray = ray
        self.namespace, self.name = namespace, name
        self.actor = _store_actor(ray, namespace, name, max_restarts, sweep_s)
        self.lock = threading.Lock()
        self.mine = {}  # (ferry ns, engine name) -> [entry, refcount]
        self.thread = None
        self.secret = None

    def call(self, method, *args, timeout=30.0):
        return self.ray.get(getattr(self.actor, method).remote(*args), timeout=timeout)

    def cluster_secret(self):
        """One secret per directory, made once and kept in Ray's internal KV."""
        if self.secret is None:
            from ray.experimental import internal_kv
            k = f"ferry-secret/{self.namespace}/{self.name}".encode()
            internal_kv._internal_kv_put(k, secrets.token_hex(32).encode(), overwrite=False,
                                         namespace="pyferry")
            self.secret = internal_kv._internal_kv_get(k, namespace="pyferry").decode()
        return self.secret

    def acquire(self, key, make_entry, timeout):
        with self.lock:
            ent = self.mine.get(key)
            if ent is not None:
                ent[1] += 1
                return ent[0]
            entry = make_entry()
            self.mine[key] = [entry, 1]
        try:
            self.call("register", entry, timeout=timeout)
        except Exception:
            with self.lock:
                self.mine.pop(key, None)
            raise
        self._ensure_watcher()
        return entry

    def release(self, key):
        with self.lock:
            ent = self.mine.get(key)
            if ent is None:
                return
            ent[1] -= 1
            if ent[1] > 0:
                return
            del self.mine[key]
            e = ent[0]
        try:
            self.call("unregister", e["stage"], e["rank"], e["incarnation"], timeout=10.0)
        except Exception as err:  # the actor or the cluster is gone: its sweep forgets us
            logger.warning("RayConnector: unregistering %s: %s", e["name"], err)

    def _ensure_watcher(self):
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self.thread = threading.Thread(target=self._watch, daemon=True,
                                           name=f"pyferry-ray-watch-{self.name}")
            self.thread.start()

    def _watch(self):
        """Keep one watch call outstanding while this process has entries;
        register again those the actor lost (its restart, a wrong drop)."""
        while True:
            with self.lock:
                incs = {e["incarnation"]: e for e, _ in self.mine.values()}
                if not incs:
                    self.thread = None
                    return
            try:
                missing = self.call("watch", sorted(incs), WATCH_S, timeout=WATCH_S + 30)
            except Exception as e:
                if not self.ray.is_initialized():
                    return
                logger.info("RayConnector: directory %s unavailable (%s); again", self.name,
                            type(e).__name__)
                time.sleep(0.2)
                continue
            with self.lock:
                now = {e["incarnation"] for e, _ in self.mine.values()}
            for inc in missing:
                if inc in now:
                    try:
                        self.call("register", incs[inc], timeout=30.0)
                        logger.info("RayConnector: %s registered again", incs[inc]["name"])
                    except Exception as e:
                        logger.warning("RayConnector: registering %s again: %s",
                                       incs[inc]["name"], e)
                        time.sleep(0.2)


# --- the connector ----------------------------------------------------------

class RayConnector(FerryConnector):
    """vLLM-Omni connector: a Ray cluster for the directory, ferry for the
    data (or, with mode object_store, Ray's object store for the data). See
    the module's docstring for its config; calls and return shapes are
    FerryConnector's."""

    def __init__(self, config=None):
        self._closed = True
        self._registered = []
        self._directory = None
        if config is None:
            config = {}
        if not isinstance(config, dict):
            raise TypeError(f"RayConnector: config must be a dict (the connector's extra), "
                            f"not {type(config).__name__}")
        cfg = dict(config)
        mode = str(cfg.get("mode", "ferry")).lower()
        if mode not in MODES:
            raise ValueError(f"RayConnector: unknown mode {mode!r} (ferry, object_store)")
        transport = str(cfg.get("transport", "auto")).lower()
        if transport not in RAY_TRANSPORTS:
            raise ValueError(f"RayConnector: unknown transport {transport!r} (auto, tcp, shm)")
        addr = cfg.get("ray_address", "auto")
        rns = cfg.get("ray_namespace") or DEFAULT_RAY_NAMESPACE
        actor = cfg.get("actor_name", DEFAULT_ACTOR_NAME)
        for what, v in (("ray_address", addr), ("ray_namespace", rns), ("actor_name", actor)):
            if not isinstance(v, str) or not v:
                raise TypeError(f"RayConnector: {what} must be a non-empty str")
        self.mode, self.ray_address, self.ray_namespace, self.actor_name = mode, addr, rns, actor
        if "namespace" not in cfg:
            cfg["namespace"] = "ray-" + hashlib.sha256(f"{rns}\0{actor}".encode()).hexdigest()[:12]
        cfg["transport"] = transport
        ray = _ray(addr, rns)
        self._ray = ray
        self._directory = _Directory.of(ray, rns, actor, int(cfg.get("max_restarts", -1)),
                                        float(cfg.get("sweep_s", 2.0)))
        self._owner = _owner()
        self._host = None
        self._dir_cache = {}   # peer stage -> its directory entry
        self._recv_peers = {}  # (stage, peer stage) -> Peer
        self._stale = {}       # peer stage -> its entry when a put to it failed
        self._secret = None
        if mode == "ferry" and transport != "shm":
            self._secret = (cfg.get("secret") or os.environ.get("FERRY_SECRET")
                            or self._directory.cluster_secret())
        super().__init__(cfg)
        self._host = str(config.get("host") or _node_ip())
        self._open_own_engine_now()

    # FerryConnector.__init__ opens the own engine last; here the host is
    # known only after it, so the base's call is deferred to ours.
    def _open_own_engine(self):
        pass

    def _open_own_engine_now(self):
        if self.mode == "ferry":
            FerryConnector._open_own_engine(self)
        elif self.stage_id not in (None, -1):
            _stage_str(self.stage_id, "stage_id")

    # --- engines: listen on the node's address, register in the directory

    def _engine_settings(self, stage):
        if self.mode != "ferry":
            raise ValueError("RayConnector: mode object_store has no ferry engines")
        if self.transport == "shm":
            return ("ray-shm", self._pool_size), {"pool_size": self._pool_size}
        control = f"tcp://{self._host}:0"
        return (("ray", self._host, self._pool_size),
                {"pool_size": self._pool_size, "control": control, "secret": self._secret})

    def _engine_opened(self, stage, eng):
        key = (self.namespace, eng.name)

        def entry():
            return {"stage": stage, "rank": self.rank, "name": eng.name,
                    "ns": self.namespace, "node": self._owner["node"], "host": self._host,
                    "addresses": list(eng.addresses() or []), "transport": self.transport,
                    "rt": _runtime_dir(), "owner": self._owner,
                    "incarnation": uuid.uuid4().hex}
        self._directory.acquire(key, entry, timeout=self._put_timeout)
        self._registered.append(key)

    def _lookup(self, stage, timeout):
        e = self._dir_cache.get(stage)
        if e is None:
            e = self._directory.call("lookup", stage, self.rank, float(timeout),
                                     timeout=float(timeout) + 30)
            if e is None:
                from . import FerryUnreachableError
                raise FerryUnreachableError(
                    113, f"stage {stage} rank {self.rank} is not registered in Ray directory "
                         f"{self.ray_namespace}/{self.actor_name} (waited {timeout:g} s)")
            self._dir_cache[stage] = e
        return e

    def _peer_address(self, stage, peer_stage):
        e = self._lookup(peer_stage, self._put_timeout)
        same = (e["node"] == self._owner["node"] and e.get("rt") == _runtime_dir()
                and e.get("ns") == self.namespace)
        if same and self.transport != "tcp":
            return None  # found by name: shared memory
        addrs = e.get("addresses") or []
        for a in addrs:
            if a.startswith("ferry://"):
                return a
        if addrs:
            return addrs[0]
        from . import FerryUnreachableError
        raise FerryUnreachableError(113, f"stage {peer_stage} runs on another Ray node and "
                                         f"listens on nothing (transport {e.get('transport')})")

    def _recv_peer(self, stage, peer_stage):
        p = self._recv_peers.get((stage, peer_stage))
        if p is None:
            p = self._engine(stage).peer(self._engine_name(peer_stage))
            self._recv_peers[(stage, peer_stage)] = p
        return p

    def _put_failed(self, src, dst, error):
        """A restarted stage may listen elsewhere: ask the directory again."""
        self._stale[dst] = self._dir_cache.pop(dst, None)
        self._peer_of.pop((src, dst), None)

    def _moved(self, dst):
        """After a failed put to dst: whether the directory now names another
        engine for it (a restarted stage; waits up to put_timeout for one to
        register), so that the put is worth one more try."""
        old = self._stale.pop(dst, None)
        if old is None:
            return False
        try:
            new = self._lookup(dst, self._put_timeout)
        except Exception:
            return False
        return new["incarnation"] != old["incarnation"]

    def peer(self, to_stage, from_stage=None):
        """The ferry Peer this process sends to to_stage through (resolved in
        the directory and connected): for streams, engine().put_chunk(peer, ...)."""
        src = _stage_str(self.stage_id if from_stage is None else from_stage, "from_stage")
        return self._peer(src, _stage_str(to_stage, "to_stage"))

    def directory(self):
        """The directory's entries (for debugging and health)."""
        return self._directory.call("engines")

    # --- mode object_store: the RFC's design --------------------------------

    def _ref_key(self, key, src, dst):
        return f"{key}@{src}_{dst}#{self.rank}"

    def put(self, from_stage, to_stage, put_key, data):
        if self.mode == "ferry":
            r = super().put(from_stage, to_stage, put_key, data)
            if not r[0] and self._moved(_stage_str(to_stage, "to_stage")):
                logger.info("RayConnector: stage %s registered again: put %s once more",
                            to_stage, put_key)
                r = super().put(from_stage, to_stage, put_key, data)
            return r
        src, dst = _stage_str(from_stage, "from_stage"), _stage_str(to_stage, "to_stage")
        key = _key_str(put_key, "put_key")
        parts, size = _payload.encode(data, self._min_segment)
        try:
            import numpy as np
            total = sum(memoryview(p).nbytes for p in parts)
            blob = np.empty(total, dtype=np.uint8)
            off = 0
            for p in parts:
                m = memoryview(p).cast("B")
                blob[off:off + m.nbytes] = m
                off += m.nbytes
            ref = self._ray.put(blob)
            del blob
            self._directory.call("put", self._ref_key(key, src, dst), [ref], self._owner,
                                 timeout=self._put_timeout)
        except Exception as e:
            self._metrics["put_failures"] += 1
            logger.error("RayConnector put %s (%s -> %s) failed: %s", key, src, dst, e)
            return False, 0, None
        self._metrics["puts"] += 1
        self._metrics["bytes_transferred"] += size
        return True, size, {"ray": {"key": self._ref_key(key, src, dst)}, "size": size}

    def _get(self, src, dst, key, nowait, timeout):
        if self.mode == "ferry":
            return super()._get(src, dst, key, nowait, timeout)
        ray = self._ray
        start = time.monotonic()
        wait = 0.0 if nowait else float(timeout)
        try:
            refs = self._directory.call("take", self._ref_key(key, src, dst), wait,
                                        timeout=wait + 30)
            if refs is None:
                return None
            if refs == "dead":
                raise ConnectionResetError(f"the producer of {key} died before it was taken")
            left = max(self._put_timeout, (wait - (time.monotonic() - start)))
            arr = ray.get(refs[0], timeout=left)
        except Exception as e:
            self._metrics["get_errors"] += 1
            logger.error("RayConnector get %s (%s -> %s) failed: %s", key, src, dst, e)
            return None
        try:
            payload, size = _payload.decode(_frame(arr), copy=self._copy)
        except _payload.FrameError as e:
            self._metrics["get_errors"] += 1
            logger.error("RayConnector get %s (%s -> %s): %s", key, src, dst, e)
            return None
        self._metrics["gets"] += 1
        return payload, size

    def cleanup(self, request_id):
        if self.mode == "ferry":
            return super().cleanup(request_id)
        key = _key_str(request_id, "request_id")
        try:
            self._directory.call("delete_by_prefix", [key + s for s in CLEANUP_SEPARATORS],
                                 f"_{self.stage_id}#{self.rank}", timeout=self._put_timeout)
        except Exception as e:
            logger.warning("RayConnector cleanup %s: %s", key, e)

    def health(self):
        h = super().health()
        h.update({"connector": NAME, "mode": self.mode, "ray_namespace": self.ray_namespace,
                  "actor_name": self.actor_name, "registered": len(self._registered)})
        return h

    def close(self):
        """Unregister this connector's engines (the last holder of an engine
        in the process does), then close them as FerryConnector does."""
        if getattr(self, "_closed", True):
            return
        d, regs = self._directory, getattr(self, "_registered", [])
        self._registered = []
        if d is not None and self._ray.is_initialized():
            for key in regs:
                try:
                    d.release(key)
                except Exception as e:  # interpreter shutdown
                    logger.debug("RayConnector close: %s", e)
        self._dir_cache = {}
        self._recv_peers = {}
        super().close()

    def __repr__(self):
        return (f"<RayConnector {self.mode} stage {self.stage_id} rank {self.rank} "
                f"{self.transport} {self.ray_namespace}/{self.actor_name}"
                f"{' closed' if self._closed else ''}>")


_frame_cls = None


def _frame(arr):
    """A frame from the object store (a read-only uint8 numpy array over
    its memory) as _payload.decode takes it: the buffer protocol, len(),
    release(); views of it keep the object alive, no copy."""
    global _frame_cls
    if _frame_cls is None:
        import numpy as np

        class _Frame(np.ndarray):
            released = False

            def release(self):
                self.released = True
        _frame_cls = _Frame
    return arr.reshape(-1).view(_frame_cls)


def _runtime_dir():
    """Where ferry's engines of this process find each other by name (two
    processes share memory only when they agree)."""
    return (os.environ.get("FERRY_RUNTIME_DIR") or os.environ.get("XDG_RUNTIME_DIR")
            or f"/tmp/ferry-{os.getuid()}")


def _create(config):
    return RayConnector(config)

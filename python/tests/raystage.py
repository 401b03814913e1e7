"""One stage of RayConnector's tests: a Ray driver process with one
RayConnector, driven by JSON lines on stdin, one JSON answer a line on
stdout (raycluster.Stage starts it in a Ray node's network namespace).

    python raystage.py RAY_ADDRESS NODE_IP CONFIG_JSON

Answers {"ready": ..., "node": ..., "pid": ...} first, then one line per
command: put (from, to, key, kind, size, seed) -> ok, size; get (from, to,
key, timeout: None for a nowait get) -> found, size, digest, seconds;
cleanup (id); health; directory; peer_address (to); kill_actor (the
directory, restarted by Ray); actor_start (config) / actor_put / actor_kill:
a stage in a Ray actor this driver starts; exit. Payloads are made from (kind, size,
seed) the same way on both sides: "bytes" (a RawPayload on arrival), "kv"
(a dict of numpy layers, as a KV handoff), "small" (a dict without large
fields); digest is sha256 of what arrived.
"""
import hashlib
import json
import os
import sys
import time


def payload(kind, size, seed):
    import numpy as np
    rng = np.random.default_rng(seed)
    if kind == "bytes":
        return rng.integers(0, 256, size, dtype=np.uint8).tobytes()
    if kind == "kv":
        n = 4
        layers = [rng.standard_normal(max(1, size // (4 * n)), dtype=np.float32)
                  for _ in range(n)]
        return {"request_id": f"r{seed}", "layers": layers, "meta": {"seed": seed}}
    return {"request_id": f"r{seed}", "token_ids": [int(x) for x in rng.integers(0, 1000, 8)]}


def digest(kind, obj):
    import numpy as np
    h = hashlib.sha256()
    if kind == "bytes":
        h.update(bytes(obj))
        if hasattr(obj, "release"):
            obj.release()
    elif kind == "kv":
        for a in obj["layers"]:
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(json.dumps(obj["meta"]).encode())
    else:
        h.update(json.dumps(obj["token_ids"]).encode())
    return h.hexdigest()


class StageActor:
    def __init__(self, cfg):
        from pyferry.ray_connector import RayConnector
        self.conn = RayConnector(cfg)

    def ready(self):
        return {"pid": os.getpid(), "owner": self.conn._owner}

    def put(self, frm, to, key, kind, size, seed):
        data = payload(kind, size, seed)
        ok, n, _ = self.conn.put(frm, to, key, data)
        return {"ok": ok, "size": n, "digest": digest(kind, data)}


def main():
    address, ip, cfg = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    import ray
    ray.init(address=address, _node_ip_address=ip, log_to_driver=False,
             namespace=cfg.get("ray_namespace") or "vllm_omni")
    from pyferry.ray_connector import RayConnector
    out = sys.stdout

    def say(**kw):
        out.write(json.dumps(kw) + "\n")
        out.flush()
    try:
        conn = RayConnector(cfg)
    except Exception as e:
        say(error=f"RayConnector: {type(e).__name__}: {e}")
        return 1
    say(ready=True, node=ray.get_runtime_context().get_node_id(), pid=os.getpid())
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            if op == "put":
                data = payload(cmd["kind"], cmd["size"], cmd["seed"])
                ok, size, _ = conn.put(cmd["from"], cmd["to"], cmd["key"], data)
                say(ok=ok, size=size, digest=digest(cmd["kind"], data) if ok else None)
            elif op == "get":
                t0 = time.monotonic()
                if cmd.get("timeout") is None:
                    r = conn.get(cmd["from"], cmd["to"], cmd["key"])
                else:
                    r = conn.get_with_deadline(cmd["from"], cmd["to"], cmd["key"],
                                               deadline=time.monotonic() + cmd["timeout"])
                dt = time.monotonic() - t0
                if r is None:
                    say(found=False, seconds=dt, errors=conn.health()["get_errors"])
                else:
                    say(found=True, size=r[1], digest=digest(cmd["kind"], r[0]), seconds=dt)
            elif op == "cleanup":
                conn.cleanup(cmd["id"])
                say(ok=True)
            elif op == "health":
                say(health=conn.health())
            elif op == "directory":
                say(entries=conn.directory())
            elif op == "peer_address":
                say(address=conn._peer_address(str(conn.stage_id), str(cmd["to"])))
            elif op == "kill_actor":
                ray.kill(conn._directory.actor, no_restart=False)
                say(ok=True)
            elif op == "actor_start":
                # A stage inside a Ray actor (as vLLM-Omni's Ray executor runs
                # them): its own RayConnector, in a worker process of Ray's.
                actor = ray.remote(num_cpus=0)(StageActor).remote(cmd["config"])
                say(ready=ray.get(actor.ready.remote(), timeout=60))
            elif op == "actor_put":
                say(**ray.get(actor.put.remote(cmd["from"], cmd["to"], cmd["key"], cmd["kind"],
                                               cmd["size"], cmd["seed"]), timeout=60))
            elif op == "actor_kill":
                ray.kill(actor, no_restart=True)
                say(ok=True)
            elif op == "close":
                conn.close()
                say(ok=True)
            elif op == "exit":
                conn.close()
                say(ok=True)
                return 0
            else:
                say(error=f"unknown op {op}")
        except Exception as e:
            say(error=f"{op}: {type(e).__name__}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

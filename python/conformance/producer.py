"""The producer stage of the conformance test: a process of its own, stage 0
of the stage YAML given on the command line, with its connector made by
upstream's path (upstream.connector_for_stage). It sends what the test asks
for, one command a line on stdin, and answers each with one JSON line on
stdout ("ready" first, once the plugins are loaded and the connector made):

    chunks REQ N          N chunk-adapter payloads, keys REQ_0_0 .. REQ_0_{N-1},
                          put as OmniChunkTransferAdapter's save loop does
    kv REQ                a KV cache, packed as OmniKVTransferManager packs it
                          for a connector with supports_raw_data, sent with
                          its _transfer_with_retry, key REQ_0_kv
    late KEY SECONDS      sleep, then put a chunk under KEY (a blocking
                          receive is waiting for it)
    cleanup KEY           the sender-side cleanup the chunk adapter does
    quit                  close the connector (twice: it is idempotent), exit
"""
import json
import sys
import time
import types

from vllm_omni.plugins import load_omni_general_plugins

import upstream

from vllm_omni.distributed.omni_connectors.kv_transfer_manager import OmniKVTransferManager


def say(**kw):
    print(json.dumps(kw), flush=True)


def main(yaml_path):
    load_omni_general_plugins()  # the entry point registers FerryConnector
    conn = upstream.connector_for_stage(yaml_path, 0)
    say(ready=True, type=type(conn).__name__, stage_id=conn.stage_id,
        role=conn.config.get("role"))
    # OmniKVTransferManager's two sending methods read only self.connector.
    mgr = types.SimpleNamespace(connector=conn)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "chunks":
            req, n = cmd[1], int(cmd[2])
            sizes = []
            for i in range(n):
                ok, size, meta = conn.put(from_stage="0", to_stage="1",
                                          put_key=upstream.chunk_key(req, 0, i),
                                          data=upstream.chunk(req, i, n))
                assert ok and size > 0 and isinstance(meta, dict), (ok, size, meta)
                sizes.append(size)
            say(sent=n, sizes=sizes)
        elif cmd[0] == "kv":
            req = cmd[1]
            data = OmniKVTransferManager._serialize_transfer_payload(mgr, upstream.kv(req))
            ok, size, _ = OmniKVTransferManager._transfer_with_retry(
                mgr, "0", "1", f"{req}_0_kv", data)
            say(sent=1 if ok else 0, size=size, kind=type(data).__name__, nbytes=len(data))
        elif cmd[0] == "late":
            key, secs = cmd[1], float(cmd[2])
            time.sleep(secs)
            ok, size, _ = conn.put("0", "1", key, upstream.chunk(key, 0, 1))
            say(sent=1 if ok else 0, size=size)
        elif cmd[0] == "cleanup":
            conn.cleanup(cmd[1])
            say(cleaned=cmd[1])
        elif cmd[0] == "quit":
            health = conn.health()
            conn.close()
            conn.close()
            say(bye=True, puts=health.get("puts"), closed=conn.closed)
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

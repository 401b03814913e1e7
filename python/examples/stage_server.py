"""A stage's receive side inside an asyncio server.

    python stage_server.py STAGES.yaml serve [PORT]   # stage 1: a line server
    python stage_server.py STAGES.yaml produce REQ N  # stage 0: N chunks of stream REQ
    python stage_server.py STAGES.yaml demo           # both, and a client, then exit

A client sends a request id per line; the server reads that request's stream
from stage 0 (`async for` over its chunks, on the loop's thread, driven by
ferry's completion-queue fd) and answers "REQ: N chunks, B bytes". The
YAML is a vLLM-Omni stage file with an edge 0 -> 1 (tests/test_example.py
writes one).
"""
import asyncio
import os
import subprocess
import sys

import pyferry

NS = os.environ.get("FERRY_NS", "stage-server")  # the pipeline's namespace


async def serve(config, port=0, ready=None):
    stage = pyferry.Stage(config, 1, ns=NS)
    peer, _ = stage.edge(0, 1)          # where stage 0's chunks come from

    async def client(reader, writer):
        while line := await reader.readline():
            req = line.decode().strip()
            n = size = 0
            async for chunk in stage.engine.astream(peer, req, timeout=10):
                n, size = n + 1, size + len(chunk)
                chunk.release()             # its credit goes back to the producer
            writer.write(f"{req}: {n} chunks, {size} bytes\n".encode())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(client, "127.0.0.1", port)
    if ready:
        ready.set_result(server.sockets[0].getsockname()[1])
    async with server:
        try:
            await server.serve_forever()
        finally:
            stage.close()


def produce(config, req, n):
    with pyferry.Stage(config, 0, ns=NS) as stage:
        peer, _ = stage.edge(0, 1)
        for i in range(n):
            stage.engine.put_chunk(peer, req, b"x" * 1000, end=(i == n - 1),
                                   timeout=10, wait_peer=True)


async def demo(config):
    ready = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(serve(config, 0, ready))
    port = await ready
    prod = subprocess.Popen([sys.executable, __file__, config, "produce", "req1", "5"])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"req1\n")
    print((await reader.readline()).decode().strip())
    writer.close()
    await asyncio.get_running_loop().run_in_executor(None, prod.wait)
    task.cancel()
    return prod.returncode


if __name__ == "__main__":
    cfg, cmd = sys.argv[1], sys.argv[2]
    if cmd == "serve":
        asyncio.run(serve(cfg, int(sys.argv[3]) if len(sys.argv) > 3 else 8765))
    elif cmd == "produce":
        produce(cfg, sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(asyncio.run(demo(cfg)))

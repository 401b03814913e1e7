"""RayConnector across two Ray nodes on one machine: a head in one network
namespace, a worker node in another, joined by a veth pair; stage 0 is a
driver on the head's node, stage 1 a driver on the worker's. The directory
sends the producer to the consumer's control address on the other node, so
ferry's tcp crosses the veth (its byte counters prove it), with the cluster
secret from Ray's internal KV. Skipped without ray, as non-root or with
FERRY_TEST_RAY=0."""
import functools
import time
import uuid

import pytest

import rayhelpers

rayhelpers.require_ray()

pytestmark = pytest.mark.timeout(300)

cluster = rayhelpers.cluster_fixture(nodes=2)
stages = rayhelpers.stages
conf = functools.partial(rayhelpers.conf, pool_size=48 << 20)
want = rayhelpers.want


def test_cross_node_over_ferry_tcp(cluster, stages):
    actor = "m" + uuid.uuid4().hex[:10]
    prod = stages(0, conf(actor, 0))
    cons = stages(1, conf(actor, 1))
    assert prod.ready["node"] != cons.ready["node"]  # each stage on its own node
    d = prod.call("directory")["entries"]
    assert d["1/0"]["node"] == cons.ready["node"] and d["0/0"]["node"] == prod.ready["node"]
    addr = prod.call("peer_address", to=1)["address"]
    assert addr.startswith(f"ferry://{cluster.ips[1]}:"), addr
    for n in range(6):
        assert prod.call("put", **{"from": 0, "to": 1}, key=f"req1_0_{n}", kind="bytes",
                         size=50000 * (n + 1), seed=n)["ok"]
    for n in range(6):
        r = cons.call("get", **{"from": 0, "to": 1}, key=f"req1_0_{n}", kind="bytes",
                      timeout=20)
        assert r["found"] and r["digest"] == want("bytes", 50000 * (n + 1), n), r
    # A 16 MB KV handoff: its bytes cross the veth.
    size = 16 << 20
    before = cluster.veth_bytes()
    cons.send("get", **{"from": 0, "to": 1}, key="req2", kind="kv", timeout=60)
    time.sleep(0.3)
    assert prod.call("put", **{"from": 0, "to": 1}, key="req2", kind="kv", size=size,
                     seed=4)["ok"]
    r = cons.answer(70)
    assert r["found"] and r["digest"] == want("kv", size, 4), r
    moved = cluster.veth_bytes() - before
    assert moved >= size, moved
    assert prod.call("put", **{"from": 0, "to": 1}, key="req3_0_0", kind="small", size=0,
                     seed=1)["ok"]
    assert cons.call("cleanup", id="req3")["ok"]
    assert not cons.call("get", **{"from": 0, "to": 1}, key="req3_0_0", kind="small",
                         timeout=0.5)["found"]
    # The producer killed: the consumer's waiting get fails before its deadline.
    cons.send("get", **{"from": 0, "to": 1}, key="req4", kind="small", timeout=40)
    time.sleep(0.5)
    prod.kill()
    r = cons.answer(60)
    assert not r["found"] and r["seconds"] < 20 and r["errors"] >= 1, r
    # Restarted on its node: it registers again and traffic resumes.
    prod2 = stages(0, conf(actor, 0))
    assert prod2.call("put", **{"from": 0, "to": 1}, key="req5", kind="bytes", size=300000,
                      seed=5)["ok"]
    r = cons.call("get", **{"from": 0, "to": 1}, key="req5", kind="bytes", timeout=20)
    assert r["found"] and r["digest"] == want("bytes", 300000, 5)
    # The consumer restarted (at a new port): the producer's put to the dead
    # one fails, it looks the stage up again, finds the new one and puts
    # there: the caller's put succeeds.
    cons.kill()
    cons2 = stages(1, conf(actor, 1))
    assert prod2.call("put", **{"from": 0, "to": 1}, key="req6_0_0", kind="small", size=0,
                      seed=6, wait=60)["ok"]
    r = cons2.call("get", **{"from": 0, "to": 1}, key="req6_0_0", kind="small", timeout=10)
    assert r["found"] and r["digest"] == want("small", 0, 6)


def test_cross_node_object_store(cluster, stages):
    """mode object_store across the nodes: Ray's own object transfer."""
    actor = "m" + uuid.uuid4().hex[:10]
    prod = stages(0, conf(actor, 0, mode="object_store"))
    cons = stages(1, conf(actor, 1, mode="object_store"))
    size = 4 << 20
    before = cluster.veth_bytes()
    assert prod.call("put", **{"from": 0, "to": 1}, key="kv", kind="kv", size=size,
                     seed=8)["ok"]
    r = cons.call("get", **{"from": 0, "to": 1}, key="kv", kind="kv", timeout=30)
    assert r["found"] and r["digest"] == want("kv", size, 8), r
    assert cluster.veth_bytes() - before >= size

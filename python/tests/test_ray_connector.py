"""RayConnector with real Ray (python/requirements-ray.txt; ./run test's
Ray step installs it): a local cluster in a network namespace of its own
(loopback only), two driver processes as two stages (raystage.py), in both
modes (ferry: the directory in Ray, the data over ferry's shm; object_store:
the RFC's design). Faults: a producer killed, a stage restarted, the
directory actor restarted. Skipped without ray, as non-root (network
namespaces) or with FERRY_TEST_RAY=0."""
import time
import uuid

import pytest

import rayhelpers

rayhelpers.require_ray()

pytestmark = pytest.mark.timeout(240)

cluster = rayhelpers.cluster_fixture(nodes=1)
stages = rayhelpers.stages
conf = rayhelpers.conf
want = rayhelpers.want


def test_bad_config_is_refused_before_ray():
    from pyferry.ray_connector import RayConnector
    with pytest.raises(ValueError, match="mode"):
        RayConnector({"mode": "bogus"})
    with pytest.raises(ValueError, match="transport"):
        RayConnector({"transport": "rdma"})
    with pytest.raises(TypeError, match="actor_name"):
        RayConnector({"actor_name": ""})
    with pytest.raises(TypeError):
        RayConnector("not a dict")


@pytest.mark.parametrize("mode", ["ferry", "object_store"])
def test_two_drivers_chunks_kv_cleanup(stages, mode):
    actor = "t" + uuid.uuid4().hex[:10]
    prod = stages(0, conf(actor, 0, mode=mode))
    cons = stages(0, conf(actor, 1, mode=mode))
    d = prod.call("directory")["entries"]
    if mode == "ferry":
        # Both registered once at open: stage/rank -> engine and addresses.
        assert set(d) == {"0/0", "1/0"}, d
        assert d["1/0"]["addresses"][0].startswith("ferry://127.0.0.1:"), d
        # Same Ray node: found by name, shared memory (no address to connect).
        assert prod.call("peer_address", to=1)["address"] is None
    # Chunk streaming with upstream's {req}_{stage}_{n} keys, got without
    # metadata, in order, each checked.
    for n in range(8):
        r = prod.call("put", **{"from": 0, "to": 1}, key=f"req1_0_{n}", kind="bytes",
                      size=1000 + 70000 * n, seed=n)
        assert r["ok"] and r["size"] > 0, r
    for n in range(8):
        r = cons.call("get", **{"from": 0, "to": 1}, key=f"req1_0_{n}", kind="bytes",
                      timeout=20)
        assert r["found"] and r["digest"] == want("bytes", 1000 + 70000 * n, n), r
    # A get consumes: the same key is not there again.
    r = cons.call("get", **{"from": 0, "to": 1}, key="req1_0_0", kind="bytes", timeout=None)
    assert not r["found"]
    # A KV handoff (a dict of layers, ~4 MB), waited for before it is put.
    size = 4 << 20
    cons.send("get", **{"from": 0, "to": 1}, key="req2", kind="kv", timeout=30)
    time.sleep(0.5)
    assert prod.call("put", **{"from": 0, "to": 1}, key="req2", kind="kv", size=size,
                     seed=7)["ok"]
    r = cons.answer(40)
    assert r["found"] and r["digest"] == want("kv", size, 7), r
    # Cleanup: what a request left at the consumer is dropped.
    for n in range(3):
        assert prod.call("put", **{"from": 0, "to": 1}, key=f"req3_0_{n}", kind="small",
                         size=0, seed=n)["ok"]
    assert prod.call("put", **{"from": 0, "to": 1}, key="req4_0_0", kind="small", size=0,
                     seed=9)["ok"]
    assert cons.call("cleanup", id="req3")["ok"]
    for n in range(3):
        r = cons.call("get", **{"from": 0, "to": 1}, key=f"req3_0_{n}", kind="small",
                      timeout=0.5)
        assert not r["found"], n
    r = cons.call("get", **{"from": 0, "to": 1}, key="req4_0_0", kind="small", timeout=10)
    assert r["found"] and r["digest"] == want("small", 0, 9)
    # A get that waits for nothing ends at its deadline, not later.
    r = cons.call("get", **{"from": 0, "to": 1}, key="never", kind="small", timeout=1.0)
    assert not r["found"] and 0.9 <= r["seconds"] < 3.0, r
    # Close: the directory forgets the engines.
    prod.close()
    if mode == "ferry":
        assert set(cons.call("directory")["entries"]) == {"1/0"}
    cons.close()


def wait_for(fn, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.2)


def test_producer_killed_restarted(stages):
    """A producer killed: the consumer's waiting get fails long before its
    deadline, the directory drops the entry; a restarted producer registers
    again and traffic resumes."""
    actor = "t" + uuid.uuid4().hex[:10]
    prod = stages(0, conf(actor, 0))
    cons = stages(0, conf(actor, 1))
    assert prod.call("put", **{"from": 0, "to": 1}, key="a_0_0", kind="small", size=0,
                     seed=1)["ok"]
    assert cons.call("get", **{"from": 0, "to": 1}, key="a_0_0", kind="small",
                     timeout=10)["found"]
    cons.send("get", **{"from": 0, "to": 1}, key="a_0_1", kind="small", timeout=30)
    time.sleep(0.5)
    prod.kill()  # SIGKILL after SIGTERM's grace: the whole process
    r = cons.answer(40)
    assert not r["found"] and r["seconds"] < 10, r   # not the 30 s deadline
    assert r["errors"] >= 1, r                       # an error, not a timeout
    wait_for(lambda: "0/0" not in cons.call("directory")["entries"], 15,
             "the dead producer's entry dropped")
    prod2 = stages(0, conf(actor, 0))
    assert "0/0" in cons.call("directory")["entries"]
    assert prod2.call("put", **{"from": 0, "to": 1}, key="b_0_0", kind="bytes", size=200000,
                      seed=3)["ok"]
    r = cons.call("get", **{"from": 0, "to": 1}, key="b_0_0", kind="bytes", timeout=20)
    assert r["found"] and r["digest"] == want("bytes", 200000, 3)


def test_consumer_restarted(stages):
    """A consumer killed and started again: the producer's puts reach the new one."""
    actor = "t" + uuid.uuid4().hex[:10]
    prod = stages(0, conf(actor, 0))
    cons = stages(0, conf(actor, 1))
    assert prod.call("put", **{"from": 0, "to": 1}, key="c_0_0", kind="small", size=0,
                     seed=1)["ok"]
    cons.kill()
    cons2 = stages(0, conf(actor, 1))
    ok = False
    for n in range(3):  # at most one put may meet the dead one
        ok = prod.call("put", **{"from": 0, "to": 1}, key=f"d_0_{n}", kind="small", size=0,
                       seed=n)["ok"]
        if ok:
            break
    assert ok
    r = cons2.call("get", **{"from": 0, "to": 1}, key=f"d_0_{n}", kind="small", timeout=10)
    assert r["found"] and r["digest"] == want("small", 0, n)


def test_directory_actor_restart(stages):
    """The directory actor killed (Ray restarts it, max_restarts): every
    engine registers again by itself, and a stage opened afterwards finds
    them."""
    actor = "t" + uuid.uuid4().hex[:10]
    prod = stages(0, conf(actor, 0))
    cons = stages(0, conf(actor, 1))
    assert set(prod.call("directory")["entries"]) == {"0/0", "1/0"}
    assert prod.call("kill_actor")["ok"]
    t0 = time.monotonic()
    wait_for(lambda: set(_entries(prod)) == {"0/0", "1/0"}, 30, "re-registration")
    print(f"registered again after {time.monotonic() - t0:.2f}s")
    # A third process (a fresh cache) finds the consumer through the new actor.
    prod.close()
    prod2 = stages(0, conf(actor, 0))
    assert prod2.call("put", **{"from": 0, "to": 1}, key="e_0_0", kind="bytes", size=100000,
                      seed=5)["ok"]
    r = cons.call("get", **{"from": 0, "to": 1}, key="e_0_0", kind="bytes", timeout=20)
    assert r["found"] and r["digest"] == want("bytes", 100000, 5)


def _entries(stage):
    try:
        return stage.call("directory", wait=20)["entries"]
    except AssertionError:  # the actor is restarting
        return {}


def test_object_store_producer_killed(stages):
    """mode object_store: a key whose producer died fails at once (its
    object's owner is gone), not at the deadline."""
    actor = "t" + uuid.uuid4().hex[:10]
    prod = stages(0, conf(actor, 0, mode="object_store"))
    cons = stages(0, conf(actor, 1, mode="object_store"))
    for n in range(2):
        assert prod.call("put", **{"from": 0, "to": 1}, key=f"f_0_{n}", kind="bytes",
                         size=300000, seed=2)["ok"]
    prod.kill()
    # At once: ray.get of a ref whose owner died fails.
    r = cons.call("get", **{"from": 0, "to": 1}, key="f_0_0", kind="bytes", timeout=20)
    assert not r["found"] and r["seconds"] < 10, r
    # After the actor's sweep dropped the dead owner's refs: a tombstone
    # answers the take at once (the key does not wait for its deadline).
    time.sleep(3)
    r = cons.call("get", **{"from": 0, "to": 1}, key="f_0_1", kind="bytes", timeout=20)
    assert not r["found"] and r["seconds"] < 10 and r["errors"] >= 2, r


def test_stage_in_a_ray_actor(stages):
    """A stage that is a Ray actor (a worker process of Ray's, as vLLM-Omni's
    Ray executor runs stages): it registers, its puts arrive, and when it is
    killed the directory drops it (Ray's worker table says it is dead)."""
    actor = "t" + uuid.uuid4().hex[:10]
    cons = stages(0, conf(actor, 1))
    r = cons.call("actor_start", config=conf(actor, 0), wait=90)
    assert r["ready"]["owner"]["actor"] and not r["ready"]["owner"]["driver"], r
    assert "0/0" in cons.call("directory")["entries"]
    r = cons.call("actor_put", **{"from": 0, "to": 1}, key="g_0_0", kind="bytes", size=150000,
                  seed=6)
    assert r["ok"], r
    r = cons.call("get", **{"from": 0, "to": 1}, key="g_0_0", kind="bytes", timeout=20)
    assert r["found"] and r["digest"] == want("bytes", 150000, 6)
    assert cons.call("actor_kill")["ok"]
    wait_for(lambda: "0/0" not in cons.call("directory")["entries"], 15,
             "the killed actor's entry dropped")

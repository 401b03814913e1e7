"""What RayConnector's tests with real Ray (test_ray_connector.py,
test_ray_multinode.py) share: the skips (no ray, FERRY_TEST_RAY=0, not
root), the cluster fixture of N nodes (raycluster.Cluster), the stages
fixture (stages started by a test, killed after it), a stage's config and
the digest a payload must arrive with. A test module calls require_ray()
before it imports anything of Ray's, then binds the fixtures by name:

    rayhelpers.require_ray()
    cluster = rayhelpers.cluster_fixture(nodes=1)
    stages = rayhelpers.stages
"""
import os

import pytest


def require_ray():
    """Skips the calling test module (at import) without ray, with
    FERRY_TEST_RAY=0 or as non-root (network namespaces)."""
    pytest.importorskip("ray")
    if os.environ.get("FERRY_TEST_RAY", "1") == "0":
        pytest.skip("FERRY_TEST_RAY=0", allow_module_level=True)
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces)", allow_module_level=True)


def cluster_fixture(nodes):
    """A module-scoped fixture: one raycluster.Cluster of `nodes` nodes,
    stopped after the module's last test."""
    @pytest.fixture(scope="module")
    def cluster():
        from raycluster import Cluster
        c = Cluster(nodes=nodes)
        yield c
        c.stop()
    return cluster


@pytest.fixture
def stages(cluster):
    """Stages started by a test, killed after it (whatever happened)."""
    started = []

    def start(node, config):
        s = cluster.stage(node, config)
        started.append(s)
        return s
    yield start
    for s in started:
        s.kill()


def conf(actor, stage, pool_size=32 << 20, **kw):
    """A RayConnector config for stage `stage` of directory actor `actor`;
    kw adds to it or overrides."""
    c = {"actor_name": actor, "stage_id": stage, "put_timeout": 20, "sweep_s": 0.5,
         "pool_size": pool_size}
    c.update(kw)
    return c


def want(kind, size, seed):
    """The digest raystage.py reports for the payload (kind, size, seed)."""
    import raystage
    return raystage.digest(kind, raystage.payload(kind, size, seed))

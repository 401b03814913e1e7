"""Stages opened from a vLLM-Omni stage YAML: upstream's connector shapes."""
import errno
import os

import pytest

import pyferry
from conftest import child, finish

YAML = """
stage_args:
  - stage_id: 0
    output_connectors:
      to_stage_1: shm
  - stage_id: 1
    input_connectors:
      from_stage_0: shm
runtime:
  connectors:
    shm:
      name: SharedMemoryConnector
"""

STAGE0 = """
import sys, pyferry
path, ns = sys.argv[1], sys.argv[2]
with pyferry.Stage(path, 0, 0, ns=ns, timeout=20) as s:
    ok, size, meta = s.put(0, 1, "req7_0_0", b"x" * 5000)
    assert ok and size == 5000 and len(meta) == 64
    print(meta.hex(), flush=True)
    ok, size, _ = s.put("0", "1", "req7_0_1", bytearray(b"second"))
    buf = s.engine.alloc(3)
    memoryview(buf)[:] = b"zc!"
    s.put(0, 1, "req7_0_2", buf)
    assert buf.released
    sys.stdin.readline()   # until the parent is done
"""


@pytest.fixture
def config(tmp_path):
    p = tmp_path / "stages.yaml"
    p.write_text(YAML)
    return str(p)


def test_stage_put_get_across_processes(config, ns):
    with pyferry.Stage(config, "1", ns=ns, timeout=20) as s1:
        proc = child(STAGE0, config, ns)
        meta = bytes.fromhex(proc.stdout.readline().strip())
        buf, size = s1.get(0, 1, "req7_0_0", meta, timeout=20)
        assert size == 5000 and buf.tobytes() == b"x" * 5000
        buf.release()
        buf, size = s1.get("0", "1", "req7_0_1", timeout=20)  # without metadata
        assert buf.tobytes() == b"second"
        assert s1.get(0, 1, "req7_0_2", timeout=20)[0].tobytes() == b"zc!"
        assert s1.get(0, 1, "req7_0_9", nowait=True) is None   # upstream's "poll again"
        with pytest.raises(TimeoutError):
            s1.get(0, 1, "req7_0_9", timeout=0.05)
        assert s1.cleanup("req7") == 0
        h = s1.health()
        assert isinstance(h, dict)
        peer, whole = s1.edge(0, 1)
        assert peer.name == "stage0.rank0" and whole is False
        proc.send("")
        finish(proc)
    s1.close()  # idempotent
    with pytest.raises(ValueError):
        s1.get(0, 1, "k")


def test_stage_errors(config, tmp_path, ns):
    with pytest.raises(FileNotFoundError) as ei:
        pyferry.Stage(str(tmp_path / "missing.yaml"), 0, ns=ns)
    assert ei.value.errno == errno.ENOENT
    bad = tmp_path / "bad.yaml"
    bad.write_text("stage_args: [ {stage_id: 0, output_connectors: {to_stage_1: nope}} ]\n")
    with pytest.raises(pyferry.FerryInvalidError) as ei:
        pyferry.Stage(str(bad), 0, ns=ns)
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(pyferry.FerryInvalidError):
        pyferry.Stage(config, 9, ns=ns)   # no such stage
    with pyferry.Stage(config, 0, ns=ns) as s0:
        with pytest.raises(pyferry.FerryInvalidError):
            s0.put(1, 0, "k", b"x")   # not an edge this stage sends on
        with pytest.raises(ValueError):
            s0.get(1, 0, "k", b"short-metadata")
        with pytest.raises(ValueError):
            s0.engine.close()     # the stage's engine goes with the stage
    assert os.path.exists(config)

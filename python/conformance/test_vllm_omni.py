"""Conformance with vLLM-Omni 0.30.0 itself (the real wheel, in the cached
environment ./run test's vllm-omni step builds): FerryConnector made from a
stage YAML through upstream's own factory path, registered by the package's
plugin entry points, and driven across two processes as upstream's chunk
transfer adapter, its KV transfer manager and its model runner's blocking
stage-payload receive drive a connector.

This process is stage 1 (the receiver); producer.py, a child process, is
stage 0. Both get their connector from upstream.connector_for_stage. Every
test bounds its time (pytest-timeout, and deadlines on every wait); the
module has its own FERRY_RUNTIME_DIR and ferry namespace.
"""
import json
import os
import queue
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch

from vllm_omni.plugins import load_omni_general_plugins
from vllm_omni.distributed.omni_connectors import OmniConnectorBase, OmniConnectorFactory
from vllm_omni.distributed.omni_connectors.kv_transfer_manager import KVCacheTransferData
from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
    OmniChunkTransferAdapter,
)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import upstream  # noqa: E402

# The producer's imports (torch, vllm, vllm_omni) take tens of seconds on a
# busy machine: the module fixture's setup is bounded by this, each wait in a
# test by its own deadline.
pytestmark = pytest.mark.timeout(300)

STAGES_YAML = """\
connectors:
  ferry:
    name: FerryConnector
    extra:
      transport: shm
      namespace: {ns}
      pool_size: 33554432
stages:
  - stage_id: 0
    output_connectors:
      to_stage_1: ferry
  - stage_id: 1
    input_connectors:
      from_stage_0: ferry
"""


class Producer:
    """producer.py in a child process: commands on its stdin, its JSON answers
    read by a thread (the child's logging shares its stdout), its stderr in a
    file."""

    def __init__(self, yaml_path, env, log_path):
        self.log_path = log_path
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "producer.py"), yaml_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True, env=env, cwd=HERE)
        self.lines = queue.Queue()
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self):
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                self.lines.put(json.loads(line))
        self.lines.put(None)

    def _stderr(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()[-4000:]

    def read(self, timeout=180):
        """The child's next answer (its imports take a while)."""
        try:
            msg = self.lines.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            raise AssertionError(f"producer said nothing in {timeout}s: {self._stderr()}")
        if msg is None:
            self.proc.wait(timeout=10)
            raise AssertionError(f"producer exited {self.proc.returncode}: {self._stderr()}")
        return msg

    def send(self, line):
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def ask(self, line, timeout=60):
        self.send(line)
        return self.read(timeout)


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """(receiver connector of stage 1, the producer process, yaml path)."""
    d = tmp_path_factory.mktemp("conformance")
    run = d / "run"
    run.mkdir(mode=0o700)
    old = os.environ.get("FERRY_RUNTIME_DIR")
    os.environ["FERRY_RUNTIME_DIR"] = str(run)
    ns = "conf-" + uuid.uuid4().hex[:10]
    yaml_path = d / "stages.yaml"
    yaml_path.write_text(STAGES_YAML.format(ns=ns))
    load_omni_general_plugins()
    prod = Producer(str(yaml_path), dict(os.environ), str(d / "producer.log"))
    conn = upstream.connector_for_stage(str(yaml_path), 1)
    try:
        hello = prod.read()
        assert hello == {"ready": True, "type": "FerryConnector", "stage_id": 0,
                         "role": "sender"}
        yield conn, prod, str(yaml_path)
        bye = prod.ask("quit")
        assert bye["bye"] and bye["closed"] and bye["puts"] > 0
        assert prod.proc.wait(timeout=30) == 0
    finally:
        if prod.proc.poll() is None:
            prod.proc.kill()
            prod.proc.wait()
        prod.log.close()
        conn.close()
        if old is None:
            os.environ.pop("FERRY_RUNTIME_DIR", None)
        else:
            os.environ["FERRY_RUNTIME_DIR"] = old


def poll_get(conn, key, metadata=None, timeout=30.0):
    """What OmniChunkTransferAdapter's recv loop does for one request: get()
    without waiting, again every millisecond while it returns None."""
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        polls += 1
        result = conn.get("0", "1", key, metadata)
        if result is not None:
            return result, polls
        assert time.monotonic() < deadline, f"{key} did not arrive in {timeout}s"
        time.sleep(0.001)


def test_plugins_register_ferry_connector(pipeline):
    """The package's entry points (vllm.general_plugins and
    vllm_omni.general_plugins) put FerryConnector in upstream's factory, and
    the factory made a real OmniConnectorBase from the YAML's name."""
    conn, _, _ = pipeline
    assert "FerryConnector" in OmniConnectorFactory.list_registered_connectors()
    from pyferry.connector import FerryConnector, UPSTREAM_BASE
    assert UPSTREAM_BASE
    assert isinstance(conn, FerryConnector) and isinstance(conn, OmniConnectorBase)
    assert conn.stage_id == 1 and conn.config["role"] == "receiver"
    # raw payloads (device tensors from KV transfer) only where ferry's CUDA
    # runtime sees a device: False on this CPU-only host
    import pyferry.cuda
    assert conn.supports_raw_data is pyferry.cuda.available()
    assert conn._make_key("r", "0", "1") == "r@0_1"
    h = conn.health()
    assert h["connector"] == "FerryConnector" and h["stage_id"] == 1


def test_chunk_adapter_keys_polled_without_metadata(pipeline):
    """Chunks keyed {req}_{stage}_{chunk}, taken by get() polled without
    metadata, come back as the adapter reads them: a mutable dict whose meta
    is a dict, tensors equal to what was sent, finished only on the last."""
    conn, prod, _ = pipeline
    req, n = "req-chunks", 3
    assert conn.get("0", "1", upstream.chunk_key(req, 0, 0)) is None  # not sent yet
    reply = prod.ask(f"chunks {req} {n}")
    assert reply["sent"] == n
    for i in range(n):
        key = upstream.chunk_key(req, 0, i)
        (payload, size), _ = poll_get(conn, key)
        assert size == reply["sizes"][i]
        assert isinstance(payload, dict)
        meta = payload.get("meta", {})
        assert isinstance(meta, dict)
        payload["meta"] = meta  # the adapter writes into what get returned
        meta["streaming_prompt_recompute"] = False
        assert OmniChunkTransferAdapter._is_truthy_scalar(meta.get("finished")) == (i == n - 1)
        assert not OmniChunkTransferAdapter._is_truthy_scalar(meta.get("is_segment_finished"))
        assert meta["request_id"] == req and meta["chunk_seq"] == i
        assert payload["request_id"] == req and payload["generated_len"] == i
        assert torch.equal(payload["hidden"], upstream.hidden(req, i))
        audio = payload.get("codes", {}).get("audio")
        assert isinstance(audio, torch.Tensor) and torch.equal(audio, upstream.audio(req, i))
        # taken once: polling the same key again finds nothing
        assert conn.get("0", "1", key) is None
        del payload, meta, audio


def test_chunk_adapter_source_metadata_is_optional(pipeline):
    """The adapter passes its entry's source_metadata ({source_host,
    source_port}) when the request carries sender info: the key still finds
    the data."""
    conn, prod, _ = pipeline
    req = "req-meta"
    assert prod.ask(f"chunks {req} 1")["sent"] == 1
    (payload, _), _ = poll_get(conn, upstream.chunk_key(req, 0, 0),
                               metadata={"source_host": "127.0.0.1", "source_port": 50051})
    assert torch.equal(payload["hidden"], upstream.hidden(req, 0))


def test_kv_transfer_manager_raw_payload(pipeline):
    """KV transfer: the manager packs the cache (supports_raw_data: it tries
    the device tensor, then packed bytes on a CPU-only host) and sends it with
    its retrying put; the receiver does what its receive loop does with an
    object that has .tensor and .release(): unpack from memoryview(tensor
    .numpy()), clone the tensors, release the buffer."""
    conn, prod, _ = pipeline
    req = "req-kv"
    reply = prod.ask(f"kv {req}")
    assert reply["sent"] == 1 and reply["kind"] == "bytes"
    (raw, size), _ = poll_get(conn, f"{req}_0_kv")
    assert size == reply["size"]
    assert hasattr(raw, "tensor") and hasattr(raw, "release")
    buf_tensor = raw.tensor
    assert buf_tensor.dtype == torch.uint8 and buf_tensor.dim() == 1
    assert buf_tensor.device.type == "cpu" and buf_tensor.numel() == reply["nbytes"]
    data = KVCacheTransferData.from_bytes(memoryview(buf_tensor.numpy()))
    caches = data["layer_blocks"]
    caches["key_cache"] = [t.clone() for t in caches["key_cache"]]
    caches["value_cache"] = [t.clone() for t in caches["value_cache"]]
    del buf_tensor
    raw.release()
    keys, values = upstream.kv_tensors(req)
    assert data["request_id"] == req and data["block_ids"] == [3, 1, 4]
    assert data["metadata"] == {"seq_len": 4, "from": "stage0"}
    for got, want in zip(caches["key_cache"] + caches["value_cache"], keys + values):
        assert got.dtype == want.dtype and torch.equal(got, want)


def test_get_with_deadline_blocks_until_the_put(pipeline):
    """The model runner's recv_stage_payload: get_with_deadline with an
    absolute time.monotonic() deadline, retried until it passes, then
    abandon_get. ferry waits inside the call: the payload put 0.5 s later is
    returned by the first call, well before the deadline."""
    conn, prod, _ = pipeline
    key = "req-late_0_0"
    prod.send(f"late {key} 0.5")
    t0 = time.monotonic()
    deadline = t0 + 20.0
    calls = 0
    result = None
    try:
        while True:
            calls += 1
            result = conn.get_with_deadline("0", "1", key, None, deadline=deadline)
            if result is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(0.05, remaining))
    finally:
        conn.abandon_get(key)
    took = time.monotonic() - t0
    assert prod.read()["sent"] == 1
    assert result is not None, "nothing by the deadline"
    assert calls == 1, f"returned early {calls - 1} times: it did not wait"
    assert 0.3 < took < 15.0, took
    assert torch.equal(result[0]["hidden"], upstream.hidden(key, 0))


def test_get_with_deadline_honours_the_deadline(pipeline):
    """Nothing is sent: the call returns None when the deadline passes, not
    before it and not long after it; a passed deadline returns at once."""
    conn, _, _ = pipeline
    t0 = time.monotonic()
    assert conn.get_with_deadline("0", "1", "req-never_0_0", None, deadline=t0 + 0.4) is None
    took = time.monotonic() - t0
    assert 0.35 < took < 5.0, took
    t0 = time.monotonic()
    assert conn.get_with_deadline("0", "1", "req-never_0_0", deadline=t0 - 1) is None
    assert time.monotonic() - t0 < 1.0
    conn.abandon_get("req-never_0_0")


def test_cleanup_drops_a_request(pipeline):
    """cleanup: the sender side's (the adapter's key by key) is harmless; the
    receiver's drops the request's chunks not yet taken, by exact key and by
    request id, so a later get finds nothing."""
    conn, prod, _ = pipeline
    assert prod.ask("chunks req-clean 3")["sent"] == 3
    assert prod.ask("cleanup req-clean_0_0")["cleaned"] == "req-clean_0_0"
    (payload, _), _ = poll_get(conn, "req-clean_0_0")  # the sender's cleanup left it
    del payload
    # a put returns once the receiving stage holds the key: both are here
    conn.cleanup("req-clean_0_1")
    assert conn.get("0", "1", "req-clean_0_1") is None
    conn.cleanup("req-clean")
    assert conn.get("0", "1", "req-clean_0_2") is None
    # the next request is unaffected
    assert prod.ask("chunks req-after 1")["sent"] == 1
    (payload, _), _ = poll_get(conn, "req-after_0_0")
    assert torch.equal(payload["hidden"], upstream.hidden("req-after", 0))

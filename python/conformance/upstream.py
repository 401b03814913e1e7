"""What the conformance test and its producer process share: how a stage
worker of vLLM-Omni 0.30.0 gets its connector, and the payloads they send.

connector_for_stage(yaml_path, stage_id) follows upstream's own path from a
stage YAML to a connector object, step by step with upstream's functions:
load_omni_transfer_config(yaml) -> get_stage_connector_config(cfg, stage)
(the per-stage edge specs, role injected) -> the first spec, from_stage and
to_stage dropped for a connector that is not a transfer engine (what
vllm_omni.engine.stage_init_utils.get_stage_connector_spec does; that module
itself imports torchvision, which this environment leaves out) -> the
stage_connector_config that OmniEngineArgs.create_model_config builds
({"name", "extra" + stage_id}) -> OmniChunkTransferAdapter.create_connector
(model_config), upstream's classmethod, which calls resolve_connector_spec
and OmniConnectorFactory.create_connector.

The payloads are deterministic, so the receiver can check every byte:
chunk(req, i, n) is an OmniPayloadStruct as the chunk adapter sends (tensor
fields, a MetaStruct with finished / is_segment_finished tensors); kv(req)
is a KVCacheTransferData as the KV transfer manager packs.
"""
import types

import torch

from vllm_omni.data_entry_keys import CodesStruct, MetaStruct, OmniPayloadStruct
from vllm_omni.distributed.omni_connectors import get_stage_connector_config, load_omni_transfer_config
from vllm_omni.distributed.omni_connectors.kv_transfer_manager import KVCacheTransferData
from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
    OmniChunkTransferAdapter,
)
from vllm_omni.distributed.omni_connectors.utils.config import TRANSFER_ENGINE_CONNECTOR_NAMES

HIDDEN = (64, 512)  # float32: 128 KiB, a field over zero_copy_min: a segment of its own


def stage_connector_config(yaml_path, stage_id):
    cfg = load_omni_transfer_config(yaml_path)
    specs = get_stage_connector_config(cfg, stage_id)
    spec = dict(next(iter(specs.values()))["spec"])
    extra = dict(spec.get("extra", {}))
    if spec.get("name") not in TRANSFER_ENGINE_CONNECTOR_NAMES:
        extra.pop("from_stage", None)
        extra.pop("to_stage", None)
    extra["stage_id"] = stage_id
    return {"name": spec["name"], "extra": extra}


def connector_for_stage(yaml_path, stage_id):
    model_config = types.SimpleNamespace(
        stage_connector_config=stage_connector_config(yaml_path, stage_id), stage_id=stage_id)
    return OmniChunkTransferAdapter.create_connector(model_config)


def chunk_key(req, stage_id, chunk_id):
    """The chunk adapter's connector key (put and get sides)."""
    return f"{req}_{stage_id}_{chunk_id}"


def _seed(req, i):
    return (sum(req.encode()) * 31 + i) % 1000


def hidden(req, i):
    return torch.arange(HIDDEN[0] * HIDDEN[1], dtype=torch.float32).reshape(HIDDEN) + _seed(req, i)


def audio(req, i):
    return torch.arange(16, dtype=torch.int64) * (i + 1) + _seed(req, i)


def chunk(req, i, n):
    return OmniPayloadStruct(
        hidden=hidden(req, i),
        codes=CodesStruct(audio=audio(req, i)),
        meta=MetaStruct(finished=torch.tensor(i == n - 1, dtype=torch.bool),
                        is_segment_finished=torch.tensor(False, dtype=torch.bool),
                        request_id=req, chunk_seq=i),
        request_id=req, generated_len=i)


def kv_tensors(req, layers=2):
    s = _seed(req, 0)
    keys = [torch.arange(4 * 8 * 16, dtype=torch.float16).reshape(4, 8, 16) + s + l
            for l in range(layers)]
    values = [torch.full((4, 8, 16), float(l + 1), dtype=torch.bfloat16) for l in range(layers)]
    return keys, values


def kv(req):
    keys, values = kv_tensors(req)
    return KVCacheTransferData(request_id=req,
                               layer_blocks={"key_cache": keys, "value_cache": values},
                               block_ids=[3, 1, 4], metadata={"seq_len": 4, "from": "stage0"})

"""What makes the Triton attention backend safe inside a full CUDA graph,
checked on CPU: the KV cache write skips padding slots without a host sync
(Triton interpreter, in a subprocess as the interpreter must be chosen before
triton is imported), and `build` returns its tensors at fixed addresses."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata

_SCRIPT = r"""
import torch
from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

torch.manual_seed(0)
T, H, D, NB, BS = 7, 2, 48, 5, 4
qkv = torch.randn(T, 3 * H * D)  # key/value are strided views, as in the models
key = qkv[:, H * D:2 * H * D].view(T, H, D)
value = qkv[:, 2 * H * D:].view(T, H, D)
cache = torch.randn(2, NB, BS, H, D)
ref = cache.clone()
slots = torch.tensor([5, -1, 0, 19, -1, 8, 13], dtype=torch.int64)
triton_reshape_and_cache_flash(key, value, cache[0], cache[1], slots)
for t, s in enumerate(slots.tolist()):
    if s >= 0:
        ref[0, s // BS, s % BS] = key[t]
        ref[1, s // BS, s % BS] = value[t]
assert torch.equal(cache, ref), (cache - ref).abs().max()
print("OK")
"""


def test_cache_write_skips_padding_slots():
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK"


def _common(qsl, seq_lens, block_table, slot_mapping, num_tokens):
    qsl_t = torch.tensor(qsl, dtype=torch.int32)
    seq_t = torch.tensor(seq_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl_t,
        query_start_loc_cpu=qsl_t,
        seq_lens=seq_t,
        seq_lens_cpu=seq_t,
        num_computed_tokens_cpu=seq_t - (qsl_t[1:] - qsl_t[:-1]),
        num_reqs=len(seq_lens),
        num_actual_tokens=num_tokens,
        max_query_len=max(q - p for p, q in zip(qsl, qsl[1:])),
        max_seq_len=max(seq_lens),
        block_table_tensor=block_table,
        slot_mapping=slot_mapping,
    )


def test_builder_metadata_lives_at_fixed_addresses():
    pytest.importorskip("triton")
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder

    assert TritonAttentionMetadataBuilder._cudagraph_support == AttentionCGSupport.ALWAYS
    config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_batched_tokens=32))
    builder = TritonAttentionMetadataBuilder(None, ["l0"], config, torch.device("cpu"))
    block_table = torch.zeros(4, 8, dtype=torch.int32)
    slots64 = torch.arange(32, dtype=torch.int64)
    # Two steps of the same padded size, different layouts: same addresses,
    # current contents.
    a = builder.build(0, _common([0, 3, 8], [5, 9], block_table, slots64, 8))
    b = builder.build(0, _common([0, 1, 2, 8], [4, 2, 6], block_table, slots64, 8))
    assert a.token_to_seq.data_ptr() == b.token_to_seq.data_ptr()
    assert b.token_to_seq.tolist() == [0, 1, 2, 2, 2, 2, 2, 2]
    assert a.slot_mapping.data_ptr() == b.slot_mapping.data_ptr() == slots64.data_ptr()
    # An int32 slot mapping is copied into the builder's own int64 buffer.
    c = builder.build(0, _common([0, 8], [8], block_table, slots64.int(), 8))
    d = builder.build(0, _common([0, 8], [8], block_table, slots64.int() + 1, 8))
    assert c.slot_mapping.data_ptr() == d.slot_mapping.data_ptr()
    assert d.slot_mapping.dtype == torch.int64 and d.slot_mapping[0] == 1

"""Python wrappers over the compiled ops (upstream: vllm/_custom_ops.py).

The CPU ops live in `vllm._C` (built from csrc/cpu by CMake through setup.py)
and register as `torch.ops._C_cpu.<name>`. Importing this module loads the
library when it was built; every wrapper falls back to a pure-PyTorch
implementation with the same semantics when it was not, so the package runs
without a compiler. `cpu_ops_available()` says which path is live.

Signatures follow upstream's (`out` first, in-place ops return None).
"""
from __future__ import annotations

import importlib
import os

import torch
import torch.nn.functional as F

from vllm.logger import init_logger

logger = init_logger(__name__)


# Every op the wrappers below call; a build missing one is not used at all.
_REQUIRED_OPS = ("paged_attention_decode", "reshape_and_cache", "rms_norm",
                 "fused_add_rms_norm", "fused_add_rms_norm_out", "rotary_embedding",
                 "rotary_embedding_out", "silu_and_mul")


def _load_extension() -> str | None:
    """Import vllm._C; returns why it is unavailable, or None when loaded.

    VLLM_CPU_DISABLE_CUSTOM_OPS=1 keeps the torch paths (A/B timing)."""
    if os.environ.get("VLLM_CPU_DISABLE_CUSTOM_OPS") == "1":
        return "disabled by VLLM_CPU_DISABLE_CUSTOM_OPS=1"
    try:
        importlib.import_module("vllm._C")
    except ImportError as e:
        return str(e)
    missing = [op for op in _REQUIRED_OPS if not hasattr(torch.ops._C_cpu, op)]
    if missing:  # a library built from older sources: rebuild with `pip install -e .`
        return f"vllm._C is stale (no {', '.join(missing)}); rebuild it"
    return None


_LOAD_ERROR = _load_extension()
if _LOAD_ERROR is not None:
    logger.debug("Compiled CPU ops unavailable (%s); using PyTorch fallbacks.", _LOAD_ERROR)


def cpu_ops_available() -> bool:
    """True when the compiled `_C_cpu` ops are loaded."""
    return _LOAD_ERROR is None


def cpu_ops_load_error() -> str | None:
    """Why the compiled ops are not loaded (None when they are)."""
    return _LOAD_ERROR


def _use_compiled(t: torch.Tensor) -> bool:
    return (_LOAD_ERROR is None and t.device.type == "cpu"
            and t.dtype in (torch.float32, torch.bfloat16))


# ---------------------------------------------------------------- layernorm
def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor,
             epsilon: float) -> None:
    """out = input / sqrt(mean(input^2) + eps) * weight, rows of [T, hidden]."""
    if _use_compiled(input) and input.dim() == 2:
        torch.ops._C_cpu.rms_norm(out, input, weight, epsilon)
        return
    out.copy_(F.rms_norm(input, (input.shape[-1],), weight, epsilon))


def fused_add_rms_norm(input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       epsilon: float) -> None:
    """In place: residual <- input + residual; input <- rms_norm(residual)."""
    if _use_compiled(input) and input.dim() == 2:
        torch.ops._C_cpu.fused_add_rms_norm(input, residual, weight, epsilon)
        return
    residual.add_(input)
    input.copy_(F.rms_norm(residual, (residual.shape[-1],), weight, epsilon))


def fused_add_rms_norm_out(out: torch.Tensor, residual_out: torch.Tensor,
                           input: torch.Tensor, residual: torch.Tensor,
                           weight: torch.Tensor, epsilon: float) -> None:
    """Out of place (inputs untouched): residual_out <- input + residual;
    out <- rms_norm(residual_out). One pass over the rows."""
    if _use_compiled(input) and input.dim() == 2:
        torch.ops._C_cpu.fused_add_rms_norm_out(out, residual_out, input, residual, weight,
                                                epsilon)
        return
    torch.add(input, residual, out=residual_out)
    out.copy_(F.rms_norm(residual_out, (residual_out.shape[-1],), weight, epsilon))


# --------------------------------------------------------------- activation
def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    """out [..., d] = silu(x[..., :d]) * x[..., d:]."""
    if _use_compiled(x):
        torch.ops._C_cpu.silu_and_mul(out, x)
        return
    d = x.shape[-1] // 2
    torch.mul(F.silu(x[..., :d]), x[..., d:], out=out)


# ------------------------------------------------------------ pos encoding
def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None,
                     head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool) -> None:
    """Rotate query [T, H * D] and key [T, Hkv * D] in place by position;
    cos_sin_cache [max_pos, rot_dim] holds cos then sin."""
    if _use_compiled(query) and query.dim() == 2 and cos_sin_cache.dtype == query.dtype:
        torch.ops._C_cpu.rotary_embedding(positions, query, key, head_size,
                                          cos_sin_cache, is_neox)
        return
    rot = cos_sin_cache.shape[-1]
    cos, sin = cos_sin_cache.index_select(0, positions.flatten()).unsqueeze(1).chunk(2, -1)
    for x in (query, key):
        if x is None:
            continue
        xr = x.view(x.shape[0], -1, head_size)[..., :rot]
        if is_neox:
            x1, x2 = xr.chunk(2, dim=-1)
        else:
            x1, x2 = xr[..., 0::2], xr[..., 1::2]
        o1, o2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
        x1.copy_(o1)
        x2.copy_(o2)


def rotary_embedding_out(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                         head_size: int, cos_sin_cache: torch.Tensor, is_neox: bool,
                         query_out: torch.Tensor, key_out: torch.Tensor) -> None:
    """Out-of-place rotary: rotated copies of query/key into query_out/key_out
    (one pass; the inputs are untouched)."""
    if (_use_compiled(query) and query.dim() == 2 and key.dim() == 2
            and cos_sin_cache.dtype == query.dtype):
        torch.ops._C_cpu.rotary_embedding_out(positions, query, key, head_size, cos_sin_cache,
                                              is_neox, query_out, key_out)
        return
    query_out.copy_(query)
    key_out.copy_(key)
    rotary_embedding(positions, query_out, key_out, head_size, cos_sin_cache, is_neox)


# ------------------------------------------------------------------- cache
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write key/value [T, Hkv, D] into caches [NB, BS, Hkv, D] at
    `slot_mapping` (slot = block * BS + offset; negative = skip)."""
    if _use_compiled(key) and key_cache.is_contiguous():
        torch.ops._C_cpu.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return
    n = slot_mapping.numel()
    keep = (slot_mapping >= 0).nonzero().squeeze(1)
    slots = slot_mapping.index_select(0, keep).to(torch.int64)
    for src, cache in ((key[:n], key_cache), (value[:n], value_cache)):
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, src.index_select(0, keep))


# --------------------------------------------------------------- attention
def paged_attention_decode(out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                           value_cache: torch.Tensor, block_table: torch.Tensor,
                           seq_lens: torch.Tensor, scale: float,
                           sliding_window: int | None = None,
                           soft_cap: float | None = None) -> None:
    """One query token per sequence against its cached keys, read through the
    block table: query/out [B, H, D], caches [NB, BS, Hkv, D], block_table
    [B, max_blocks] (int32/int64), seq_lens [B] (keys 0..len-1; with a
    window, the last `sliding_window` of them). Soft-cap: cap * tanh(s / cap)."""
    if _use_compiled(query):
        torch.ops._C_cpu.paged_attention_decode(
            out, query, key_cache, value_cache, block_table, seq_lens, scale,
            sliding_window or 0, soft_cap or 0.0)
        return
    out.copy_(ref_paged_attention_decode(query, key_cache, value_cache, block_table,
                                         seq_lens, scale, sliding_window, soft_cap))


def ref_paged_attention_decode(query: torch.Tensor, key_cache: torch.Tensor,
                               value_cache: torch.Tensor, block_table: torch.Tensor,
                               seq_lens: torch.Tensor, scale: float,
                               sliding_window: int | None = None,
                               soft_cap: float | None = None) -> torch.Tensor:
    """The plain reference: per sequence, gather its keys and attend in fp32."""
    bs, hkv, d = key_cache.shape[1:]
    out = torch.empty_like(query)
    for b, n in enumerate(seq_lens.tolist()):
        blocks = block_table[b, : (n + bs - 1) // bs].long()
        k = key_cache.index_select(0, blocks).reshape(-1, hkv, d)[:n].float()
        v = value_cache.index_select(0, blocks).reshape(-1, hkv, d)[:n].float()
        first = max(0, n - sliding_window) if sliding_window else 0
        k, v = k[first:], v[first:]
        q = query[b].float().view(hkv, -1, d)  # [Hkv, G, D]
        s = torch.einsum("hgd,thd->hgt", q, k) * scale
        if soft_cap:
            s = soft_cap * torch.tanh(s / soft_cap)
        p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("hgt,thd->hgd", p, v).reshape(-1, d).to(query.dtype)
    return out

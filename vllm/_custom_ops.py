"""Python wrappers over the compiled ops (upstream: vllm/_custom_ops.py).

The CPU ops live in `vllm._C` (built from csrc/cpu by CMake through setup.py)
and register as `torch.ops._C_cpu.<name>`; on x86 the same ops are also built
per ISA (`vllm._C_avx2`, `vllm._C_avx512`, `vllm._C_avx512_bf16`) and this
module imports the one the running CPU supports, or VLLM_CPU_ISA's
(`cpu_ops_isa()` says which; `choose_cpu_ops_isa` in
vllm/platforms/cpu_capability.py decides). The CUDA ops live in
`vllm._C_cuda` (csrc/*.cu, built only with nvcc and a CUDA torch) and
register under upstream's namespaces, `torch.ops._C.<name>` and
`torch.ops._C_cache_ops.<name>`. Importing this module loads the libraries
that were built; a wrapper runs the compiled op for the tensors' device when
it is loaded and takes them, else a pure-PyTorch implementation with the
same semantics, so the package runs without a compiler.
`cpu_ops_available()` / `cuda_ops_available()` say which paths are live.

Signatures follow upstream's (`out` first, in-place ops return None).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import torch
import torch.nn.functional as F

from vllm import envs
from vllm.logger import init_logger
from vllm.platforms.cpu_capability import CPU_OPS_ISA_FLAGS, choose_cpu_ops_isa

logger = init_logger(__name__)


# Every op the wrappers below call; a build missing one is not used at all.
_REQUIRED_OPS = (
    "paged_attention_decode",
    "reshape_and_cache",
    "rms_norm",
    "fused_add_rms_norm",
    "fused_add_rms_norm_out",
    "rotary_embedding",
    "rotary_embedding_out",
    "silu_and_mul",
    "apply_token_bitmask",
    "cpu_ops_isa",
)


def _load_library(
    module: str,
    disable_var: str,
    required: dict[str, tuple[str, ...]],
    kind: str,
    unsupported: str | None = None,
) -> str | None:
    """Import `module` (a compiled op library); returns why its ops are not
    used, or None when they are: `disable_var`=1 keeps the torch paths (A/B
    timing), `unsupported` says this torch cannot load it, and a library
    built from older sources (a `torch.ops.<namespace>.<op>` of `required`
    missing) is not used at all."""
    if os.environ.get(disable_var) == "1":
        error: str | None = f"disabled by {disable_var}=1"
    elif unsupported is not None:
        error = unsupported
    else:
        error = _import_library(module, required)
    if error is not None:
        logger.debug("Compiled %s ops unavailable (%s); using PyTorch fallbacks.", kind, error)
    return error


def _import_library(module: str, required: dict[str, tuple[str, ...]]) -> str | None:
    try:
        importlib.import_module(module)
    except (ImportError, OSError) as e:
        return str(e)
    missing = [
        f"{ns}.{op}"
        for ns, names in required.items()
        for op in names
        if not hasattr(getattr(torch.ops, ns), op)
    ]
    if missing:  # rebuild it with `pip install -e .`
        return f"{module} is stale (no {', '.join(missing)}); rebuild it"
    return None


def cpu_ops_module(isa: str) -> str:
    """The module of the CPU ops built for ISA variant `isa` (CMakeLists.txt)."""
    return "vllm._C" if isa == "scalar" else f"vllm._C_{isa}"


def _choose_cpu_isa() -> str:
    """The ISA variant to import: one a module already imported (the ops of
    two variants cannot register in one process), else VLLM_CPU_ISA's
    choice among the built modules (ValueError when it is refused)."""
    loaded = [isa for isa in CPU_OPS_ISA_FLAGS if cpu_ops_module(isa) in sys.modules]
    if loaded:
        return loaded[0]
    built = [isa for isa in CPU_OPS_ISA_FLAGS if importlib.util.find_spec(cpu_ops_module(isa))]
    return choose_cpu_ops_isa(envs.VLLM_CPU_ISA, built) or "scalar"


def _load_cpu_library() -> tuple[str | None, str | None]:
    """(the ISA variant loaded, None), or (None, why the CPU ops are not used)."""
    disabled = os.environ.get("VLLM_CPU_DISABLE_CUSTOM_OPS") == "1"
    isa = "scalar" if disabled else _choose_cpu_isa()
    module = cpu_ops_module(isa)
    error = _load_library(module, "VLLM_CPU_DISABLE_CUSTOM_OPS", {"_C_cpu": _REQUIRED_OPS}, "CPU")
    if error is None and (got := torch.ops._C_cpu.cpu_ops_isa()) != isa:
        error = f"{module} is stale (its ops are the {got} build); rebuild it"
        logger.warning("Compiled CPU ops unavailable (%s); using PyTorch fallbacks.", error)
    if error is not None:
        return None, error
    logger.debug("Compiled CPU ops: the %s build (%s).", isa, module)
    return isa, None


_CPU_ISA, _LOAD_ERROR = _load_cpu_library()


def cpu_ops_available() -> bool:
    """True when the compiled `_C_cpu` ops are loaded."""
    return _LOAD_ERROR is None


def cpu_ops_isa() -> str | None:
    """The ISA variant of the loaded CPU ops (avx512_bf16, avx512, avx2,
    scalar), None when they are not loaded."""
    return _CPU_ISA


def cpu_ops_load_error() -> str | None:
    """Why the compiled ops are not loaded (None when they are)."""
    return _LOAD_ERROR


def _use_compiled(t: torch.Tensor) -> bool:
    return (
        _LOAD_ERROR is None
        and t.device.type == "cpu"
        and t.dtype in (torch.float32, torch.bfloat16, torch.float16)
    )


# ---------------------------------------------------------------- CUDA ops
_REQUIRED_CUDA_OPS = {
    "_C": (
        "rms_norm",
        "fused_add_rms_norm",
        "rotary_embedding",
        "silu_and_mul",
        "paged_attention_v1",
        "paged_attention_decode",
    ),
    "_C_cache_ops": ("reshape_and_cache", "reshape_and_cache_flash"),
}


_CUDA_LOAD_ERROR = _load_library(
    "vllm._C_cuda",
    "VLLM_CUDA_DISABLE_CUSTOM_OPS",
    _REQUIRED_CUDA_OPS,
    "CUDA",
    unsupported="torch is not a CUDA build" if torch.version.cuda is None else None,
)


def cuda_ops_available() -> bool:
    """True when the compiled CUDA ops (`torch.ops._C`, `_C_cache_ops`) are loaded."""
    return _CUDA_LOAD_ERROR is None


def cuda_ops_load_error() -> str | None:
    """Why the compiled CUDA ops are not loaded (None when they are)."""
    return _CUDA_LOAD_ERROR


def _use_cuda(t: torch.Tensor) -> bool:
    return (
        _CUDA_LOAD_ERROR is None
        and t.is_cuda
        and t.dtype in (torch.float32, torch.float16, torch.bfloat16)
    )


def has_compiled_ops(t: torch.Tensor) -> bool:
    """Whether the compiled library for `t`'s device is loaded (the layers
    then call the wrappers below, which still fall back per call)."""
    if t.device.type == "cpu":
        return _LOAD_ERROR is None
    return t.is_cuda and _CUDA_LOAD_ERROR is None


def _rows_ok(*ts: torch.Tensor) -> bool:
    """The row view the CUDA row kernels take: a contiguous last dim, and
    either 2-D (rows may be padded) or contiguous."""
    return all(
        t.dim() >= 1 and t.stride(-1) == 1 and (t.dim() == 2 or t.is_contiguous()) for t in ts
    )


_UNIT_SCALES: dict[torch.device, torch.Tensor] = {}


def _unit_scale(device: torch.device) -> torch.Tensor:
    """k_scale / v_scale for unquantized caches (read only by fp8 caches)."""
    if device not in _UNIT_SCALES:
        _UNIT_SCALES[device] = torch.ones((), dtype=torch.float32, device=device)
    return _UNIT_SCALES[device]


# ---------------------------------------------------------------- layernorm
def rms_norm(out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, epsilon: float) -> None:
    """out = input / sqrt(mean(input^2) + eps) * weight, rows of [T, hidden]."""
    if _use_compiled(input) and input.dim() == 2:
        torch.ops._C_cpu.rms_norm(out, input, weight, epsilon)
        return
    if _use_cuda(input) and weight.dtype == input.dtype and _rows_ok(input, out):
        torch.ops._C.rms_norm(out, input, weight, epsilon)
        return
    out.copy_(F.rms_norm(input, (input.shape[-1],), weight, epsilon))


def fused_add_rms_norm(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> None:
    """In place: residual <- input + residual; input <- rms_norm(residual)."""
    if _use_compiled(input) and input.dim() == 2:
        torch.ops._C_cpu.fused_add_rms_norm(input, residual, weight, epsilon)
        return
    if _use_cuda(input) and weight.dtype == input.dtype and _rows_ok(input, residual):
        torch.ops._C.fused_add_rms_norm(input, residual, weight, epsilon)
        return
    residual.add_(input)
    input.copy_(F.rms_norm(residual, (residual.shape[-1],), weight, epsilon))


def fused_add_rms_norm_out(
    out: torch.Tensor,
    residual_out: torch.Tensor,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    epsilon: float,
) -> None:
    """Out of place (inputs untouched): residual_out <- input + residual;
    out <- rms_norm(residual_out). One pass over the rows."""
    if _use_compiled(input) and input.dim() == 2:
        torch.ops._C_cpu.fused_add_rms_norm_out(out, residual_out, input, residual, weight, epsilon)
        return
    torch.add(input, residual, out=residual_out)
    rms_norm(out, residual_out, weight, epsilon)


# --------------------------------------------------------------- activation
def silu_and_mul(out: torch.Tensor, x: torch.Tensor) -> None:
    """out [..., d] = silu(x[..., :d]) * x[..., d:]."""
    if _use_compiled(x):
        torch.ops._C_cpu.silu_and_mul(out, x)
        return
    if _use_cuda(x) and out.dtype == x.dtype and _rows_ok(x, out):
        torch.ops._C.silu_and_mul(out, x)
        return
    d = x.shape[-1] // 2
    torch.mul(F.silu(x[..., :d]), x[..., d:], out=out)


# ------------------------------------------------------- structured outputs
def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor) -> bool:
    """Grammar mask in place on CPU logits [n, V] (fp32/bf16) from an int32
    bitmask [n, W] (xgrammar's layout), rows `indices` (int64) only: clear
    bits and ids >= 32 * W become -inf. False when the compiled op cannot
    take these tensors (the caller falls back to xgrammar's kernel)."""
    if not (
        _use_compiled(logits)
        and logits.dim() == 2
        and logits.stride(1) == 1
        and bitmask.device.type == "cpu"
        and bitmask.dtype == torch.int32
        and bitmask.shape[0] == logits.shape[0]
        and bitmask.stride(1) == 1
    ):
        return False
    torch.ops._C_cpu.apply_token_bitmask(logits, bitmask, indices)
    return True


# ------------------------------------------------------------ pos encoding
def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor | None,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotate query [T, H * D] and key [T, Hkv * D] in place by position;
    cos_sin_cache [max_pos, rot_dim] holds cos then sin."""
    if _use_compiled(query) and query.dim() == 2 and cos_sin_cache.dtype == query.dtype:
        torch.ops._C_cpu.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
        return
    if (
        _use_cuda(query)
        and positions.dim() == 1
        and query.dim() in (2, 3)
        and query.stride(-1) == 1
        and (key is None or key.stride(-1) == 1)
        and cos_sin_cache.dtype == query.dtype
        and cos_sin_cache.is_contiguous()
    ):
        torch.ops._C.rotary_embedding(
            positions.to(torch.int64).contiguous(), query, key, head_size, cos_sin_cache, is_neox
        )
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


def rotary_embedding_out(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    query_out: torch.Tensor,
    key_out: torch.Tensor,
) -> None:
    """Out-of-place rotary: rotated copies of query/key into query_out/key_out
    (one pass; the inputs are untouched)."""
    if (
        _use_compiled(query)
        and query.dim() == 2
        and key.dim() == 2
        and cos_sin_cache.dtype == query.dtype
    ):
        torch.ops._C_cpu.rotary_embedding_out(
            positions, query, key, head_size, cos_sin_cache, is_neox, query_out, key_out
        )
        return
    query_out.copy_(query)
    key_out.copy_(key)
    rotary_embedding(positions, query_out, key_out, head_size, cos_sin_cache, is_neox)


# ------------------------------------------------------------------- cache
def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, Hkv, D] into caches [NB, BS, Hkv, D] at
    `slot_mapping` (slot = block * BS + offset; negative = skip)."""
    if _use_compiled(key) and key_cache.is_contiguous():
        torch.ops._C_cpu.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return
    if (
        _use_cuda(key)
        and key.dim() == 3
        and value.shape == key.shape
        and key.stride(-1) == 1
        and value.stride(-1) == 1
        and key_cache.stride(-1) == 1
        and slot_mapping.dim() == 1
        and slot_mapping.is_contiguous()
    ):
        scale = _unit_scale(key.device)
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            key, value, key_cache, value_cache, slot_mapping, "auto", scale, scale
        )
        return
    n = slot_mapping.numel()
    keep = (slot_mapping >= 0).nonzero().squeeze(1)
    slots = slot_mapping.index_select(0, keep).to(torch.int64)
    for src, cache in ((key[:n], key_cache), (value[:n], value_cache)):
        cache.view(-1, *cache.shape[2:]).index_copy_(0, slots, src.index_select(0, keep))


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
) -> None:
    """Upstream's op: key/value [T, Hkv, D] into caches [NB, BS, Hkv, D] at
    `slot_mapping` (negative = skip). Only kv_cache_dtype "auto" (the cache
    keeps the model dtype) is built; the scales serve fp8 caches only."""
    if kv_cache_dtype != "auto":
        raise NotImplementedError(
            f"kv_cache_dtype {kv_cache_dtype!r} is not built (quantized KV caches); use 'auto'."
        )
    if _use_cuda(key):
        torch.ops._C_cache_ops.reshape_and_cache_flash(
            key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale
        )
        return
    reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def split_kv_cache_to_flash(
    key_cache: torch.Tensor, value_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream's paged-attention layout (what torch.ops._C_cache_ops.
    reshape_and_cache writes: key [NB, Hkv, D / x, BS, x], value [NB, Hkv, D,
    BS]) as flash-layout copies [NB, BS, Hkv, D]."""
    nb, hkv, _, bs, _ = key_cache.shape
    d = value_cache.shape[2]
    return (
        key_cache.permute(0, 3, 1, 2, 4).reshape(nb, bs, hkv, d),
        value_cache.permute(0, 3, 1, 2).reshape(nb, bs, hkv, d),
    )


# --------------------------------------------------------------- attention
def _decode_ok(
    out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> bool:
    """What torch.ops._C.paged_attention_decode takes: head_size a multiple
    of 8 up to 256, contiguous rows at 16-byte aligned offsets, one dtype."""
    if query.dim() != 3 or out.dim() != 3 or key_cache.dim() != 4:
        return False
    d = query.shape[-1]
    rows = (query.stride(0), query.stride(1), *key_cache.stride()[:3])
    return (
        d % 8 == 0
        and d <= 256
        and query.stride(2) == 1
        and out.stride(2) == 1
        and key_cache.stride(3) == 1
        and value_cache.stride() == key_cache.stride()
        and all(r % 8 == 0 for r in rows)
        and all(t.data_ptr() % 16 == 0 for t in (query, key_cache, value_cache))
        and key_cache.dtype == value_cache.dtype == query.dtype == out.dtype
    )


def paged_attention_decode(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
) -> None:
    """One query token per sequence against its cached keys, read through the
    block table: query/out [B, H, D], caches [NB, BS, Hkv, D], block_table
    [B, max_blocks] (int32/int64), seq_lens [B] (keys 0..len-1; with a
    window, the last `sliding_window` of them). Soft-cap: cap * tanh(s / cap)."""
    if _use_compiled(query):
        torch.ops._C_cpu.paged_attention_decode(
            out,
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            scale,
            sliding_window or 0,
            soft_cap or 0.0,
        )
        return
    if (
        _use_cuda(query)
        and _decode_ok(out, query, key_cache, value_cache)
        and block_table.stride(-1) == 1
        and block_table.dtype in (torch.int32, torch.int64)
    ):
        torch.ops._C.paged_attention_decode(
            out,
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens.to(torch.int32).contiguous(),
            scale,
            sliding_window or 0,
            soft_cap or 0.0,
        )
        return
    out.copy_(
        ref_paged_attention_decode(
            query, key_cache, value_cache, block_table, seq_lens, scale, sliding_window, soft_cap
        )
    )


def paged_attention_v1(
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    max_seq_len: int,
    alibi_slopes: torch.Tensor | None,
    kv_cache_dtype: str,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    tp_rank: int = 0,
    blocksparse_local_blocks: int = 0,
    blocksparse_vert_stride: int = 0,
    blocksparse_block_size: int = 64,
    blocksparse_head_sliding_step: int = 0,
) -> None:
    """Upstream's decode attention over upstream's split cache layout (see
    split_kv_cache_to_flash); query/out [B, H, D], block_tables int32.
    Not built: quantized caches, block-sparse attention."""
    if kv_cache_dtype != "auto":
        raise NotImplementedError(f"kv_cache_dtype {kv_cache_dtype!r} is not built.")
    if blocksparse_vert_stride > 1:
        raise NotImplementedError("block-sparse paged attention is not built.")
    if _use_cuda(query):
        torch.ops._C.paged_attention_v1(
            out,
            query,
            key_cache,
            value_cache,
            num_kv_heads,
            scale,
            block_tables,
            seq_lens,
            block_size,
            max_seq_len,
            alibi_slopes,
            kv_cache_dtype,
            k_scale,
            v_scale,
            tp_rank,
            blocksparse_local_blocks,
            blocksparse_vert_stride,
            blocksparse_block_size,
            blocksparse_head_sliding_step,
        )
        return
    k, v = split_kv_cache_to_flash(key_cache, value_cache)
    out.copy_(
        ref_paged_attention_decode(
            query, k, v, block_tables, seq_lens, scale, alibi_slopes=alibi_slopes
        )
    )


def ref_paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    alibi_slopes: torch.Tensor | None = None,
) -> torch.Tensor:
    """The plain reference: per sequence, gather its keys and attend in fp32.
    ALiBi (upstream's): score of key t += slope[head] * (t - seq_len + 1)."""
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
        if alibi_slopes is not None:
            dist = torch.arange(first, n, device=s.device, dtype=torch.float32) - (n - 1)
            s = s + alibi_slopes.float().view(hkv, -1, 1) * dist
        p = torch.softmax(s, dim=-1)
        out[b] = torch.einsum("hgt,thd->hgd", p, v).reshape(-1, d).to(query.dtype)
    return out


# ------------------------------------------------ weight-only quantized GEMM
# Weights stay low-bit in memory: W[n, k] = scales[n, k // g] * decode(w[n, k])
# (+ offsets[n, k // g]), decode = int8 value or float8_e4m3fn value. The
# compiled ops (csrc/cpu/quant_gemm.cpp) are looked up per call, so a library
# built before they existed still serves every other op.
_QUANT_GEMM_BLOCK_ROWS = 256  # rows of W dequantized at a time by the torch path


def has_cpu_op(name: str) -> bool:
    """Whether the loaded CPU ops include `torch.ops._C_cpu.<name>` (an op
    newer than the build, e.g., is absent until it is rebuilt)."""
    return _LOAD_ERROR is None and hasattr(torch.ops._C_cpu, name)


_has_cpu_op = has_cpu_op


# ------------------------------------------------------ panel GEMM (CPU)
# csrc/cpu/gemm_panel.cpp: W [N, K] (float32, bfloat16 or float16) packed once
# as panels of 16 output columns, P[j, k, c] = W[16 j + c, k] ([N / 16, K, 16]).
PANEL_WIDTH = 16
PANEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def panel_gemm_available() -> bool:
    """Whether the loaded CPU ops have the panel GEMM."""
    return has_cpu_op("panel_gemm")


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] (a PANEL_DTYPES dtype, N % 16 == 0) -> its panels [N / 16, K, 16]."""
    n, k = weight.shape
    if weight.dtype not in PANEL_DTYPES or n % PANEL_WIDTH:
        raise ValueError(
            "pack_panels: a float32 / bfloat16 / float16 [N, K] weight with N % 16 == 0, "
            f"got {weight.dtype} [{n}, {k}]"
        )
    return weight.detach().reshape(n // PANEL_WIDTH, PANEL_WIDTH, k).transpose(1, 2).contiguous()


def unpack_panels(packed: torch.Tensor) -> torch.Tensor:
    """The dense [N, K] weight of `pack_panels`' panels (exact)."""
    panels, k, width = packed.shape
    return packed.transpose(1, 2).reshape(panels * width, k)


def panel_gemm(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., K] @ W.T (+ bias) -> [..., N] in x's dtype (packed's), fp32
    accumulation, W given as its panels."""
    return torch.ops._C_cpu.panel_gemm(x, packed, bias)


def _check_quant_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    offsets: torch.Tensor | None,
    w_dtype: torch.dtype,
) -> None:
    """ValueError naming the shapes / dtypes when the operands do not fit."""
    if w.dim() != 2 or w.dtype != w_dtype:
        raise ValueError(f"weight must be a 2-D {w_dtype} tensor, got {w.dtype} {tuple(w.shape)}")
    n, k = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"x {tuple(x.shape)} does not match weight {tuple(w.shape)} (K = {k})")
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    if group_size <= 0 or k % group_size != 0:
        raise ValueError(
            f"group_size {group_size} does not divide K = {k} (weight {tuple(w.shape)})"
        )
    want = (n, k // group_size)
    for name, t in (("scales", scales), ("offsets", offsets)):
        if t is not None and (tuple(t.shape) != want or t.dtype != torch.float32):
            raise ValueError(
                f"{name} must be float32 {want} for weight {tuple(w.shape)} and "
                f"group_size {group_size}, got {t.dtype} {tuple(t.shape)}"
            )
    if any(t is not None and t.device != x.device for t in (w, scales, offsets)):
        raise ValueError("x, weight, scales and offsets must be on one device")


def _decode_rows(w: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Weight bytes -> (fp32 values / unit, unit). e4m3 as the compiled op
    decodes it (~4x torch's own e4m3 conversion): byte s eeee mmm << 7 is
    the fp16 pattern of value * 2^-8 with the sign at bit 14; adding bit 14
    to itself moves it to bit 15 (int16 wraps), subnormals included. The
    NaN bytes 0x7f / 0xff decode as +-480 (no checkpoint holds NaN)."""
    if w.dtype != torch.float8_e4m3fn:
        return w.float(), 1.0
    h = w.view(torch.uint8).to(torch.int16) << 7
    h = h + (h & 0x4000)
    return h.view(torch.float16).float(), 256.0


def _quant_gemm_torch(
    x: torch.Tensor,
    w: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    offsets: torch.Tensor | None,
) -> torch.Tensor:
    """Dequantize _QUANT_GEMM_BLOCK_ROWS rows of W at a time to fp32 and
    multiply in fp32 (the dense weight is never held whole)."""
    x2 = x.reshape(-1, x.shape[-1]).float()
    n = w.shape[0]
    out = torch.empty(x2.shape[0], n, dtype=torch.float32, device=x.device)
    for n0 in range(0, n, _QUANT_GEMM_BLOCK_ROWS):
        n1 = min(n, n0 + _QUANT_GEMM_BLOCK_ROWS)
        blk, unit = _decode_rows(w[n0:n1])
        blk = blk.unflatten(1, (-1, group_size)) * (scales[n0:n1] * unit).unsqueeze(-1)
        if offsets is not None:
            blk = blk + offsets[n0:n1].unsqueeze(-1)
        torch.mm(x2, blk.flatten(1).t(), out=out[:, n0:n1])
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


def _quant_gemm(
    op: str,
    x: torch.Tensor,
    w: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    offsets: torch.Tensor | None,
) -> torch.Tensor:
    if x.device.type == "cpu" and _has_cpu_op(op):
        x2 = x.reshape(-1, x.shape[-1])
        args = (x2, w.contiguous(), scales.contiguous(), group_size)
        if op == "int8_group_gemm":
            out = torch.ops._C_cpu.int8_group_gemm(
                *args, None if offsets is None else offsets.contiguous()
            )
        else:
            out = torch.ops._C_cpu.fp8_weight_gemm(*args)
        return out.reshape(*x.shape[:-1], w.shape[0])
    return _quant_gemm_torch(x, w, scales, group_size, offsets)


def int8_group_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    scales: torch.Tensor,
    group_size: int,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] (fp32 / bf16 / fp16) @ W.T -> [..., N] in x.dtype, fp32
    accumulation. w int8 [N, K], scales float32 [N, K // group_size], offsets
    float32 [N, K // group_size] or None: W[n, k] = scales[n, k // g] * w[n, k]
    (+ offsets[n, k // g]). group_size == K is per-channel; K % group_size
    must be 0 (ValueError naming the shapes otherwise).

    Compiled op: W is dequantized exactly in fp32, except for more than 8
    rows of bf16 / fp16 x (prefill), where blocks of W are rounded to
    x.dtype and multiplied by torch's GEMM in that dtype (as upstream
    multiplies dequantized weights for large batches; ~5x the fp32 rate on
    AVX512-BF16). The torch path dequantizes to fp32 for every M."""
    _check_quant_gemm(x, w, scales, group_size, offsets, torch.int8)
    return _quant_gemm("int8_group_gemm", x, w, scales, group_size, offsets)


def fp8_weight_gemm(
    x: torch.Tensor, w: torch.Tensor, scales: torch.Tensor, group_size: int
) -> torch.Tensor:
    """As int8_group_gemm with w torch.float8_e4m3fn [N, K]:
    W[n, k] = scales[n, k // g] * float(w[n, k])."""
    _check_quant_gemm(x, w, scales, group_size, None, torch.float8_e4m3fn)
    return _quant_gemm("fp8_weight_gemm", x, w, scales, group_size, None)

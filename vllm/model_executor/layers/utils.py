"""GEMM dispatch shared by the linear layers and the LM head
(upstream: vllm/model_executor/layers/utils.py, `dispatch_cpu_unquantized_gemm`).

On CPU, a weight repacked once into oneDNN's blocked layout multiplies faster
than the dense [out, in] tensor that `F.linear` would re-block on every call
(measured 1.1-2.3x on small-batch decode shapes, with identical bf16 results).
The packed tensor is opaque: it replaces the dense weight after loading, except
where the dense copy is kept for one-row products (`keep_dense_for_gemv`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm.logger import init_logger

logger = init_logger(__name__)

# oneDNN picks its blocking for a typical batch; any batch size still works.
_PACK_BATCH_HINT = 64

# A one-row product (decode at batch 1) is a GEMV that streams the weight once:
# F.linear on the dense [out, in] weight (MKL's GEMV) ran it ~1.5x faster than
# oneDNN's packed kernel (AVX2 EPYC, fp32, 1 thread, the 49 linears of a 120M
# Qwen2 with weights out of cache: 116 vs 176 ms per pass, load ~7), while the
# packed kernel already wins from 4 rows on (241 vs 401 ms). So a packed layer
# keeps its dense weight too, until the copies kept in this process reach this
# many bytes (layers loaded first get them; the rest use the packed kernel for
# every batch): the price of the fast GEMV is that much more memory.
_DENSE_GEMV_BUDGET_BYTES = 1 << 30
_dense_gemv_bytes = 0


def _cpu_dtype_supported(dtype: torch.dtype) -> bool:
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


def pack_weight_for_cpu(weight: torch.Tensor) -> torch.Tensor | None:
    """The oneDNN-packed form of a [out, in] CPU weight, or None where packing
    does not apply (other device, no oneDNN, dtype without CPU support)."""
    if (
        weight.device.type != "cpu"
        or weight.dim() != 2
        or weight.numel() == 0
        or not torch.backends.mkldnn.is_available()
        or not _cpu_dtype_supported(weight.dtype)
    ):
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_BATCH_HINT)
    except RuntimeError as e:  # an oneDNN build without this path: stay dense
        logger.warning_once("oneDNN weight packing unavailable (%s); using dense GEMM.", e)
        return None


def keep_dense_for_gemv(weight: torch.Tensor) -> bool:
    """Whether a layer whose weight was just packed keeps `weight` dense as
    well, for one-row products (charged to this process's budget)."""
    global _dense_gemv_bytes
    size = weight.numel() * weight.element_size()
    # Measured for float32 only (bf16 / fp16 GEMVs take other torch paths).
    if weight.dtype != torch.float32 or _dense_gemv_bytes + size > _DENSE_GEMV_BUDGET_BYTES:
        return False
    _dense_gemv_bytes += size
    return True


def packed_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [..., in] @ packed [out, in]^T (+ bias) -> [..., out]."""
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")


def unquantized_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    packed_weight: torch.Tensor | None,
) -> torch.Tensor:
    """The packed path when a packed weight exists, else `F.linear`; one row
    with a dense weight kept as well: `F.linear` (a GEMV, see above). Traced
    by torch.compile, always the packed path: a branch on the row count would
    specialize the graph on it (a recompile for batch 1)."""
    if packed_weight is not None and (
        weight.numel() == 0 or torch.compiler.is_compiling() or x.numel() != x.shape[-1]
    ):
        return packed_linear(x, packed_weight, bias)
    return F.linear(x, weight, bias)

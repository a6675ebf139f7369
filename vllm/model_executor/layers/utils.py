"""GEMM dispatch shared by the linear layers and the LM head
(upstream: vllm/model_executor/layers/utils.py, `dispatch_cpu_unquantized_gemm`).

On CPU a weight is repacked once, after loading, into the layout of the GEMM
that multiplies it, and the packed tensor replaces the dense [out, in] one:
- where the ops run their AVX2 build (CPUs without AVX-512: AMD EPYC Zen 2/3
  among them), float32 / bfloat16 / float16 weights become panels of 16
  output columns for the panel GEMM of csrc/cpu/gemm_panel.cpp (a strided
  [out / 16, in, 16] tensor). Measured on a 2-core EPYC (Zen 3) over a 120M
  model's float32 projections: 0.67-0.80x oneDNN's time for 1-16 rows
  (decode), 0.84-0.93x for 64-2048 (prefill); oneDNN has no fast 16-bit
  path on such CPUs at all.
- otherwise oneDNN's blocked layout (an opaque mkldnn tensor), which
  multiplies faster than the dense tensor `F.linear` would re-block on every
  call (1.1-2.3x on small-batch decode shapes, identical bf16 results).
`VLLM_CPU_GEMM` (auto / panel / onednn) overrides the choice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm import _custom_ops as ops
from vllm import envs
from vllm.logger import init_logger

logger = init_logger(__name__)

# oneDNN picks its blocking for a typical batch; any batch size still works.
_PACK_BATCH_HINT = 64


def _cpu_dtype_supported(dtype: torch.dtype) -> bool:
    if dtype == torch.float32:
        return True
    if dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if dtype == torch.float16:
        return torch.ops.mkldnn._is_mkldnn_fp16_supported()
    return False


def _use_panels(weight: torch.Tensor) -> bool:
    """Whether a CPU weight goes to the panel GEMM (module docstring)."""
    choice = envs.VLLM_CPU_GEMM
    if weight.dtype not in ops.PANEL_DTYPES or choice == "onednn":
        return False
    if not ops.panel_gemm_available():
        if choice == "panel":
            raise ValueError(
                "VLLM_CPU_GEMM=panel: the compiled CPU ops with panel_gemm are not loaded "
                f"({ops.cpu_ops_load_error() or 'a build older than it'})."
            )
        return False
    if weight.shape[0] % ops.PANEL_WIDTH:
        return False  # whole panels only; such a layer (rare) stays on oneDNN
    return choice == "panel" or ops.cpu_ops_isa() == "avx2"


def pack_weight_for_cpu(weight: torch.Tensor) -> torch.Tensor | None:
    """The packed form of a [out, in] CPU weight (module docstring), or None
    where packing does not apply (other device, no oneDNN, dtype without CPU
    support)."""
    if weight.device.type != "cpu" or weight.dim() != 2 or weight.numel() == 0:
        return None
    if _use_panels(weight):
        return ops.pack_panels(weight)
    if not torch.backends.mkldnn.is_available() or not _cpu_dtype_supported(weight.dtype):
        return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), _PACK_BATCH_HINT)
    except RuntimeError as e:  # an oneDNN build without this path: stay dense
        logger.warning_once("oneDNN weight packing unavailable (%s); using dense GEMM.", e)
        return None


def is_onednn_packed(packed_weight: torch.Tensor | None) -> bool:
    """Whether `pack_weight_for_cpu` gave oneDNN's opaque layout (not panels)."""
    return packed_weight is not None and packed_weight.layout != torch.strided


def unpack_weight_for_cpu(packed_weight: torch.Tensor) -> torch.Tensor:
    """The dense [out, in] weight of either packed form (exact)."""
    if is_onednn_packed(packed_weight):
        return packed_weight.to_dense()
    return ops.unpack_panels(packed_weight)


def packed_linear(
    x: torch.Tensor, packed_weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [..., in] @ packed [out, in]^T (+ bias) -> [..., out]."""
    if packed_weight.layout == torch.strided:
        return ops.panel_gemm(x, packed_weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed_weight, bias, "none", [], "")


def unquantized_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    packed_weight: torch.Tensor | None,
) -> torch.Tensor:
    """The packed path when a packed weight exists, else `F.linear`."""
    if packed_weight is not None:
        return packed_linear(x, packed_weight, bias)
    return F.linear(x, weight, bias)

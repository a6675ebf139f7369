"""What the compiler sees of a model, and which compiler backend runs it
(upstream: vllm/compilation/backends.py, `VllmBackend`).

Attention stays opaque to the compiler, as upstream keeps it: the layers in
`compilation_config.static_forward_context` read per-step metadata from the
forward context and write the KV cache in place, which dynamo must not trace
(it would guard on, and specialise to, every step's metadata). Upstream
routes `Attention` through the custom op `torch.ops.vllm.unified_attention*`
and splits the Inductor graph there. Here:
- `Attention` layers call `torch.ops.vllm.unified_attention_with_output`, a
  custom op whose kernel is the layer's own eager forward (looked up by name
  in the forward context), writing into an output buffer the graph allocated
  before it; its fake kernel does nothing. One graph for the whole model,
  attention an opaque node in it, unless `splitting_ops` split the graph
  there (piecewise_backend.py: what piecewise CUDA graphs need);
- any other stateful layer (Mamba, MLA) runs under `torch.compiler.disable`,
  i.e. a graph break around it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vllm.config.compilation import CompilationMode
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config.compilation import CompilationConfig

logger = init_logger(__name__)

_OPAQUE_ATTR = "_vllm_compile_opaque"


@torch.library.custom_op("vllm::unified_attention", mutates_args=())
def unified_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_name: str
) -> torch.Tensor:
    """The named `Attention` layer's eager forward: query [T, H * D], key/value
    [T, Hkv * D] -> [T, H * D]. Writes the layer's KV cache as a side effect."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.attention import Attention

    layer = get_forward_context().no_compile_layers[layer_name]
    return Attention.forward(layer, query, key, value)


@unified_attention.register_fake
def _unified_attention_fake(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layer_name: str
) -> torch.Tensor:
    return torch.empty_like(query)


@torch.library.custom_op("vllm::unified_attention_with_output", mutates_args=("output",))
def unified_attention_with_output(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
) -> None:
    """`unified_attention` writing into `output` [T, H * D]. What the compiled
    model calls: `output` is allocated by the graph before the op, so under
    piecewise CUDA graphs it lives in the preceding piece's graph memory and
    the next piece reads it at a fixed address (piecewise_backend.py)."""
    from vllm.forward_context import get_forward_context

    layer = get_forward_context().no_compile_layers[layer_name]
    layer.forward_into(query, key, value, output)


@unified_attention_with_output.register_fake
def _unified_attention_with_output_fake(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    layer_name: str,
) -> None:
    return None


def _opaque_attention_forward(layer_name: str):
    def forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        output = torch.empty(query.shape, dtype=query.dtype, device=query.device)
        torch.ops.vllm.unified_attention_with_output(query, key, value, output, layer_name)
        return output

    return forward


def graph_break_layers(static_forward_context: dict[str, Any]) -> list[str]:
    """The registered layers that are not plain `Attention` (Mamba, MLA, ...):
    `make_stateful_layers_opaque` runs them under `torch.compiler.disable`,
    so each is a graph break, not a splitting op."""
    from vllm.model_executor.layers.attention import Attention

    return [
        name
        for name, layer in static_forward_context.items()
        if isinstance(layer, nn.Module) and type(layer) is not Attention
    ]


def make_stateful_layers_opaque(static_forward_context: dict[str, Any]) -> int:
    """Route every registered layer around the compiler (idempotent, per
    instance; eager calls still work). Returns how many layers were changed."""
    from vllm.model_executor.layers.attention import Attention

    changed = 0
    for name, layer in static_forward_context.items():
        if not isinstance(layer, nn.Module) or getattr(layer, _OPAQUE_ATTR, False):
            continue
        layer.forward = (
            _opaque_attention_forward(name)
            if type(layer) is Attention
            else torch.compiler.disable(layer.forward, recursive=True)
        )
        setattr(layer, _OPAQUE_ATTR, True)
        changed += 1
    return changed


def unpack_cpu_linear_weights(model: nn.Module) -> int:
    """Give the linears back their dense weights for Inductor on CPU.

    The CPU linears keep a packed weight (`_packed_weight`, layers/utils.py:
    oneDNN's layout or float32 panels) and drop the dense one. Inductor
    cannot lower `mkldnn._linear_pointwise` over such a pre-packed tensor
    (its lowering wants the weight as a frozen graph constant it packed
    itself), so the dense weight is restored (exactly) and Inductor's freezing
    pass packs it again, fused with its neighbours. The LM head is left
    packed: `compute_logits` is not part of the compiled forward. Returns how
    many linears were changed."""
    from vllm.model_executor.layers.utils import unpack_weight_for_cpu

    changed = 0
    for name, module in model.named_modules():
        if name.split(".")[-1] == "lm_head":
            continue
        packed = getattr(module, "_packed_weight", None)
        if not isinstance(packed, torch.Tensor):
            continue
        module.weight = nn.Parameter(unpack_weight_for_cpu(packed), requires_grad=False)
        module._packed_weight = None
        changed += 1
    return changed


def resolve_backend(compilation_config: CompilationConfig, backend: str | None = None) -> str:
    """The torch.compile backend for the config's mode: Inductor for
    STOCK_TORCH_COMPILE / DYNAMO_TRACE_ONCE / VLLM_COMPILE unless `backend`
    names another ("eager", "aot_eager": tracing without code generation)."""
    mode = compilation_config.mode
    if mode == CompilationMode.NONE:
        raise ValueError("CompilationMode.NONE has no compiler backend.")
    if backend is None:
        backend = compilation_config.backend or None
    if backend is not None:
        if backend not in torch._dynamo.list_backends(exclude_tags=()):
            raise ValueError(
                f"Unknown torch.compile backend {backend!r}; known: "
                f"{', '.join(torch._dynamo.list_backends(exclude_tags=()))}."
            )
        return backend
    return "inductor"

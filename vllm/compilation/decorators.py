"""Compile a model's forward with torch.compile (upstream:
vllm/compilation/decorators.py, `@support_torch_compile`).

Upstream decorates each model class; the runner then gets a module whose
`__call__` goes through the compiled code. Here the same is done per
instance, so model files stay untouched:

    model = maybe_compile_model(model, vllm_config.compilation_config, device)

- `CompilationMode.NONE` returns the model as it is (the CPU default);
- the other modes compile `model.forward` with `resolve_backend`'s backend
  (Inductor), the token dimension of `input_ids` / `positions` /
  `inputs_embeds` dynamic, so one graph serves every batch size (no
  recompile per size; 0 / 1 sizes are not specialised either, through
  `backed_size_oblivious`);
- attention layers stay opaque (see backends.py), and the compiled CPU ops
  get fake kernels (fake_ops.py) so dynamo traces through them;
- with `compilation_config.splitting_ops` (VLLM_COMPILE with piecewise CUDA
  graphs sets them to the attention ops), the graph is split there and each
  piece compiled on its own (piecewise_backend.py).

The model object is returned (its forward replaced), so `compute_logits`,
`load_weights` and the parameters stay where the runner expects them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vllm.compilation.backends import (
    make_stateful_layers_opaque,
    resolve_backend,
    unpack_cpu_linear_weights,
)
from vllm.compilation.fake_ops import register_cpu_fake_ops
from vllm.config.compilation import CompilationMode
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.compilation import CompilationConfig

logger = init_logger(__name__)

# forward arguments whose dim 0 is the (variable) number of tokens.
_TOKEN_DIM_ARGS = ("input_ids", "positions", "inputs_embeds")


class _CompiledForward:
    """The model's new forward: marks the token dim dynamic, then runs the
    compiled code. Keeps the eager forward as `eager_forward`."""

    def __init__(self, eager_forward: Any, compiled: Any, split_backend: Any = None) -> None:
        self.eager_forward = eager_forward
        self.compiled = compiled
        # The VllmBackend when the graph is split (piecewise_backend.py).
        self.split_backend = split_backend
        self.num_calls = 0
        self.first_call_s: float | None = None  # wall time of the call that compiled

    def __call__(
        self, input_ids: torch.Tensor | None, positions: torch.Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        tensors = dict(
            input_ids=input_ids, positions=positions, inputs_embeds=kwargs.get("inputs_embeds")
        )
        for name in _TOKEN_DIM_ARGS:
            t = tensors[name]
            if isinstance(t, torch.Tensor):
                torch._dynamo.mark_dynamic(t, 0)
        start = time.perf_counter()
        # Sizes 0 / 1 are treated like any other size: a batch of one token
        # must not specialise (and later recompile) the graph.
        # patch() is added at run time by torch's config-module machinery (no stub).
        fx_config = torch.fx.experimental._config
        with fx_config.patch(backed_size_oblivious=True):  # type: ignore[attr-defined]
            out = self.compiled(input_ids, positions, *args, **kwargs)
        if self.num_calls == 0:
            self.first_call_s = time.perf_counter() - start
            logger.info(
                "torch.compile: first forward (trace + compile) took %.1f s.", self.first_call_s
            )
        self.num_calls += 1
        return out


def maybe_compile_model(
    model: nn.Module,
    compilation_config: CompilationConfig,
    device: torch.device | str,
    backend: str | None = None,
    vllm_config: VllmConfig | None = None,
) -> nn.Module:
    """`model` with its forward compiled per `compilation_config.mode`
    (NONE: `model` unchanged). `backend` overrides the compiler backend
    ("eager" / "aot_eager" trace without generating code: tests). With
    `splitting_ops` the graph is split there (piecewise_backend.py;
    `vllm_config` goes to the pieces' CUDA graph wrappers)."""
    mode = compilation_config.mode
    if mode == CompilationMode.NONE:
        return model
    if isinstance(model.forward, _CompiledForward):
        return model  # already compiled
    device = torch.device(device)
    if device.type == "cpu":
        register_cpu_fake_ops()
    num_opaque = make_stateful_layers_opaque(compilation_config.static_forward_context)
    compiler = resolve_backend(compilation_config, backend)
    eager_forward = model.forward
    split = bool(compilation_config.splitting_ops) and mode == CompilationMode.VLLM_COMPILE
    options: dict[str, str | int | bool | Callable[..., Any]] | None = None
    if compiler == "inductor" and device.type == "cpu" and not split:
        # Inductor packs the (inference-only, hence frozen) linear weights for
        # oneDNN itself; ours are handed back dense (see the function).
        unpack_cpu_linear_weights(model)
        options = {"freezing": True}
    split_backend = None
    if split:
        from vllm.compilation.piecewise_backend import VllmBackend

        # The graph split at attention, each piece compiled on its own (and
        # captured per size under piecewise CUDA graphs).
        split_backend = VllmBackend(compilation_config, compiler, vllm_config)
        compiled = torch.compile(eager_forward, backend=split_backend, fullgraph=False)
    else:
        compiled = torch.compile(eager_forward, backend=compiler, fullgraph=False, options=options)
    model.forward = _CompiledForward(eager_forward, compiled, split_backend)
    logger.info(
        "Compiling %s with torch.compile (mode %s, backend %s, %d opaque layers).",
        type(model).__name__,
        mode.name,
        compiler,
        num_opaque,
    )
    return model

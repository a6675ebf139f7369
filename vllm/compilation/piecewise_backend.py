"""Piecewise compilation: the model's graph split at attention
(upstream: `split_graph` and `VllmBackend` of vllm/compilation/backends.py,
vllm/compilation/piecewise_backend.py).

A CUDA graph records fixed kernels over fixed addresses, which attention
over a changing batch layout does not fit for every batch (mixed prefill and
decode steps, backends without full-graph support). Splitting the model's FX
graph at the attention ops gives pieces that hold everything else (the
GEMMs, norms, rotary, activations): each piece is compiled on its own and,
under piecewise CUDA graphs, captured per batch size, while attention runs
eagerly between them with the step's real metadata. For a decoder of L
layers the split graph is

    submod_0 -> attn (layer 0) -> submod_2 -> attn (layer 1) -> ... -> submod_2L

Addresses stay fixed across replays because every tensor a piece reads is
either a persistent input buffer, a weight, or memory of an earlier piece's
graph: the attention output buffer is allocated inside the piece before the
op (`unified_attention_with_output`), and the op writes into it in place.

`VllmBackend` is the callable handed to `torch.compile` as its backend:
dynamo gives it the traced graph (the token dimension symbolic) and fake
example inputs; it splits the graph, runs the split graph once over the
fake inputs to learn each piece's example arguments, compiles each piece
with the configured compiler (Inductor by default) and, when the mode has
piecewise graphs, wraps it in a `CUDAGraphWrapper(PIECEWISE)`, which
captures and replays per `BatchDescriptor` from the forward context (and
simply calls the piece under any other runtime mode, e.g. inside a FULL
graph's capture).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.fx as fx
from torch.fx.passes.split_module import split_module

from vllm.compilation.cuda_graph import CUDAGraphOptions, CUDAGraphWrapper
from vllm.config.compilation import CUDAGraphMode
from vllm.logger import init_logger

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.config.compilation import CompilationConfig

logger = init_logger(__name__)


@dataclass
class SplitItem:
    """One submodule of the split graph."""

    submod_name: str
    graph_id: int
    is_splitting_graph: bool  # a splitting op alone (runs eagerly)
    graph: fx.GraphModule


def _op_names(target: Any) -> tuple[str, ...]:
    """The names a call target matches in `splitting_ops`: "ns::op" and, for
    an overload, "ns::op.overload"."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return (target._qualified_op_name,)
    if isinstance(target, torch._ops.OpOverload):
        packet = target.name().split(".")[0]
        return (packet, f"{packet}.{target._overloadname}")
    return ()


def is_splitting_node(node: fx.Node, splitting_ops: Sequence[str]) -> bool:
    return node.op == "call_function" and any(
        name in splitting_ops for name in _op_names(node.target)
    )


def split_graph(
    graph: fx.GraphModule, splitting_ops: Sequence[str]
) -> tuple[fx.GraphModule, list[SplitItem]]:
    """Split `graph` before and after every splitting op, each op alone in
    its submodule; returns the split module (its forward calls the
    submodules in order) and the submodules in graph order."""
    subgraph_id = 0
    node_to_subgraph: dict[fx.Node, int] = {}
    splitting_ids: set[int] = set()
    for node in graph.graph.nodes:
        if node.op in ("output", "placeholder"):
            continue
        if is_splitting_node(node, splitting_ops):
            subgraph_id += 1
            node_to_subgraph[node] = subgraph_id
            splitting_ids.add(subgraph_id)
            subgraph_id += 1
        else:
            node_to_subgraph[node] = subgraph_id
    # (split_module's root module is only read for get_attr targets: the
    # graph's own module holds them.)
    split_gm = split_module(
        graph, graph, lambda node: node_to_subgraph[node], keep_original_order=True
    )
    items = []
    for name, module in split_gm.named_children():
        graph_id = int(name.removeprefix("submod_"))
        assert isinstance(module, fx.GraphModule), name
        items.append(SplitItem(name, graph_id, graph_id in splitting_ids, module))
    items.sort(key=lambda item: item.graph_id)
    return split_gm, items


def check_splitting_ops(splitting_ops: Sequence[str]) -> None:
    """Every name must be a registered op (a misspelt one would split at
    nothing, silently)."""
    import vllm.compilation.backends  # noqa: F401  (registers the vllm:: ops)

    for name in splitting_ops:
        namespace, _, op = name.partition("::")
        packet = getattr(getattr(torch.ops, namespace, None), op.split(".")[0], None)
        if packet is None:
            raise ValueError(f"splitting_ops: no op named {name!r} is registered.")


class _PieceCompiler(torch.fx.Interpreter):
    """Runs the split module over fake inputs; each piece to compile is
    compiled with the arguments it receives and put in place of its
    submodule (upstream: PiecewiseCompileInterpreter)."""

    def __init__(
        self,
        module: fx.GraphModule,
        to_compile: set[str],
        compile_piece: Callable[[str, fx.GraphModule, list[Any]], Callable[..., Any]],
    ) -> None:
        super().__init__(module)
        self.to_compile = to_compile
        self.compile_piece = compile_piece

    def run(self, *args: Any, **kwargs: Any) -> Any:
        # Dynamo's example inputs mix fake activations with the real
        # parameters: all go through the tracing context's fake mode.
        fake_mode = torch._guards.detect_fake_mode(args)
        if fake_mode is None:  # real example inputs only (a direct call in tests)
            return super().run(*args, **kwargs)
        fake_args = [fake_mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        with fake_mode:
            return super().run(*fake_args, **kwargs)

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        output = super().call_module(target, args, kwargs)
        if target in self.to_compile:
            submod = self.fetch_attr(target)
            self.module.__dict__[target] = self.compile_piece(target, submod, list(args))
        return output


def _compile_with_tuple_output(
    compiler: Callable[..., Any], submod: fx.GraphModule, args: list[Any]
) -> Callable[..., Any]:
    """`compiler(submod, args)`; AOT autograd wants a tuple output, so a piece
    returning one value (the last: the hidden states) is compiled returning
    a 1-tuple and called through an unpacking wrapper."""
    output = next(n for n in reversed(submod.graph.nodes) if n.op == "output")
    if isinstance(output.args[0], (tuple, list)):
        return compiler(submod, args)
    output.args = ((output.args[0],),)
    submod.recompile()
    compiled = compiler(submod, args)

    def first(*call_args: Any) -> Any:
        return compiled(*call_args)[0]

    return first


class VllmBackend:
    """The torch.compile backend of VLLM_COMPILE with `splitting_ops`: split,
    compile each piece with `compiler` (a dynamo backend name), wrap it for
    piecewise CUDA graphs when the config's mode has them."""

    def __init__(
        self,
        compilation_config: CompilationConfig,
        compiler: str,
        vllm_config: VllmConfig | None = None,
    ) -> None:
        self.compilation_config = compilation_config
        self.splitting_ops = list(compilation_config.splitting_ops or ())
        check_splitting_ops(self.splitting_ops)
        self.compiler = compiler
        self.vllm_config = vllm_config
        mode = compilation_config.cudagraph_mode or CUDAGraphMode.NONE
        self.piecewise_graphs = mode.has_piecewise_cudagraphs()
        # What the last call made (tests and logs): the split module, its items.
        self.split_gm: fx.GraphModule | None = None
        self.piecewise_graphs_items: list[SplitItem] = []
        self.num_graphs = 0  # dynamo graphs seen (graph breaks make several)
        # Every piece's CUDAGraphWrapper, over all graphs (with piecewise graphs).
        self.piece_wrappers: list[CUDAGraphWrapper] = []
        self.graph_pool: Any = None

    def __call__(self, graph: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        split_gm, items = split_graph(graph, self.splitting_ops)
        pieces = [item for item in items if not item.is_splitting_graph]
        last = pieces[-1].submod_name if pieces else None
        inner = torch._dynamo.lookup_backend(self.compiler)

        def compile_piece(name: str, submod: fx.GraphModule, args: list[Any]) -> Callable[..., Any]:
            compiled = _compile_with_tuple_output(inner, submod, args)
            if not self.piecewise_graphs:
                return compiled
            # The last piece's output is the model's: weakly held, as every
            # piece's (the next capture may reuse the memory once the
            # runner has read it; replays are sequential).
            options = CUDAGraphOptions(debug_log_enable=name == last, weak_ref_output=True)
            wrapper = CUDAGraphWrapper(
                compiled, self.vllm_config, CUDAGraphMode.PIECEWISE, cudagraph_options=options
            )
            # One memory pool for all pieces: graphs are replayed one at a
            # time, so a piece reuses what earlier captures freed.
            if self.graph_pool is None and torch.cuda.is_available():
                self.graph_pool = torch.cuda.graph_pool_handle()
            wrapper.graph_pool = self.graph_pool
            self.piece_wrappers.append(wrapper)
            return wrapper

        _PieceCompiler(split_gm, {p.submod_name for p in pieces}, compile_piece).run(
            *example_inputs
        )
        self.split_gm, self.piecewise_graphs_items = split_gm, items
        self.num_graphs += 1
        logger.info(
            "Split graph %d at %d splitting ops into %d pieces (compiler %s%s).",
            self.num_graphs,
            len(items) - len(pieces),
            len(pieces),
            self.compiler,
            ", piecewise CUDA graphs" if self.piecewise_graphs else "",
        )
        return split_gm

"""Piecewise compilation on CPU (vllm/compilation/piecewise_backend.py): the
graph split at attention, each piece compiled on its own, gives eager's
greedy tokens with one graph for every batch size; under a mode with
piecewise CUDA graphs the pieces are wrapped for capture (the capture itself
needs CUDA: tests/v1/cudagraph/test_cudagraph_gpu.py)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters
from torch.multiprocessing.reductions import StorageWeakRef

from tests.compile.test_compile_cpu import _script, _worker
from vllm.compilation.cuda_graph import CUDAGraphWrapper
from vllm.compilation.piecewise_backend import VllmBackend, is_splitting_node, split_graph
from vllm.config.compilation import (
    ATTENTION_SPLITTING_OPS,
    CompilationConfig,
    CompilationMode,
    CUDAGraphMode,
)
from vllm.utils.torch_utils import weak_ref_tensor, weak_ref_tensors
from vllm.v1.worker.gpu_worker import Worker

ATTN_OP = "vllm::unified_attention_with_output"


def _split_backend(worker: Worker) -> VllmBackend:
    return worker.model_runner.model.forward.split_backend


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")  # 2 layers


@pytest.fixture(scope="module")
def eager_tokens(model_dir):
    worker = _worker(model_dir, CompilationMode.NONE, None)
    try:
        return _script(worker)
    finally:
        worker.shutdown()


@pytest.mark.parametrize("backend", ["eager", "aot_eager", None])  # None: Inductor
def test_split_model_matches_eager_without_recompiles(model_dir, eager_tokens, backend):
    torch._dynamo.reset()
    counters.clear()
    worker = _worker(model_dir, CompilationMode.VLLM_COMPILE, backend, splitting_ops=[ATTN_OP])
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            tokens = _script(worker)
        split = _split_backend(worker)
    finally:
        worker.shutdown()
    assert tokens == eager_tokens
    assert counters["stats"]["unique_graphs"] == 1  # token counts 12, 2, 11, 3, 1
    assert not counters["graph_break"]
    # piece, attention, piece, attention, piece: each attention op alone.
    items = split.piecewise_graphs_items
    assert [i.is_splitting_graph for i in items] == [False, True, False, True, False]
    for item in items:
        calls = [n for n in item.graph.graph.nodes if is_splitting_node(n, [ATTN_OP])]
        assert len(calls) == (1 if item.is_splitting_graph else 0)
    assert not split.piece_wrappers  # no piecewise CUDA graphs asked for


def test_pieces_wrapped_for_piecewise_graphs_pass_through_outside_capture(model_dir, eager_tokens):
    """With a piecewise mode, every piece (not attention) is a
    CUDAGraphWrapper(PIECEWISE) keeping weak outputs, sharing one pool; under
    the NONE runtime mode of these eager steps each simply runs its piece."""
    torch._dynamo.reset()
    worker = _worker(
        model_dir,
        CompilationMode.VLLM_COMPILE,
        "eager",
        splitting_ops=list(ATTENTION_SPLITTING_OPS),
        cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE,
    )
    try:
        tokens = _script(worker)
        split = _split_backend(worker)
    finally:
        worker.shutdown()
    assert tokens == eager_tokens
    wrappers = split.piece_wrappers
    assert len(wrappers) == 3
    assert all(isinstance(w, CUDAGraphWrapper) for w in wrappers)
    assert {w.runtime_mode for w in wrappers} == {CUDAGraphMode.PIECEWISE}
    assert all(w.cudagraph_options.weak_ref_output for w in wrappers)
    assert all(not w.concrete_cudagraph_entries for w in wrappers)  # nothing captured
    assert [getattr(split.split_gm, f"submod_{i}") for i in (0, 2, 4)] == wrappers


def test_split_graph_on_a_plain_function():
    """Two attention-like ops split a graph into five submodules; the split
    module computes what the graph did."""

    def f(x, out1, out2):
        y = x * 2
        torch.ops.vllm.unified_attention_with_output(y, y, y, out1, "missing")
        z = out1 + 1
        torch.ops.vllm.unified_attention_with_output(z, z, z, out2, "missing")
        return out2 - y

    gm = torch.fx.symbolic_trace(f)
    split_gm, items = split_graph(gm, [ATTN_OP])
    assert [i.submod_name for i in items] == [f"submod_{k}" for k in range(5)]
    assert [i.is_splitting_graph for i in items] == [False, True, False, True, False]
    node = next(n for n in items[1].graph.graph.nodes if n.op == "call_function")
    assert is_splitting_node(node, [ATTN_OP])
    assert not is_splitting_node(node, ["vllm::unified_attention"])


def test_splitting_node_matches_an_overload_by_either_name():
    """A call to the OpOverload (what AOT-traced graphs hold) matches both
    "ns::op" and "ns::op.default"; another overload name does not."""
    graph = torch.fx.Graph()
    args = [graph.placeholder(name) for name in "qkvo"]
    node = graph.call_function(
        torch.ops.vllm.unified_attention_with_output.default, (*args, "layer")
    )
    assert is_splitting_node(node, [ATTN_OP])
    assert is_splitting_node(node, [f"{ATTN_OP}.default"])
    assert not is_splitting_node(node, [f"{ATTN_OP}.out"])


def test_weak_ref_tensor_shares_memory_without_keeping_it():
    base = torch.arange(12.0)
    view = base[2:].view(2, 5)
    weak = weak_ref_tensor(view)
    assert weak.data_ptr() == view.data_ptr()
    assert (weak.shape, weak.stride(), weak.storage_offset()) == (
        view.shape,
        view.stride(),
        view.storage_offset(),
    )
    weak[0, 0] = 100.0
    assert base[2] == 100.0
    ref = StorageWeakRef(base.untyped_storage())
    pair = weak_ref_tensors((base, None))
    assert isinstance(pair, tuple) and pair[1] is None
    del base, view, pair
    assert ref.expired()  # only weak references were left: the memory went


def test_splitting_ops_are_checked():
    vllm_compile = CompilationMode.VLLM_COMPILE
    with pytest.raises(ValueError, match="splitting_ops"):
        CompilationConfig(mode=vllm_compile, splitting_ops="vllm::unified_attention")
    with pytest.raises(ValueError, match="splitting_ops"):
        CompilationConfig(mode=vllm_compile, splitting_ops=["unified_attention"])
    with pytest.raises(ValueError, match="splitting_ops takes effect only with"):
        CompilationConfig(mode=CompilationMode.STOCK_TORCH_COMPILE, splitting_ops=[ATTN_OP])
    config = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, splitting_ops=["vllm::nope"])
    with pytest.raises(ValueError, match="vllm::nope"):
        VllmBackend(config, "eager")


def test_splitting_ops_through_the_engine(model_dir, monkeypatch):
    """`-cc '{"mode": 3, "splitting_ops": [...]}'` reaches the model through
    the engine (V2 runner, chunked 16-token steps): the forward is split there
    and the tokens equal the eager engine's."""
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    cc = {"mode": 3, "backend": "eager", "splitting_ops": [ATTN_OP]}
    assert EngineArgs(model=model_dir, compilation_config=cc).create_engine_config()
    prompts = [
        {"prompt_token_ids": list(range(3 + i, 3 + i + n))} for i, n in enumerate((5, 17, 9))
    ]
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    tokens = {}
    for name, config in (("eager", None), ("split", cc)):
        torch._dynamo.reset()
        llm = LLM(
            model=model_dir,
            dtype="float32",
            max_model_len=128,
            max_num_batched_tokens=16,
            compilation_config=config,
        )
        runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
        forward = runner.model_runner.model.forward
        tokens[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        if config is not None:
            items = forward.split_backend.piecewise_graphs_items
            assert sum(i.is_splitting_graph for i in items) == 2  # the two layers' attention
        llm.llm_engine.engine_core.shutdown()
    assert tokens["split"] == tokens["eager"]

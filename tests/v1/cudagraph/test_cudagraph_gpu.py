"""CUDA graph capture and replay on a GPU: the wrapper, and greedy parity with
graphs on vs off through both model runners. Skipped without CUDA (the
dispatch and padding logic is tested on CPU in the other files here)."""

import gc

import pytest
import torch

from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, set_forward_context

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device"
)


@pytest.fixture(scope="module")
def graph_model_dir(tmp_path_factory):
    """A tiny Llama with 32-wide heads (TRITON_ATTN's smallest; the shared
    tiny models have 16-wide heads, which select the paged torch backend)."""
    from tests.utils import make_tiny_model

    return make_tiny_model(
        "llama",
        str(tmp_path_factory.mktemp("llama_h32")),
        num_attention_heads=2,
        num_key_value_heads=1,
    )


class _Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16, device="cuda")

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2 + 1


def test_wrapper_capture_then_replay_equals_eager(tiny_model_dir):
    from tests.v1.worker.utils import make_vllm_config
    from vllm.compilation.cuda_graph import CUDAGraphWrapper

    config = make_vllm_config(tiny_model_dir("llama"))
    model = _Affine()
    wrapped = CUDAGraphWrapper(model, config, CUDAGraphMode.FULL)
    static = torch.zeros(8, 16, device="cuda")
    desc = BatchDescriptor(8)
    with torch.inference_mode():
        model(static)  # the eager run the contract asks for (cuBLAS handle)
        for step in range(3):
            static.copy_(torch.randn(8, 16, device="cuda"))
            with set_forward_context(
                None, config, cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=desc
            ):
                out = wrapped(static)
            torch.testing.assert_close(out, model(static))
        assert len(wrapped.concrete_cudagraph_entries) == 1
        # NONE runs the model directly (no new graph).
        with set_forward_context(None, config):
            torch.testing.assert_close(wrapped(static), model(static))
        # Inputs that moved since capture are refused.
        with (
            set_forward_context(
                None, config, cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=desc
            ),
            pytest.raises(RuntimeError, match="moved"),
        ):
            wrapped(static.clone())
    assert wrapped.lin is model.lin and wrapped.unwrap() is model  # attributes pass through


def _generate(model_dir, monkeypatch, v2: bool, mode: str | None):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1" if v2 else "0")
    monkeypatch.setenv("VLLM_ATTENTION_BACKEND", "TRITON_ATTN")
    cc = {"cudagraph_mode": mode, "max_cudagraph_capture_size": 16}
    if mode is not None and "PIECEWISE" in mode:
        cc["mode"] = 3  # VLLM_COMPILE: the graph split that piecewise graphs need
    kwargs = dict(enforce_eager=True) if mode is None else dict(compilation_config=cc)
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        # 16-token steps: chunked prefills mix with decodes in batches that
        # fit the graphs (mixed batches replay FULL or PIECEWISE graphs).
        max_num_batched_tokens=16,
        seed=0,
        gpu_memory_utilization=0.3,
        **kwargs,
    )
    worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    runner = worker.model_runner
    builder = runner.attn_groups[0][0].metadata_builder
    assert type(builder).__name__ == "TritonAttentionMetadataBuilder"
    num_graphs = 0 if mode is None else _num_graphs(runner, v2)
    prompts = [
        TokensPrompt(prompt_token_ids=list(range(3 + i, 3 + i + n)))
        for i, n in enumerate((5, 17, 9, 30, 2))
    ]
    sp = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    tokens = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, sp, use_tqdm=False)]
    llm.llm_engine.engine_core.shutdown()
    del llm, worker, runner
    gc.collect()
    torch.cuda.empty_cache()
    return tokens, num_graphs


def _num_graphs(runner, v2: bool) -> int:
    """Graph keys captured: the runner's full graphs, plus the keys the model's
    pieces captured (every piece captures each key once)."""
    from vllm.compilation.cuda_graph import CUDAGraphWrapper
    from vllm.v1.worker.cudagraph_manager import unwrap_model

    if v2:
        full = len(runner.cudagraph_manager.graphs)
        model = runner.model
    else:
        wrapped = runner.model
        full = (
            len(wrapped.concrete_cudagraph_entries) if isinstance(wrapped, CUDAGraphWrapper) else 0
        )
        model = unwrap_model(wrapped)
    split = getattr(model.forward, "split_backend", None)
    if split is None:
        return full
    keys = [set(w.concrete_cudagraph_entries) for w in split.piece_wrappers]
    assert keys and all(k == keys[0] for k in keys)
    if v2:
        assert keys[0] == {d.batch_descriptor for d in runner.cudagraph_manager.piecewise_captured}
    return full + len(keys[0])


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
@pytest.mark.parametrize(
    "mode, expected_graphs",
    [
        # capture sizes up to 16: 1, 2, 4, 8, 16
        ("FULL_DECODE_ONLY", 5),
        ("FULL", 5),
        ("PIECEWISE", 5),
        ("FULL_AND_PIECEWISE", 10),  # full decode graphs and piecewise mixed ones
    ],
)
def test_greedy_parity_graphs_on_vs_off(graph_model_dir, monkeypatch, v2, mode, expected_graphs):
    model_dir = graph_model_dir
    eager, _ = _generate(model_dir, monkeypatch, v2, None)
    graphs, num_graphs = _generate(model_dir, monkeypatch, v2, mode)
    assert num_graphs == expected_graphs
    assert graphs == eager


def test_piecewise_wrapper_capture_then_replay(tiny_model_dir):
    """Two pieces around an eager in-place op, captured per size in one pool
    with weak outputs: replays equal eager, for two sizes captured largest
    first."""
    from tests.v1.worker.utils import make_vllm_config
    from vllm.compilation.cuda_graph import CUDAGraphOptions, CUDAGraphWrapper

    config = make_vllm_config(tiny_model_dir("llama"))
    first, second = _Affine(), _Affine()
    options = CUDAGraphOptions(weak_ref_output=True)
    pool = torch.cuda.graph_pool_handle()
    pieces = [
        CUDAGraphWrapper(m, config, CUDAGraphMode.PIECEWISE, options) for m in (first, second)
    ]
    for p in pieces:
        p.graph_pool = pool
    static = torch.zeros(16, 16, device="cuda")

    def model(n):
        h = pieces[0](static[:n])
        # "attention": eager, between the pieces, in place in the first
        # piece's output (as unified_attention_with_output writes its buffer)
        h.mul_(0.5).sub_(1)
        return pieces[1](h)

    def reference(n):
        return second(first(static[:n]) * 0.5 - 1)

    with torch.inference_mode():
        reference(16), reference(8)
        for step in range(3):
            static.copy_(torch.randn(16, 16, device="cuda"))
            for n in (16, 8):
                with set_forward_context(
                    None,
                    config,
                    cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE,
                    batch_descriptor=BatchDescriptor(n),
                ):
                    out = model(n)
                torch.testing.assert_close(out, reference(n))
    assert all(len(p.concrete_cudagraph_entries) == 2 for p in pieces)

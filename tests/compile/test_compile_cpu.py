"""torch.compile of the model forward on CPU (vllm/compilation/): the
compiled model gives eager's greedy tokens, one graph serves every batch
size (no recompile), attention stays opaque and the compiled ops trace."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from tests.v1.worker.utils import ScriptedScheduler, make_kv_cache_config, make_vllm_config
from vllm import _custom_ops as ops
from vllm.compilation.backends import resolve_backend, unpack_cpu_linear_weights
from vllm.compilation.decorators import maybe_compile_model
from vllm.compilation.fake_ops import register_cpu_fake_ops
from vllm.config.compilation import CompilationConfig, CompilationMode, CUDAGraphMode
from vllm.sampling_params import SamplingParams
from vllm.v1.worker.gpu_worker import Worker

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)
PROMPTS = {"a": [5, 9, 3, 7, 11, 2, 8], "b": [4, 4, 19, 6, 1], "c": [13, 2, 2, 17, 30, 7, 9, 1, 3]}


def _worker(model_dir: str, mode: CompilationMode, backend: str | None, **cc) -> Worker:
    """A V1 worker whose model is compiled under `mode` (and the compilation
    config fields `cc`, set before compiling). The runner itself takes no CUDA
    graphs on CPU: cudagraph_mode is reset to NONE after compiling (a piecewise
    mode only shapes how the split pieces are wrapped)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # the scripted scheduler speaks V1 form
        config = make_vllm_config(model_dir)
        worker = Worker(config)
        worker.init_device()
    worker.load_model()
    compilation = config.compilation_config
    compilation.mode = mode
    for key, value in cc.items():
        setattr(compilation, key, value)
    runner = worker.model_runner
    runner.model = maybe_compile_model(
        runner.model, compilation, "cpu", backend=backend, vllm_config=config
    )
    compilation.cudagraph_mode = CUDAGraphMode.NONE
    worker.initialize_from_config(make_kv_cache_config(worker.get_kv_cache_spec()))
    return worker


def _script(worker: Worker) -> list[dict[str, list[int]]]:
    """Batch sizes 2 (prefill 12 tokens, then decodes of 2), a mixed step
    adding a third request, then decodes of 3 and, after two finish, of 1."""
    s = ScriptedScheduler(worker)
    for rid, prompt in PROMPTS.items():
        s.add(rid, prompt, GREEDY)
    s.step({"a": 7, "b": 5}, new=("a", "b"))
    s.decode_all(["a", "b"], 2)
    s.step({"a": 1, "b": 1, "c": 9}, new=("c",))
    s.decode_all(["a", "b", "c"], 3)
    s.finish("a")
    s.finish("b")
    s.decode_all(["c"], 2)
    return s.outputs_per_step


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def eager_tokens(model_dir):
    worker = _worker(model_dir, CompilationMode.NONE, None)
    try:
        return _script(worker)
    finally:
        worker.shutdown()


# Inductor is what the modes use; "aot_eager" traces and functionalises the
# same graph without generating code (a quicker check of the tracing alone).
@pytest.mark.parametrize("backend", ["aot_eager", None])
def test_compiled_matches_eager_without_recompiles(model_dir, eager_tokens, backend):
    torch._dynamo.reset()
    counters.clear()
    worker = _worker(model_dir, CompilationMode.STOCK_TORCH_COMPILE, backend)
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            tokens = _script(worker)
    finally:
        worker.shutdown()
    assert tokens == eager_tokens
    assert counters["stats"]["unique_graphs"] == 1  # token counts 12, 2, 11, 3, 1: one graph
    assert not counters["graph_break"]  # attention is an opaque op, not a break


def test_mode_none_returns_the_model_unchanged(model_dir):
    torch._dynamo.reset()
    worker = _worker(model_dir, CompilationMode.NONE, None)
    try:
        model = worker.model_runner.model
        assert "forward" not in vars(model)  # the class's own forward
        assert maybe_compile_model(model, CompilationConfig(), "cpu") is model
    finally:
        worker.shutdown()


def test_unpack_gives_dense_weights_but_keeps_the_lm_head_packed(model_dir):
    """Inductor gets dense weights for the compiled forward; compute_logits
    stays eager, so the LM head keeps its oneDNN-packed weight."""
    worker = _worker(model_dir, CompilationMode.NONE, None)
    try:
        model = worker.model_runner.model
        packed = {
            n: m for n, m in model.named_modules() if getattr(m, "_packed_weight", None) is not None
        }
        if not packed:
            pytest.skip("no oneDNN weight packing on this CPU / torch build")
        x = torch.randn(3, model.config.hidden_size)
        qkv = model.model.layers[0].self_attn.qkv_proj
        before = qkv(x)[0]
        assert unpack_cpu_linear_weights(model) == len(packed) - ("lm_head" in packed)
        assert qkv._packed_weight is None and qkv.weight.shape[0] > 0
        torch.testing.assert_close(qkv(x)[0], before)
        if "lm_head" in packed:
            assert model.lm_head._packed_weight is not None
    finally:
        worker.shutdown()


def test_backend_resolution():
    assert resolve_backend(CompilationConfig(mode=CompilationMode.VLLM_COMPILE)) == "inductor"
    assert (
        resolve_backend(CompilationConfig(mode=CompilationMode.STOCK_TORCH_COMPILE), "eager")
        == "eager"
    )
    with pytest.raises(ValueError, match="Unknown torch.compile backend 'nope'"):
        resolve_backend(CompilationConfig(mode=CompilationMode.STOCK_TORCH_COMPILE), "nope")
    with pytest.raises(ValueError, match="NONE has no compiler backend"):
        resolve_backend(CompilationConfig())


@pytest.mark.skipif(
    not ops.cpu_ops_available(), reason=f"compiled CPU ops not loaded: {ops.cpu_ops_load_error()}"
)
def test_cpu_ops_have_fake_kernels():
    names = register_cpu_fake_ops()
    assert "rms_norm" in names and "paged_attention_decode" in names
    x = torch.randn(3, 8)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fx, fout, fw = mode.from_tensor(x), mode.from_tensor(x), mode.from_tensor(torch.ones(8))
        torch.ops._C_cpu.rms_norm(fout, fx, fw, 1e-6)  # raises without a fake kernel


def test_compilation_config_flag_compiles_through_the_engine(model_dir, monkeypatch):
    """`-cc '{"mode": 1, "backend": "aot_eager"}'` reaches the runner's
    load_model (both runners call maybe_compile_model) and keeps the
    greedy tokens of transformers."""
    from tests.utils import hf_greedy
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    torch._dynamo.reset()
    prompts = list(PROMPTS.values())
    expected = hf_greedy(model_dir, prompts, 8)
    for runner_v2 in ("0", "1"):
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner_v2)
        llm = LLM(
            model_dir,
            dtype="float32",
            max_model_len=64,
            compilation_config={"mode": 1, "backend": "aot_eager"},
        )
        try:
            core = llm.llm_engine.engine_core.engine_core
            model = core.model_executor.driver_worker.worker.model_runner.get_model()
            assert "forward" in vars(model)  # the instance's compiled forward
            outs = llm.generate(
                [TokensPrompt(prompt_token_ids=p) for p in prompts],
                SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
            )
        finally:
            llm.llm_engine.engine_core.shutdown()
        assert [list(o.outputs[0].token_ids) for o in outs] == expected

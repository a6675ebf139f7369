"""Padding a batch to a CUDA graph's size, checked on CPU.

The padding logic (dummy requests after the real ones, slots -1) is the same
with and without a graph: here the dispatcher is given graph keys while the
model stays unwrapped (no CUDA), so padded batches run eagerly and their
greedy tokens must equal transformers' `generate`, i.e. the unpadded run.
"""

import random

import numpy as np
import pytest
import torch

from tests.utils import hf_greedy
from tests.v1.worker.utils import ScriptedScheduler, make_kv_cache_config, make_vllm_config
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.sampling_params import SamplingParams
from vllm.v1.worker.cudagraph_padding import PaddedBatch, plan_padding, write_padding

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)
SIZES = [1, 2, 4, 8, 16, 24, 32, 48]


def test_plan_padding_layouts():
    full = CUDAGraphMode.FULL
    # uniform decode: 3 requests of 1 token padded to 4 -> one more 1-token request
    p = plan_padding(full, BatchDescriptor(4, 4, uniform=True), 3, 3, 8, 128)
    assert p.pad_query_lens.tolist() == [1] and p.num_reqs_padded == 4
    assert p.num_tokens_padded == 4
    # mixed: 2 requests, 13 tokens -> 16: one dummy request of 3 tokens
    p = plan_padding(full, BatchDescriptor(16), 2, 13, 8, 128)
    assert p.pad_query_lens.tolist() == [3] and p.num_tokens_padded == 16
    # exact fit: no dummy request
    p = plan_padding(full, BatchDescriptor(16), 2, 16, 8, 128)
    assert p.num_reqs_padded == 2 and p.runtime_mode == full
    # no spare request row, or a dummy longer than max_model_len -> eager, unpadded
    for p in (
        plan_padding(full, BatchDescriptor(16), 8, 13, 8, 128),
        plan_padding(full, BatchDescriptor(16), 2, 4, 8, 8),
    ):
        assert p.runtime_mode == CUDAGraphMode.NONE and p.batch_descriptor is None
        assert p.num_tokens_padded == p.num_tokens
    p = plan_padding(CUDAGraphMode.NONE, BatchDescriptor(13), 2, 13, 8, 128)
    assert p.num_tokens_padded == 13 and not len(p.pad_query_lens)


def test_write_padding_fills_dummy_requests():
    padded = PaddedBatch(
        CUDAGraphMode.FULL,
        BatchDescriptor(9),
        num_reqs=2,
        num_tokens=5,
        pad_query_lens=np.array([3, 1], dtype=np.int32),
    )
    ids, pos = np.full(12, 7), np.full(12, 7)
    qsl, seq = np.array([0, 2, 5, 99, 99, 99]), np.array([10, 20, 99, 99, 99])
    slots = [np.arange(12), np.arange(12)]
    write_padding(padded, ids, pos, qsl, seq, slots)
    assert pos[5:9].tolist() == [0, 1, 2, 0] and ids[5:9].tolist() == [0] * 4
    assert pos[:5].tolist() == [7] * 5 and pos[9] == 7  # real entries untouched
    assert qsl[:5].tolist() == [0, 2, 5, 8, 9] and seq[:4].tolist() == [10, 20, 3, 1]
    for s in slots:
        assert s[5:9].tolist() == [-1] * 4 and s[:5].tolist() == list(range(5))


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


def _spy_forward(runner, qsl: torch.Tensor, seq_lens: torch.Tensor) -> list[int]:
    """Record the token count of every forward, and after the first one the
    device query starts / sequence lengths it ran with."""
    seen: list[int] = []
    model = runner.model

    def forward(**kwargs):
        seen.append(kwargs["input_ids"].shape[0])
        if len(seen) == 1:
            runner.first_layout = (qsl[:4].tolist(), seq_lens[:3].tolist())
        return model(**kwargs)

    forward.compute_logits = model.compute_logits
    runner.model = forward
    return seen


def _check_first_layout(runner, mode):
    """Step 1 is a (6 + 5)-token batch; under FULL one dummy request of 5
    tokens pads it to 16."""
    if mode == CUDAGraphMode.FULL:
        assert runner.first_layout == ([0, 6, 11, 16], [6, 5, 5])
    else:
        assert runner.first_layout[0][:3] == [0, 6, 11]


def _force_padding(runner, mode: CUDAGraphMode) -> list[int]:
    """Give the dispatcher graph keys (the model stays unwrapped: eager)."""
    config = runner.vllm_config.compilation_config
    config.cudagraph_capture_sizes = list(SIZES)
    runner.cudagraph_manager.initialize(mode)
    bufs = runner.input_buffers
    return _spy_forward(runner, bufs.query_start_loc.gpu, bufs.seq_lens.gpu)


PADDING_MODES = [
    CUDAGraphMode.FULL,
    CUDAGraphMode.FULL_DECODE_ONLY,
    CUDAGraphMode.FULL_AND_PIECEWISE,
]


@pytest.mark.parametrize("mode", PADDING_MODES)
def test_v1_padded_forward_matches_unpadded(model_dir, mode, monkeypatch):
    from vllm.v1.worker.gpu_worker import Worker

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    worker = Worker(make_vllm_config(model_dir))
    worker.init_device()
    worker.load_model()
    worker.initialize_from_config(make_kv_cache_config(worker.get_kv_cache_spec()))
    seen = _force_padding(worker.model_runner, mode)
    try:
        rng = random.Random(3)
        prompts = [[rng.randrange(1, 512) for _ in range(n)] for n in (11, 5, 7)]
        expected = hf_greedy(model_dir, prompts, 6)
        s = ScriptedScheduler(worker)
        for req_id, prompt in zip("abc", prompts):
            s.add(req_id, prompt, GREEDY)
        s.step({"a": 6, "b": 5}, new=("a", "b"))  # 11 tokens -> 16 under FULL
        s.step({"a": 5, "b": 1, "c": 7}, new=("c",))  # 13 -> 16
        while min(len(s.reqs[r].outputs) for r in "abc") < 6:
            s.step({r: 1 for r in "abc" if len(s.reqs[r].outputs) < 6})  # 3 -> 4, 2 -> 2
        for r, want in zip("abc", expected):
            assert s.reqs[r].outputs == want, r
        _check_first_layout(worker.model_runner, mode)
    finally:
        worker.shutdown()
    assert 4 in seen  # three decodes padded to a 4-token graph
    if mode != CUDAGraphMode.FULL_DECODE_ONLY:  # FULL or PIECEWISE mixed graphs
        assert seen[:2] == [16, 16]
    else:  # mixed batches are not padded
        assert seen[:2] == [11, 13]


@pytest.mark.parametrize("mode", PADDING_MODES)
def test_v2_padded_forward_matches_unpadded(model_dir, mode):
    from tests.v1.worker.gpu.utils import V2ScriptedScheduler, make_v2_runner

    runner = make_v2_runner(model_dir, max_num_seqs=8, max_num_batched_tokens=64)
    runner.vllm_config.compilation_config.cudagraph_capture_sizes = list(SIZES)
    runner.cudagraph_manager.initialize(mode)
    seen = _spy_forward(runner, runner.input_buffers.query_start_loc, runner.input_buffers.seq_lens)
    rng = random.Random(4)
    prompts = [[rng.randrange(1, 512) for _ in range(n)] for n in (11, 5, 7)]
    expected = hf_greedy(model_dir, prompts, 6)
    s = V2ScriptedScheduler(runner)
    for req_id, prompt in zip("abc", prompts):
        s.add(req_id, prompt, GREEDY)
    s.step({"a": 6, "b": 5}, new=("a", "b"))
    s.step({"a": 5, "b": 1, "c": 7}, new=("c",))
    while min(len(s.reqs[r].outputs) for r in "abc") < 6:
        s.step({r: 1 for r in "abc" if len(s.reqs[r].outputs) < 6})
    for r, want in zip("abc", expected):
        assert s.reqs[r].outputs == want, r
    _check_first_layout(runner, mode)
    assert 4 in seen
    assert seen[:2] == ([11, 13] if mode == CUDAGraphMode.FULL_DECODE_ONLY else [16, 16])


def test_v2_manager_dispatch():
    from types import SimpleNamespace

    from vllm.config.compilation import CompilationConfig
    from vllm.v1.worker.gpu.cudagraph_utils import (
        BatchExecutionDescriptor,
        CudaGraphManager,
        dispatch_and_plan,
    )

    cc = CompilationConfig(cudagraph_mode="FULL_DECODE_ONLY", cudagraph_capture_sizes=SIZES)
    cc.resolve("cuda", False, 64, 8)
    cfg = SimpleNamespace(
        compilation_config=cc,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=64, max_num_seqs=8),
    )
    m = CudaGraphManager(cfg, torch.device("cpu"))
    assert m.dispatch(3, 3, 1) is None  # keys not initialised
    m.initialize(CUDAGraphMode.FULL_DECODE_ONLY)
    assert m.dispatch(3, 3, 1) == BatchExecutionDescriptor(CUDAGraphMode.FULL, 4, 4, 1)
    assert m.dispatch(3, 7, None) is None  # mixed batch: eager in this mode
    assert m.dispatch(9, 9, 1) is None  # more decodes than max_num_seqs
    assert [d.num_tokens for d in m.get_capture_descs()] == [8, 4, 2, 1]
    m.initialize(CUDAGraphMode.FULL)
    assert m.dispatch(2, 13, None) == BatchExecutionDescriptor(CUDAGraphMode.FULL, 16)
    assert m.dispatch(2, 49, None) is None  # above the largest size
    assert not m.has_graph(m.dispatch(2, 13, None))
    with pytest.raises(RuntimeError, match="No CUDA graph"):
        m.run_fullgraph(BatchExecutionDescriptor(CUDAGraphMode.FULL, 16))
    # Decode batches replay a full graph, mixed ones the model's pieces.
    m.initialize(CUDAGraphMode.FULL_AND_PIECEWISE)
    assert m.dispatch(3, 3, 1) == BatchExecutionDescriptor(CUDAGraphMode.FULL, 4, 4, 1)
    piecewise = BatchExecutionDescriptor(CUDAGraphMode.PIECEWISE, 16)
    assert m.dispatch(2, 13, None) == piecewise
    descs = m.get_capture_descs()
    assert [d.num_tokens for d in descs if d.cg_mode == CUDAGraphMode.PIECEWISE] == SIZES[::-1]
    assert [d.num_tokens for d in descs if d.cg_mode == CUDAGraphMode.FULL] == [8, 4, 2, 1]
    desc, padded = dispatch_and_plan(m, np.array([6, 7], np.int32), 13, 8, 128)
    assert desc == piecewise and padded.pad_query_lens.tolist() == [3]
    assert not m.has_graph(piecewise)
    m.piecewise_captured.add(piecewise)  # what capture() records for the model's pieces
    assert m.has_graph(piecewise)


def test_v1_capture_path_layout_on_cpu(model_dir, monkeypatch):
    """The capture loop and the capture-shaped dummy runs, with the model
    unwrapped (CPU): every key gets one eager and one FULL run, and a size
    without a graph is refused."""
    from vllm.v1.worker import cudagraph_manager
    from vllm.v1.worker.gpu_worker import Worker

    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    worker = Worker(make_vllm_config(model_dir))
    worker.init_device()
    worker.load_model()
    worker.initialize_from_config(make_kv_cache_config(worker.get_kv_cache_spec()))
    runner = worker.model_runner
    try:
        assert runner.capture_model() == 0  # CPU: cudagraph_mode NONE, no keys
        seen = _force_padding(runner, CUDAGraphMode.FULL_DECODE_ONLY)
        calls = []
        real_dummy_run = cudagraph_manager.dummy_run

        def dummy_run(*args, **kwargs):
            calls.append((args[6], kwargs.get("cudagraph_runtime_mode")))
            return real_dummy_run(*args, **kwargs)

        monkeypatch.setattr(cudagraph_manager, "dummy_run", dummy_run)
        assert runner.capture_model() == 4
        assert calls == [(n, m) for n in (8, 4, 2, 1) for m in (None, CUDAGraphMode.FULL)]
        assert seen == [8, 8, 4, 4, 2, 2, 1, 1]
        assert runner.input_buffers.seq_lens.gpu[:8].tolist() == [1] * 8  # eight one-token requests
        with pytest.raises(ValueError, match="No FULL CUDA graph of 3 tokens"):
            runner._dummy_run(3, cudagraph_runtime_mode=CUDAGraphMode.FULL, uniform_decode=True)
    finally:
        worker.shutdown()

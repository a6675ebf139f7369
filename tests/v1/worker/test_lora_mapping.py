"""The step's LoRA mapping of both runners' batches (issue 18): V1's
persistent InputBatch keeps each row's adapter through add / remove / condense
/ swap, and V2's LoraState maps request rows in batch order; both give the
token mapping (one id per scheduled token, in token order), the logits-row
mapping and the step's adapters exactly."""

from __future__ import annotations

import random

import numpy as np

from tests.v1.worker.test_gpu_input_batch import make_batch, make_request
from vllm.lora.request import LoRARequest
from vllm.v1.worker.gpu.lora_utils import LoraState

# The last two share a name (a server reload under a new id): both ids must
# stay in the step's adapters, which a set of LoRARequests would merge.
ADAPTERS = [
    None,
    LoRARequest("a", 3, "/a"),
    LoRARequest("b", 7, "/b"),
    LoRARequest("b", 9, "/b-reloaded"),
]


def by_id(requests) -> dict[int, str]:
    ids = [r.lora_int_id for r in requests]
    assert len(ids) == len(set(ids)), "one request per id"
    return {r.lora_int_id: r.lora_path for r in requests}


def expected_inputs(ids: list[int], num_scheduled: np.ndarray, num_sampled: np.ndarray):
    tokens = [i for i, n in zip(ids, num_scheduled.tolist()) for _ in range(n)]
    rows = [i for i, n in zip(ids, num_sampled.tolist()) for _ in range(n)]
    return tuple(rows), tuple(tokens)


def test_v1_input_batch_lora_mapping_follows_rows():
    rng = random.Random(0)
    batch = make_batch()
    live: dict[str, LoRARequest | None] = {}
    for step in range(30):
        for req_id in rng.sample(sorted(live), k=rng.randint(0, len(live))):
            batch.remove_request(req_id)
            del live[req_id]
        while len(live) < 8 and rng.random() < 0.7:
            req = make_request(100 * step + len(live), rng)
            req.lora_request = rng.choice(ADAPTERS)
            batch.add_request(req)
            live[req.req_id] = req.lora_request
        batch.condense()
        if batch.num_reqs >= 2:
            batch.swap_states(0, batch.num_reqs - 1)
        n = batch.num_reqs
        num_scheduled = np.array([rng.randint(1, 5) for _ in range(n)], dtype=np.int32)
        num_sampled = np.ones(n, dtype=np.int32)
        ids = [live[r].lora_int_id if live[r] else 0 for r in batch.req_ids]
        rows, tokens, requests = batch.make_lora_inputs(num_scheduled, num_sampled)
        assert (rows, tokens) == expected_inputs(ids, num_scheduled, num_sampled)
        assert by_id(requests) == by_id({lr.lora_int_id: lr for lr in live.values() if lr}.values())
        assert set(batch.lora_id_to_request_ids) == set(by_id(requests))


def test_v2_lora_state_batch_order():
    state = LoraState(max_num_reqs=4)
    # Rows: 0 <- r0 (a), 1 <- r1 (base), 2 <- r2 (b).
    for row, (req_id, lora) in enumerate([("r0", ADAPTERS[1]), ("r1", None), ("r2", ADAPTERS[2])]):
        state.add_request(req_id, row, lora)
    # The step's batch order differs from the rows (decodes first, say).
    req_ids, idx_mapping = ["r2", "r1", "r0"], np.array([2, 1, 0])
    num_scheduled = np.array([1, 2, 3], dtype=np.int32)
    rows, tokens, requests = state.make_lora_inputs(req_ids, idx_mapping, num_scheduled)
    assert rows == (7, 0, 3)
    assert tokens == (7, 0, 0, 3, 3, 3)
    assert by_id(requests) == {3: "/a", 7: "/b"}
    # A finished request's row goes to a base-model request: no stale adapter.
    state.remove_request("r0")
    state.add_request("r3", 0, None)
    rows, tokens, requests = state.make_lora_inputs(
        ["r3", "r2"], np.array([0, 2]), np.ones(2, dtype=np.int32)
    )
    assert (rows, tokens, by_id(requests)) == ((0, 7), (0, 7), {7: "/b"})
    # The same name under a new id, next to the old load: both ids active.
    state.add_request("r4", 1, ADAPTERS[3])
    rows, tokens, requests = state.make_lora_inputs(
        ["r2", "r4"], np.array([2, 1]), np.ones(2, dtype=np.int32)
    )
    assert (rows, by_id(requests)) == ((7, 9), {7: "/b", 9: "/b-reloaded"})


def test_steps_with_adapters_dispatch_no_graph():
    """Graphs are captured with no adapter active: both runners' managers give
    a step with adapters (has_lora) no graph, while the same batch without
    adapters gets one."""
    from types import SimpleNamespace

    import torch

    from vllm.config.compilation import CompilationConfig, CUDAGraphMode
    from vllm.v1.worker.cudagraph_manager import CudaGraphManager as V1Manager
    from vllm.v1.worker.gpu.cudagraph_utils import CudaGraphManager as V2Manager

    cc = CompilationConfig(cudagraph_mode="FULL", cudagraph_capture_sizes=[1, 2, 4, 8, 16])
    cc.resolve("cuda", False, 64, 8)
    cfg = SimpleNamespace(
        compilation_config=cc,
        scheduler_config=SimpleNamespace(max_num_batched_tokens=64, max_num_seqs=8),
        model_config=SimpleNamespace(max_model_len=128),
    )
    v2 = V2Manager(cfg, torch.device("cpu"))
    v2.initialize(CUDAGraphMode.FULL)
    assert v2.dispatch(3, 3, 1) is not None
    assert v2.dispatch(3, 3, 1, has_lora=True) is None
    v1 = V1Manager(cfg, torch.device("cpu"))
    v1.initialize(CUDAGraphMode.FULL)
    decodes = np.ones(3, dtype=np.int32)
    assert v1.dispatch(decodes, 3).runtime_mode == CUDAGraphMode.FULL
    padded = v1.dispatch(decodes, 3, has_lora=True)
    assert padded.runtime_mode == CUDAGraphMode.NONE and padded.num_tokens_padded == 3


def test_sleep_level_2_refused_with_lora():
    """Level 2 reloads the base weights into the model's modules, which the
    LoRA layers have replaced: refused by name; level 1 stays allowed."""
    from types import SimpleNamespace

    import pytest

    from vllm.config.compilation import CompilationConfig
    from vllm.config.lora import LoRAConfig
    from vllm.v1.worker.worker_sleep import check_sleep_supported

    cfg = SimpleNamespace(compilation_config=CompilationConfig(), lora_config=LoRAConfig())
    with pytest.raises(ValueError, match=r"Sleep level 2 .*\(--enable-lora\)"):
        check_sleep_supported(cfg, 2)  # type: ignore[arg-type]
    check_sleep_supported(cfg, 1)  # type: ignore[arg-type]

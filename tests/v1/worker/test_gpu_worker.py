"""End to end through the real Worker and V1 model runner on a tiny random Llama:
chunked prefill, mixed prefill/decode batches, preemption and V1-style resume,
a finished request leaving a hole, seeded sampling that does not depend on
chunking or batch-mates. Greedy tokens must equal transformers' `generate`."""

import random

import pytest
import torch

from tests.utils import hf_greedy
from tests.v1.worker.utils import ScriptedScheduler, make_kv_cache_config, make_vllm_config
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

GREEDY = SamplingParams(temperature=0.0, max_tokens=64)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir("llama")


@pytest.fixture(scope="module")
def worker(model_dir):
    # These tests are about the V1 runner (and send V1-form scheduler outputs).
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
        worker = Worker(make_vllm_config(model_dir))
        worker.init_device()
    assert type(worker.model_runner) is GPUModelRunner
    worker.load_model()
    worker.initialize_from_config(make_kv_cache_config(worker.get_kv_cache_spec()))
    worker.compile_or_warm_up_model()
    yield worker
    worker.shutdown()


def prompts(seed: int, lengths: list[int]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 512) for _ in range(n)] for n in lengths]


def test_kv_cache_is_bound_to_every_layer(worker):
    specs = worker.get_kv_cache_spec()
    assert len(specs) == 2  # two decoder layers
    ctx = worker.vllm_config.compilation_config.static_forward_context
    runner = worker.model_runner
    assert len(runner.kv_caches) == 2
    for name, spec in specs.items():
        kv = ctx[name].kv_cache[0]
        assert kv.shape[1:] == (96, spec.block_size, spec.num_kv_heads, spec.head_size)
        assert kv.dtype == torch.float32
    assert worker.determine_available_memory() == 1 << 22


def test_greedy_matches_transformers_through_chunking_preemption_and_resume(worker, model_dir):
    a, b, c, d = prompts(0, [21, 7, 13, 10])
    num_new = 8
    expected = dict(zip("abcd", hf_greedy(model_dir, [a, b, c, d], num_new)))
    s = ScriptedScheduler(worker)
    for req_id, prompt in zip("abcd", (a, b, c, d)):
        s.add(req_id, prompt, GREEDY)

    # 1: a's prompt in two chunks: no token for a yet; b prefills whole.
    out = s.step({"a": 12, "b": 7}, new=("a", "b"))
    assert out["a"] == [] and len(out["b"]) == 1
    # 2: rest of a, a decode for b, c arrives: a mixed prefill/decode batch.
    s.step({"a": 9, "b": 1, "c": 13}, new=("c",))
    s.step({"a": 1, "b": 1, "c": 1})
    # 4: b is preempted (its blocks are freed); a and c go on.
    s.step({"a": 1, "c": 1}, preempted=("b",))
    # 5: c has 3 tokens and finishes, leaving a hole in the batch; d arrives
    # and gets b's old blocks.
    assert s.reqs["c"].outputs == expected["c"][:3]
    s.finish("c")
    s.step({"a": 1, "d": 10}, new=("d",))
    # 6: b resumes (V1 form): its whole sequence is recomputed in new blocks.
    b_tokens = s.reqs["b"].num_tokens
    out = s.step({"a": 1, "b": b_tokens, "d": 1}, resumed=("b",))
    assert len(out["b"]) == 1
    assert worker.model_runner.input_batch.num_reqs == 3
    while min(len(s.reqs[r].outputs) for r in "abd") < num_new:
        s.step({r: 1 for r in "abd" if len(s.reqs[r].outputs) < num_new})

    for r in "abd":
        assert s.reqs[r].outputs == expected[r], r
    for r in "abd":
        s.finish(r)
    # Nothing scheduled: the finished requests are dropped, nothing is sampled.
    empty = SchedulerOutput.make_empty()
    empty.finished_req_ids = s.pending_finished
    assert worker.execute_model(empty) is EMPTY_MODEL_RUNNER_OUTPUT
    assert worker.sample_tokens(None) is None
    assert not worker.model_runner.requests
    assert worker.model_runner.input_batch.num_reqs == 0


def _seeded_tokens(worker, chunks: list[int], companions: int, tag: str) -> list[int]:
    """Six tokens of one seeded request whose prompt is prefilled in `chunks`,
    next to `companions` greedy requests."""
    (prompt,) = prompts(1, [sum(chunks)])
    seeded = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=1234, max_tokens=64)
    s = ScriptedScheduler(worker)
    s.add(f"{tag}-seeded", prompt, seeded)
    others = [f"{tag}-greedy{i}" for i in range(companions)]
    for req_id, p in zip(others, prompts(2, [5] * companions)):
        s.add(req_id, p, GREEDY)
    s.step({f"{tag}-seeded": chunks[0], **{r: 5 for r in others}}, new=(f"{tag}-seeded", *others))
    for chunk in chunks[1:]:
        s.step({f"{tag}-seeded": chunk, **{r: 1 for r in others}})
    s.decode_all([f"{tag}-seeded", *others], steps=5)
    tokens = s.reqs[f"{tag}-seeded"].outputs
    for req_id in list(s.reqs):
        s.finish(req_id)
    empty = SchedulerOutput.make_empty()
    empty.finished_req_ids = s.pending_finished
    worker.execute_model(empty)
    return tokens


def test_seeded_sampling_ignores_chunking_and_batch_mates(worker):
    whole = _seeded_tokens(worker, [15], companions=0, tag="x")
    chunked = _seeded_tokens(worker, [4, 6, 5], companions=3, tag="y")
    assert len(whole) == 6
    assert whole == chunked
    assert len(set(whole)) > 1  # sampling, not a constant


def test_logprobs_are_returned_for_requests_that_ask(worker):
    (prompt,) = prompts(3, [9])
    s = ScriptedScheduler(worker)
    s.add("lp", prompt, SamplingParams(temperature=0.0, logprobs=3, max_tokens=8))
    s.step({"lp": 9}, new=("lp",))
    logprobs = s.last_output.logprobs
    assert logprobs is not None
    token = s.reqs["lp"].outputs[0]
    assert logprobs.logprob_token_ids[0][0] == token
    assert logprobs.logprob_token_ids[0][1] == token  # greedy: the top-1 token
    assert logprobs.sampled_token_ranks[0] == 1
    assert len(logprobs.logprobs[0]) == 4
    s.finish("lp")
    empty = SchedulerOutput.make_empty()
    empty.finished_req_ids = s.pending_finished
    worker.execute_model(empty)


def test_prompt_logprobs_over_chunks_match_transformers(worker, model_dir):
    from transformers import AutoModelForCausalLM

    (prompt,) = prompts(4, [11])
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0], -1)[:-1]  # [10, vocab]
    targets = torch.tensor(prompt[1:])

    s = ScriptedScheduler(worker)
    s.add("plp", prompt, SamplingParams(temperature=0.0, prompt_logprobs=2, max_tokens=8))
    s.step({"plp": 4}, new=("plp",))
    assert s.last_output.prompt_logprobs_dict == {}  # still mid-prompt
    s.step({"plp": 7})
    tensors = s.last_output.prompt_logprobs_dict["plp"]
    assert tensors.logprobs.shape == (10, 3)
    torch.testing.assert_close(
        tensors.logprobs[:, 0], ref.gather(1, targets[:, None])[:, 0], atol=1e-4, rtol=1e-4
    )
    assert tensors.logprob_token_ids[:, 0].tolist() == prompt[1:]
    assert tensors.logprob_token_ids[:, 1:].tolist() == ref.topk(2).indices.tolist()
    expected_ranks = (ref > ref.gather(1, targets[:, None])).sum(-1) + 1
    assert tensors.selected_token_ranks.tolist() == expected_ranks.tolist()
    s.step({"plp": 1})  # decoding: no more prompt logprobs
    assert s.last_output.prompt_logprobs_dict == {}
    s.finish("plp")
    empty = SchedulerOutput.make_empty()
    empty.finished_req_ids = s.pending_finished
    worker.execute_model(empty)


def test_cpu_kv_cache_budget_sources(model_dir, monkeypatch):
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    worker = Worker(make_vllm_config(model_dir, kv_cache_memory_bytes=None))
    worker.init_device()
    worker.load_model()
    # Default: 4 GiB capped at max_num_seqs requests of max_model_len tokens.
    cfg = worker.vllm_config
    per_request = sum(
        spec.max_memory_usage_bytes(cfg) for spec in worker.get_kv_cache_spec().values()
    )
    expected = min(4 << 30, per_request * cfg.scheduler_config.max_num_seqs)
    assert expected < 4 << 30  # the tiny model needs far less than upstream's 4 GiB
    assert worker.determine_available_memory() == expected
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert worker.determine_available_memory() == 2 << 30
    worker.cache_config.kv_cache_memory_bytes = 12345 * 4096
    assert worker.determine_available_memory() == 12345 * 4096

"""The sampling contract survives the engine core running in its own process:
every parameter and the logprob tensors cross the msgpack boundary, and the
results equal those of the in-process core."""

from __future__ import annotations

import pytest

from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

PROMPTS = [TokensPrompt(prompt_token_ids=list(range(3, 3 + n))) for n in (5, 21)]
PARAMS = [
    SamplingParams(
        temperature=0.0,
        max_tokens=6,
        ignore_eos=True,
        repetition_penalty=1.4,
        frequency_penalty=0.6,
        presence_penalty=0.3,
        logit_bias={9: 1.5},
        bad_words=["fox"],
        logprobs=3,
        prompt_logprobs=2,
    ),
    SamplingParams(
        temperature=0.9,
        seed=5,
        n=2,
        max_tokens=6,
        min_tokens=3,
        allowed_token_ids=[0, 4, 8, 15, 16, 23, 42],
        stop_token_ids=[42],
        logprobs=1,
    ),
]


def _run(model_dir: str, multiprocessing: bool) -> list:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if multiprocessing else "0")
        mp.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
        llm = LLM(
            model=model_dir,
            dtype="float32",
            max_model_len=64,
            max_num_batched_tokens=16,
            max_num_seqs=8,
            kv_cache_memory_bytes=8 * 2**20,
            seed=0,
        )
        try:
            return llm.generate(PROMPTS * 2, PARAMS * 2, use_tqdm=False)
        finally:
            llm.llm_engine.shutdown()


def _summary(outs) -> list:
    return [
        (
            o.request_id,
            o.prompt_logprobs,
            [(c.index, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason) for c in o.outputs],
        )
        for o in outs
    ]


def _assert_same(a, b, path: str = "") -> None:
    """Structural equality with floats (logprobs) compared to 1e-5."""
    if isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= 1e-5, f"{path}: {a} != {b}"
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), f"{path}: keys {a.keys()} != {b.keys()}"
        for k in a:
            _assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif hasattr(a, "logprob") and type(a) is type(b):  # Logprob
        _assert_same(a.logprob, b.logprob, f"{path}.logprob")
        assert (a.rank, a.decoded_token) == (b.rank, b.decoded_token), path
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_multiprocess_core_gives_the_same_results(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    inproc = _run(model_dir, multiprocessing=False)
    multiproc = _run(model_dir, multiprocessing=True)
    # Requests reach a separate core at their own pace, so its first steps may
    # batch them differently; logits then differ in the last float bits. The
    # tokens must match exactly, the logprobs to rounding.
    _assert_same(_summary(multiproc), _summary(inproc))
    allowed = {0, 4, 8, 15, 16, 23, 42}
    for out in (multiproc[1], multiproc[3]):
        assert len(out.outputs) == 2
        for completion in out.outputs:
            assert set(completion.token_ids) <= allowed
            assert len(completion.token_ids) >= 3

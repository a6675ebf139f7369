"""LoRA parity with peft (issue 18, "what it must show", first point): for
several peft adapters on a tiny random Llama (ranks 8 and 16, one rsLoRA,
random A and B, every attention and MLP projection targeted, one adapter also
the input embedding and the LM head), greedy output
through a LoRARequest equals transformers' greedy output of
PeftModel.from_pretrained(base, path).merge_and_unload(), float32, on both
model runners. The longest prompt is prefilled in chunks (32-token steps),
so prefill chunks, decodes and requests of other adapters share steps; a small
KV cache forces preemptions, after which requests resume under their adapter.
TP=2: tests/lora/test_lora_tp.py."""

from __future__ import annotations

import pytest

from tests.lora.lora_engine_utils import (
    ADAPTERS,
    MAX_TOKENS,
    PROMPTS,
    build_base_and_adapters,
    greedy_tokens,
    lora_llm,
    lora_request,
    merged_greedy,
)

NAMES = [a[0] for a in ADAPTERS]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(base dir, adapter dirs, name -> reference tokens per prompt; None = base)."""
    base, paths = build_base_and_adapters(str(tmp_path_factory.mktemp("lora-parity")))
    expected = {name: merged_greedy(base, paths[name], PROMPTS, MAX_TOKENS) for name in NAMES}
    expected[None] = merged_greedy(base, None, PROMPTS, MAX_TOKENS)
    # The adapters must change the output, or parity would prove nothing.
    for name in NAMES:
        assert expected[name] != expected[None], name
    return base, paths, expected


@pytest.fixture(scope="module", params=["v1", "v2"])
def llm(request, setup):
    base, _, _ = setup
    with lora_llm(request.param, base, max_loras=4) as engine:
        yield engine


def test_each_adapter_matches_merged_peft(llm, setup):
    """One adapter per generate call: every prompt equals the merged model."""
    _, paths, expected = setup
    for name in NAMES:
        lora = lora_request(name, paths)
        got = greedy_tokens(llm, PROMPTS, [lora] * len(PROMPTS))
        assert got == expected[name], name
    assert greedy_tokens(llm, PROMPTS, [None] * len(PROMPTS)) == expected[None]


def test_all_adapters_in_one_batch_match_merged_peft(llm, setup):
    """Every (prompt, adapter or base) pair in one call (max_loras=4: all
    adapters may share a step), each equal to its merged model."""
    _, paths, expected = setup
    cases = [(i, name) for name in [*NAMES, None] for i in range(len(PROMPTS))]
    loras = [lora_request(n, paths) if n is not None else None for _, n in cases]
    got = greedy_tokens(llm, [PROMPTS[i] for i, _ in cases], loras)
    assert got == [expected[n][i] for i, n in cases]


def test_prompt_logprobs_match_merged_peft(llm, setup):
    """Prompt logprobs are logits of prompt positions, rows the step's
    sampling does not cover (and the 40-token prompt spans two steps): under
    each adapter, and the base model, in one call, each equals the merged
    model's log-softmax of the prompt's next token."""
    import torch

    from tests.lora.lora_engine_utils import merged_prompt_logprobs
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    base, paths, _ = setup
    prompt = PROMPTS[-1]
    names = [*NAMES, None]
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=prompt)] * len(names),
        SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0),
        lora_request=[lora_request(n, paths) if n is not None else None for n in names],
        use_tqdm=False,
    )
    for name, out in zip(names, outs):
        entries = out.prompt_logprobs
        assert entries is not None and entries[0] is None and len(entries) == len(prompt)
        got = torch.tensor([entries[i][tok].logprob for i, tok in enumerate(prompt) if i])
        want = merged_prompt_logprobs(base, paths[name] if name else None, prompt)
        torch.testing.assert_close(got, want, rtol=0, atol=2e-4, msg=str(name))


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_preempted_requests_keep_their_adapter(setup, runner):
    """A KV cache of 12 blocks for 16 requests (all adapters and the base
    model) forces preemptions; a preempted request comes back (V2: as a new
    request) under its own adapter and still equals the merged model."""
    from tests.models.zoo_utils import spy_preemptions

    base, paths, expected = setup
    cases = [(i, name) for name in [*NAMES, None] for i in range(len(PROMPTS))]
    with lora_llm(
        runner,
        base,
        in_process=True,  # the spy reads the in-process scheduler
        max_loras=4,
        num_gpu_blocks_override=12,
        block_size=16,
        enable_prefix_caching=False,
    ) as llm:
        preempted = spy_preemptions(llm)
        loras = [lora_request(n, paths) if n is not None else None for _, n in cases]
        got = greedy_tokens(llm, [PROMPTS[i] for i, _ in cases], loras)
    assert preempted, "the small KV cache was meant to force preemption"
    assert got == [expected[n][i] for i, n in cases]

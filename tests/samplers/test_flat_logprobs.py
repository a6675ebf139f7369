"""FlatLogprobs: the flat container behaves as the list of per-position dicts
it replaces (upstream: tests/test_logprobs.py), also end to end."""

from __future__ import annotations

from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.logprobs import (
    FlatLogprobs,
    Logprob,
    append_logprobs_for_next_position,
    create_prompt_logprobs,
    create_sample_logprobs,
)
from vllm.sampling_params import RequestOutputKind

POSITIONS = [  # (ids, values, rank of entry 0, num_logprobs)
    ([7, 3, 7], [-0.5, -0.4, -0.5], 2, 2),  # sampled token also in the top-k
    ([9, 1, 2], [-2.0, -0.1, -0.9], 5, 2),
    ([4], [-0.2], 1, 0),
    ([6, 6, 8, 5], [-0.3, -0.3, -1.0, -2.0], 1, -1),
]


def _fill(flat: bool):
    prompt, sample = create_prompt_logprobs(flat), create_sample_logprobs(flat)
    for ids, values, rank, k in POSITIONS:
        texts = [f"<{t}>" for t in ids]
        append_logprobs_for_next_position(prompt, ids, values, texts, rank, k)
        append_logprobs_for_next_position(sample, ids, values, texts, rank, k)
    return prompt, sample


def test_flat_container_reads_like_the_list_form():
    plain_prompt, plain_sample = _fill(False)
    flat_prompt, flat_sample = _fill(True)
    assert isinstance(flat_sample, FlatLogprobs) and isinstance(plain_sample, list)
    assert plain_prompt[0] is None and flat_prompt[0] == {}
    assert list(flat_prompt)[1:] == plain_prompt[1:]
    assert list(flat_sample) == plain_sample and len(flat_sample) == len(plain_sample)
    assert flat_sample[0] == {7: Logprob(-0.5, 2, "<7>"), 3: Logprob(-0.4, 1, "<3>")}
    assert list(flat_sample[1:3]) == plain_sample[1:3]
    assert list(flat_sample[-2:]) == plain_sample[-2:]
    joined = FlatLogprobs()
    joined.extend(flat_sample[:1])
    joined.extend(flat_sample[1:])
    joined.extend([plain_sample[0]])
    assert list(joined) == plain_sample + plain_sample[:1]


def test_flat_logprobs_end_to_end(runner_llm):
    _, llm = runner_llm
    prompt = TokensPrompt(
        prompt_token_ids=[5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90]
    )  # prefilled in chunks
    base = dict(temperature=0.0, max_tokens=5, ignore_eos=True, logprobs=3, prompt_logprobs=2)
    (plain,) = llm.generate(prompt, SamplingParams(**base), use_tqdm=False)
    (flat,) = llm.generate(prompt, SamplingParams(**base, flat_logprobs=True), use_tqdm=False)
    assert isinstance(flat.outputs[0].logprobs, FlatLogprobs)
    assert isinstance(flat.prompt_logprobs, FlatLogprobs)
    assert list(flat.outputs[0].logprobs) == plain.outputs[0].logprobs
    assert list(flat.prompt_logprobs)[1:] == plain.prompt_logprobs[1:]
    # Streaming: the DELTA pieces join up to the same positions.
    engine = llm.llm_engine
    engine.add_request(
        "flat-delta",
        prompt,
        SamplingParams(**base, flat_logprobs=True, output_kind=RequestOutputKind.DELTA),
    )
    pieces = FlatLogprobs()
    while engine.has_unfinished_requests():
        for out in engine.step():
            pieces.extend(out.outputs[0].logprobs)
    assert list(pieces) == plain.outputs[0].logprobs

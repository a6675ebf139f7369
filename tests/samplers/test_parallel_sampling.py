"""n > 1 end to end in both model runners: seeded fan-out is reproducible,
children differ, child i is the request with seed + i, outputs come back in
index order under the caller's request id."""

from __future__ import annotations

from vllm import SamplingParams
from vllm.inputs import TokensPrompt
from vllm.sampling_params import RequestOutputKind

PROMPT = TokensPrompt(prompt_token_ids=[11, 22, 33, 44, 55, 66, 77])


def _tokens(outs) -> list[tuple[int, ...]]:
    return [tuple(c.token_ids) for c in outs[0].outputs]


def test_seeded_n_is_reproducible_and_children_differ(runner_llm):
    _, llm = runner_llm
    sp = SamplingParams(n=4, seed=1234, temperature=1.0, max_tokens=8, ignore_eos=True, logprobs=1)
    first = llm.generate(PROMPT, sp, use_tqdm=False)
    second = llm.generate([PROMPT, PROMPT], sp, use_tqdm=False)  # a different batch
    assert len(first) == 1 and len(first[0].outputs) == 4
    assert [c.index for c in first[0].outputs] == [0, 1, 2, 3]
    assert _tokens(first) == _tokens(second[:1]) == _tokens(second[1:])
    assert len(set(_tokens(first))) == 4
    assert all(len(c.logprobs) == 8 for c in first[0].outputs)
    # Child i samples exactly as a lone request seeded with seed + i.
    for i in range(4):
        alone = llm.generate(
            PROMPT,
            SamplingParams(seed=1234 + i, temperature=1.0, max_tokens=8, ignore_eos=True),
            use_tqdm=False,
        )
        assert _tokens(alone)[0] == _tokens(first)[i]


def test_unseeded_children_differ_and_ids_are_the_callers(runner_llm):
    _, llm = runner_llm
    outs = llm.generate(
        [PROMPT, PROMPT],
        SamplingParams(n=3, temperature=1.0, max_tokens=6, ignore_eos=True),
        use_tqdm=False,
    )
    assert [o.request_id for o in outs] == sorted(o.request_id for o in outs)
    for out in outs:
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert len(set(_tokens([out]))) == 3
    assert llm.llm_engine.get_num_unfinished_requests() == 0


def test_streaming_children_through_the_engine(runner_llm):
    _, llm = runner_llm
    engine = llm.llm_engine
    sp = SamplingParams(
        n=2,
        seed=3,
        temperature=1.0,
        max_tokens=5,
        ignore_eos=True,
        output_kind=RequestOutputKind.DELTA,
    )
    engine.add_request("stream-me", PROMPT, sp)
    pieces: dict[int, list[int]] = {0: [], 1: []}
    finished = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "stream-me" and len(out.outputs) == 1
            pieces[out.outputs[0].index].extend(out.outputs[0].token_ids)
            finished.append(out.finished)
    assert finished[-1] and not any(finished[:-1])
    final = llm.generate(
        PROMPT,
        SamplingParams(n=2, seed=3, temperature=1.0, max_tokens=5, ignore_eos=True),
        use_tqdm=False,
    )
    assert [tuple(pieces[i]) for i in range(2)] == _tokens(final)

"""`LLM.generate` end to end on a tiny random model: prompt forms, ordering,
per-prompt params, stop strings, the progress bar, and bad input that fails
cleanly while the engine keeps serving (upstream: tests/entrypoints/llm/)."""

from __future__ import annotations

import functools
import io
import re

import pytest
from tqdm import tqdm

from vllm import LLM, SamplingParams
from vllm.inputs import TextPrompt, TokensPrompt
from vllm.sampling_params import RequestOutputKind

MAX_MODEL_LEN = 64
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    # In-process engine core: these tests look into its scheduler.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return LLM(
            model=tiny_model_dir("llama"),
            dtype="float32",
            max_model_len=MAX_MODEL_LEN,
            kv_cache_memory_bytes=8 * 2**20,
            seed=0,
        )


def _assert_idle(llm: LLM) -> None:
    assert llm.llm_engine.get_num_unfinished_requests() == 0
    assert not llm.llm_engine.engine_core.engine_core.scheduler.has_unfinished_requests()


def test_prompt_forms_and_order(llm):
    tok = llm.get_tokenizer()
    texts = ["The quick brown fox", "def hello(world):", "Paged attention stores"]
    outs = llm.generate(texts, GREEDY, use_tqdm=False)
    assert [o.prompt for o in outs] == texts
    assert [int(o.request_id) for o in outs] == sorted(int(o.request_id) for o in outs)
    assert all(len(o.outputs[0].token_ids) == 8 and o.finished for o in outs)
    # The same prompt as a str, a TextPrompt and a TokensPrompt gives the same tokens.
    ids = tok.encode(texts[0])
    mixed = llm.generate(
        [texts[0], TextPrompt(prompt=texts[0]), TokensPrompt(prompt_token_ids=ids)],
        GREEDY,
        use_tqdm=False,
    )
    assert [o.outputs[0].token_ids for o in mixed] == [outs[0].outputs[0].token_ids] * 3
    assert [o.prompt_token_ids for o in mixed] == [ids] * 3
    assert mixed[2].prompt is None
    single = llm.generate(texts[1], GREEDY, use_tqdm=False)
    assert single[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    _assert_idle(llm)


def test_per_prompt_params(llm):
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (1, 5, 9)]
    outs = llm.generate(["a", "b", "c"], params, use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [1, 5, 9]
    assert all(o.outputs[0].finish_reason == "length" for o in outs)
    with pytest.raises(ValueError, match="must be the same"):
        llm.generate(["a", "b"], params, use_tqdm=False)


def test_stop_string_end_to_end(llm):
    prompt = "The quick brown fox"
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    full = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0].text
    # A stop string that first appears mid-way through the greedy text.
    start = len(full) // 2
    stop = full[start : start + 3]
    cut = full.find(stop)
    assert cut > 0
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, stop=[stop])
    out = llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]
    assert out.text == full[:cut]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    _assert_idle(llm)


def test_delta_outputs_through_the_engine(llm):
    engine = llm.llm_engine
    params = SamplingParams(
        temperature=0.0, max_tokens=12, ignore_eos=True, output_kind=RequestOutputKind.DELTA
    )
    engine.add_request("delta", "Paged attention", params)
    deltas = []
    while engine.has_unfinished_requests():
        deltas.extend(engine.step())
    assert all(o.request_id == "delta" for o in deltas) and deltas[-1].finished
    final = llm.generate(
        "Paged attention",
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        use_tqdm=False,
    )
    assert "".join(o.outputs[0].text for o in deltas) == final[0].outputs[0].text
    assert [t for o in deltas for t in o.outputs[0].token_ids] == final[0].outputs[0].token_ids


def test_abort_request_by_user_id(llm):
    engine = llm.llm_engine
    engine.add_request("gone", "The quick", SamplingParams(max_tokens=30, ignore_eos=True))
    engine.step()
    engine.abort_request(["gone"])
    _assert_idle(llm)
    assert all(o.request_id != "gone" for o in engine.step())


def test_progress_bar_shows_token_speeds(llm):
    buf = io.StringIO()
    llm.generate(["a b c", "d e f"], GREEDY, use_tqdm=functools.partial(tqdm, file=buf))
    line = buf.getvalue().strip().split("\r")[-1]
    assert "Processed prompts: 100%" in line
    m = re.search(r"est\. speed input: ([\d.]+) toks/s, output: ([\d.]+) toks/s", line)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0, line


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        (TokensPrompt(prompt_token_ids=[1] * MAX_MODEL_LEN * 2), "longer than the maximum model"),
        (TokensPrompt(prompt_token_ids=[1] * MAX_MODEL_LEN), "requested output tokens"),
        (TokensPrompt(prompt_token_ids=[3, 10**6, 4]), "out of vocabulary"),
        (TokensPrompt(prompt_token_ids=[3, -1]), "out of vocabulary"),
        (TokensPrompt(prompt_token_ids=[]), "cannot be empty"),
        ("", "cannot be empty"),
    ],
)
def test_bad_prompt_is_a_clear_error_and_the_engine_goes_on(llm, prompt, message):
    good = llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match=message):
        llm.generate(["The quick", prompt], GREEDY, use_tqdm=False)
    # The good prompt added before the bad one was withdrawn, not left running.
    _assert_idle(llm)
    assert llm.generate("The quick", GREEDY, use_tqdm=False)[0].outputs[0].token_ids == good


def test_bad_params_are_clear_errors(llm):
    with pytest.raises(ValueError, match="max_tokens must be at least 1"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="greater than max allowed"):
        llm.generate("x", SamplingParams(logprobs=50), use_tqdm=False)
    with pytest.raises(TypeError, match="must be a str"):
        llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)
    _assert_idle(llm)


def test_unknown_model_path_fails_at_construction(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LLM(model=str(tmp_path / "missing-model"))


def test_max_tokens_defaults_to_the_rest_of_the_context(llm):
    ids = list(range(5, 5 + 50))
    out = llm.generate(
        TokensPrompt(prompt_token_ids=ids),
        SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True),
        use_tqdm=False,
    )[0]
    assert len(out.outputs[0].token_ids) == MAX_MODEL_LEN - len(ids)
    assert out.outputs[0].finish_reason == "length"

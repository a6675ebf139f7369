"""Stop strings: check_stop_strings cases (upstream: tests/detokenizer/
test_stop_strings.py, tests/v1/engine/test_output_processor.py::test_stop_string)
and the whole path through the engine."""

from __future__ import annotations

import pytest

from tests.v1.engine.conftest import make_request
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine import EngineCoreOutput
from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer, check_stop_strings
from vllm.v1.engine.output_processor import OutputProcessor
from vllm.v1.outputs import LogprobsLists


@pytest.mark.parametrize(
    "text, new, stop, include, expected",
    [
        # Overlapping stop strings: the one that completes first wins, whatever
        # the list order.
        ("xabcd", 4, ["bcd", "ab"], False, ("ab", 1)),
        ("xabcd", 4, ["bcd", "ab"], True, ("ab", 3)),
        # One stop string is a suffix of another: both complete together, list order decides.
        ("xabcd", 4, ["cd", "abcd"], False, ("cd", 3)),
        ("xabcd", 4, ["abcd", "cd"], False, ("abcd", 1)),
        # A stop string occurring twice: the first occurrence.
        ("abab", 4, ["b"], False, ("b", 1)),
        # Ending exactly at the end of the text: nothing to cut when shown.
        ("hello", 2, ["lo"], True, ("lo", -1)),
        ("hello", 2, ["lo"], False, ("lo", 3)),
        # Starts in old text, ends in the new characters (across a token boundary).
        ("hello world", 3, ["o wor"], False, ("o wor", 4)),
        # Entirely inside text checked before: ignored.
        ("hello world", 3, ["hell"], False, None),
        ("hello", 0, ["lo"], False, None),
    ],
)
def test_check_stop_strings(text, new, stop, include, expected):
    assert check_stop_strings(text, new, stop, include) == expected


def test_multibyte_stop_string_split_over_byte_tokens(tiny_tokenizer):
    # The tiny tokenizer knows only ASCII merges: "日本" is six byte tokens.
    ids = tiny_tokenizer.encode("ok 日本語 done")
    detok = FastIncrementalDetokenizer(tiny_tokenizer, make_request([1], stop=["本語"]))
    results = []
    for t in ids:
        results.append(detok.update([t], stop_terminated=False))
        if results[-1] is not None:
            break
    hit = len(results) - 1
    assert results[hit] == "本語"
    assert detok.output_text == "ok 日"
    assert tiny_tokenizer.decode(ids[: hit + 1]).endswith("本語")
    assert not tiny_tokenizer.decode(ids[:hit]).endswith("本語")


@pytest.mark.parametrize("include", [False, True])
def test_output_processor_stop_string_streams_and_aborts(tiny_tokenizer, include):
    text = "The quick brown fox jumps over the lazy dog."
    ids = tiny_tokenizer.encode(text)
    processor = OutputProcessor(tiny_tokenizer, log_stats=False)
    processor.add_request(
        make_request(
            [1],
            stop=["fox jum", "lazy"],
            logprobs=0,
            include_stop_str_in_output=include,
            output_kind=RequestOutputKind.DELTA,
        ),
        prompt=None,
    )
    deltas, aborts, num_logprobs = [], [], 0
    for t in ids:
        eco = EngineCoreOutput(
            request_id="r0", new_token_ids=[t], new_logprobs=LogprobsLists([[t]], [[-1.0]], [1])
        )
        processed = processor.process_outputs([eco])
        aborts += processed.reqs_to_abort
        for out in processed.request_outputs:
            deltas.append(out.outputs[0].text)
            num_logprobs += len(out.outputs[0].logprobs)
            final = out
        if not processor.has_unfinished_requests():
            break
    assert aborts == ["r0"]  # the core still runs it: the front end asks to abort
    completion = final.outputs[0]
    assert completion.finish_reason == "stop" and completion.stop_reason == "fox jum"
    expected = "The quick brown fox jum" if include else "The quick brown "
    assert "".join(deltas) == expected
    # The token completing the stop string is the last one; one logprob per token.
    sent_tokens = ids[: ids.index(tiny_tokenizer.encode(" jumps")[0]) + 1]
    assert num_logprobs == len(sent_tokens)


def test_stop_string_end_to_end(tiny_model_dir, monkeypatch):
    from vllm import LLM, SamplingParams

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = LLM(
        model=tiny_model_dir("llama"),
        dtype="float32",
        max_model_len=64,
        kv_cache_memory_bytes=8 * 2**20,
        seed=0,
    )
    prompt = {"prompt_token_ids": [3, 14, 15, 92, 65]}
    greedy = dict(temperature=0.0, max_tokens=12, ignore_eos=True)
    (plain,) = llm.generate(prompt, SamplingParams(**greedy), use_tqdm=False)
    text = plain.outputs[0].text
    # A stop string spanning the 3rd and 4th generated tokens' text.
    upto3 = llm.get_tokenizer().decode(plain.outputs[0].token_ids[:3])
    stop = text[len(upto3) - 1 : len(upto3) + 1]
    assert len(stop) == 2 and text.find(stop) == len(upto3) - 1
    for include in (False, True):
        (out,) = llm.generate(
            prompt,
            SamplingParams(**greedy, stop=[stop], include_stop_str_in_output=include),
            use_tqdm=False,
        )
        completion = out.outputs[0]
        assert completion.finish_reason == "stop" and completion.stop_reason == stop
        assert completion.token_ids == plain.outputs[0].token_ids[:4]
        assert completion.text == (text[: len(upto3) + 1] if include else text[: len(upto3) - 1])
    # The core was told to abort: nothing is left running there.
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    assert not scheduler.has_unfinished_requests()
    assert llm.llm_engine.get_num_unfinished_requests() == 0

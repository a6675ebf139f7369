"""`use_beam_search` on `/v1/completions` and `/v1/chat/completions` runs the
beam search `LLM.beam_search` runs offline: the same tiny model, the same
parameters, the same beams (token ids, best first) — streamed or not. What
beam search does not honour is a 400 naming the field, as is a beam width
whose 2 * n logprobs the server does not allow."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args
from tests.entrypoints.utils import make_inproc_llm
from vllm.inputs import TokensPrompt
from vllm.sampling_params import BeamSearchParams

PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": "Say hello to the lazy dog."}]
EOS = 0


@pytest.fixture(scope="module")
def server(tiny_model_dir, chat_template_file):
    srv = RemoteOpenAIServer(tiny_model_dir("llama"), default_server_args(chat_template_file))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    return make_inproc_llm(tiny_model_dir("llama"), max_model_len=128)


def _post(server: RemoteOpenAIServer, path: str, **body) -> httpx.Response:
    return httpx.post(server.url_for(path), json=body, timeout=120)


def _offline(llm, prompt_ids: list[int], include_eos: bool = True, **params):
    """The offline beams' generated ids (best first) and cumulative logprobs;
    a beam finished by EOS ends with it only when `include_eos`."""
    out = llm.beam_search([TokensPrompt(prompt_token_ids=prompt_ids)], BeamSearchParams(**params))[
        0
    ]
    beams = []
    for seq in out.sequences:
        generated = seq.tokens[len(prompt_ids) :]
        if not include_eos and generated and generated[-1] == EOS:
            generated = generated[:-1]
        beams.append((generated, seq.cum_logprob))
    return beams


def _tokens(server, **body) -> list[int]:
    return _post(server, "tokenize", **body).json()["tokens"]


def _assert_same_beams(choices: list[dict], beams: list[tuple[list[int], float]]) -> None:
    assert [c["token_ids"] for c in choices] == [ids for ids, _ in beams]
    assert all(c["finish_reason"] in ("length", "stop") for c in choices)


@pytest.mark.parametrize("length_penalty", [1.0, 0.3])
def test_beam_search_equals_offline(server, llm, length_penalty):
    beams = _offline(
        llm,
        _tokens(server, prompt=PROMPT),
        include_eos=False,
        beam_width=2,
        max_tokens=6,
        temperature=0.0,
        length_penalty=length_penalty,
    )
    resp = _post(
        server,
        "v1/completions",
        prompt=PROMPT,
        n=2,
        max_tokens=6,
        temperature=0.0,
        use_beam_search=True,
        length_penalty=length_penalty,
        return_token_ids=True,
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    _assert_same_beams(body["choices"], beams)
    assert body["usage"]["completion_tokens"] == sum(len(ids) for ids, _ in beams)
    tokenizer = llm.get_tokenizer()
    assert [c["text"] for c in body["choices"]] == [tokenizer.decode(ids) for ids, _ in beams]


def test_chat_beam_search_equals_offline(server, llm):
    prompt_ids = _tokens(server, messages=MESSAGES)
    beams = _offline(llm, prompt_ids, include_eos=True, beam_width=2, max_tokens=5, temperature=0.0)
    resp = _post(
        server,
        "v1/chat/completions",
        messages=MESSAGES,
        n=2,
        max_tokens=5,
        temperature=0.0,
        use_beam_search=True,
        include_stop_str_in_output=True,
        return_token_ids=True,
    )
    assert resp.status_code == 200, resp.text
    _assert_same_beams(resp.json()["choices"], beams)


def test_streamed_beam_search_sends_each_beam_once(server, llm):
    beams = _offline(
        llm,
        _tokens(server, prompt=PROMPT),
        include_eos=False,
        beam_width=2,
        max_tokens=4,
        temperature=0.0,
    )
    with httpx.stream(
        "POST",
        server.url_for("v1/completions"),
        timeout=120,
        json=dict(
            prompt=PROMPT,
            n=2,
            max_tokens=4,
            temperature=0.0,
            use_beam_search=True,
            stream=True,
            return_token_ids=True,
        ),
    ) as resp:
        assert resp.status_code == 200
        lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(ln[len("data: ") :])["choices"][0] for ln in lines[:-1]]
    chunks.sort(key=lambda c: c["index"])
    _assert_same_beams(chunks, beams)


def test_ignore_eos_and_default_temperature_follow_upstream(server):
    # Without a temperature beam search samples at 1.0 (upstream's default);
    # the beams still come back best first, each max_tokens long (ignore_eos).
    resp = _post(
        server,
        "v1/completions",
        prompt=PROMPT,
        n=2,
        max_tokens=3,
        use_beam_search=True,
        ignore_eos=True,
        return_token_ids=True,
    )
    assert resp.status_code == 200, resp.text
    choices = resp.json()["choices"]
    assert len(choices) == 2 and all(len(c["token_ids"]) == 3 for c in choices)
    assert all(c["finish_reason"] == "length" for c in choices)


@pytest.mark.parametrize(
    "field,value",
    [
        ("logprobs", 1),
        ("stop", ["x"]),
        ("seed", 3),
        ("top_p", 0.5),
        ("echo", True),
        ("presence_penalty", 1.0),
    ],
)
def test_what_beam_search_ignores_is_refused(server, field, value):
    resp = _post(
        server,
        "v1/completions",
        prompt=PROMPT,
        n=2,
        max_tokens=3,
        use_beam_search=True,
        **{field: value},
    )
    assert resp.status_code == 400 and f"`{field}`" in resp.json()["error"]["message"]


def test_unknown_fields_beside_beam_search_are_only_logged(server):
    # Extra keys are in pydantic's model_fields_set but have no field default:
    # the refusal check must skip them (an empty key was a 500 under schemathesis).
    for path, body in (
        ("v1/completions", {"prompt": PROMPT}),
        ("v1/chat/completions", {"messages": MESSAGES}),
    ):
        resp = _post(
            server,
            path,
            **body,
            n=2,
            max_tokens=2,
            temperature=0,
            use_beam_search=True,
            **{"": 1, "not_a_field": "x"},
        )
        assert resp.status_code == 200, resp.text


def test_beam_width_beyond_max_logprobs_is_refused(server):
    # The server runs with --max-logprobs 5: a beam width of 3 needs 6.
    for path, body in (
        ("v1/completions", {"prompt": PROMPT}),
        ("v1/chat/completions", {"messages": MESSAGES}),
    ):
        resp = _post(server, path, **body, n=3, max_tokens=2, use_beam_search=True)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "n", resp.text
    # The server still serves.
    ok = _post(
        server,
        "v1/completions",
        prompt=PROMPT,
        n=2,
        max_tokens=2,
        use_beam_search=True,
        temperature=0.0,
    )
    assert ok.status_code == 200 and len(ok.json()["choices"]) == 2


def test_client_gone_mid_search_aborts_every_beam(server):
    # A search of many steps; the client gives up after a second.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url_for("v1/completions"),
            timeout=1.0,
            json=dict(
                prompt=PROMPT,
                n=2,
                max_tokens=480,
                ignore_eos=True,
                temperature=0.0,
                use_beam_search=True,
            ),
        )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        metrics = server.metrics()
        if metrics["vllm:num_requests_running"] + metrics["vllm:num_requests_waiting"] == 0:
            break
        time.sleep(0.2)
    generated = server.metrics()["vllm:generation_tokens_total"]
    time.sleep(1.0)
    metrics = server.metrics()
    assert metrics["vllm:num_requests_running"] + metrics["vllm:num_requests_waiting"] == 0
    assert metrics["vllm:generation_tokens_total"] == generated  # no step after the abort

"""The rows of the request-field audit (test_request_fields.py) and the
probes that show a field's effect on a real `vllm serve`: each probe takes a
`Call` (one route of the server, with a short greedy base body)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from tests.entrypoints.openai.conftest import RemoteOpenAIServer

PROMPT = "The quick brown fox jumps over"
MESSAGES = [{"role": "user", "content": PROMPT}]
EOS = 0  # the tiny tokenizer's <|endoftext|>


@dataclass(frozen=True)
class Probe:
    """Shown here, against the server (`check(call)` on each route of its table)."""

    check: Callable[[Call], None]


@dataclass(frozen=True)
class Cited:
    """Shown by another test ("path::function"), whose source names the field."""

    test: str


@dataclass(frozen=True)
class Refused:
    """A non-default value is a 400 whose message names the field."""

    value: Any


@dataclass(frozen=True)
class Informational:
    """Accepted without effect, as upstream (and OpenAI) does: why."""

    reason: str


Row = Probe | Cited | Refused | Informational


@dataclass
class Call:
    """One generation route of the server, with a short greedy base body."""

    server: RemoteOpenAIServer
    route: str  # "completions" or "chat"
    # Starts another server whose tokenizer decodes with spaces between tokens.
    spaced_server: Callable[[], RemoteOpenAIServer] = lambda: None  # type: ignore

    def post(self, **fields: Any) -> httpx.Response:
        base: dict[str, Any] = {
            "max_tokens": 4,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        base.update({"prompt": PROMPT} if self.route == "completions" else {"messages": MESSAGES})
        path = "v1/completions" if self.route == "completions" else "v1/chat/completions"
        return httpx.post(self.server.url_for(path), json={**base, **fields}, timeout=60)

    def ok(self, **fields: Any) -> dict[str, Any]:
        resp = self.post(**fields)
        assert resp.status_code == 200, resp.text
        return resp.json()

    def bad(self, field: str, **fields: Any) -> None:
        resp = self.post(**fields)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert field in error["message"] or error["param"] == field, resp.text

    @staticmethod
    def ids(body: dict[str, Any], i: int = 0) -> list[int]:
        return body["choices"][i]["token_ids"]

    def text(self, body: dict[str, Any], i: int = 0) -> str:
        choice = body["choices"][i]
        return choice["text"] if self.route == "completions" else choice["message"]["content"]

    def prompt_tokens(self, **fields: Any) -> int:
        return self.ok(**fields)["usage"]["prompt_tokens"]


# ----------------------------------------------------------------------
# Probes (each shows an effect, or that the value reaches SamplingParams,
# whose effect the offline sampling tests show)
# ----------------------------------------------------------------------


def _reaches_sampling_params(field: str, bad_value: Any) -> Probe:
    """An out-of-range value is SamplingParams' 400 naming the field: the
    server hands the field to SamplingParams (whose effect
    tests/entrypoints/test_llm_multiproc_sampling.py shows)."""
    return Probe(lambda c: c.bad(field, **{field: bad_value}))


def _logit_bias(c: Call) -> None:
    assert set(c.ids(c.ok(logit_bias={"7": 100}))) == {7}


def _n(c: Call) -> None:
    assert len(c.ok(n=2)["choices"]) == 2


def _seed(c: Call) -> None:
    runs = [c.ids(c.ok(temperature=1.0, seed=s, max_tokens=8)) for s in (3, 3, 4)]
    assert runs[0] == runs[1] != runs[2]


def _top_k(c: Call) -> None:
    greedy = c.ids(c.ok(max_tokens=8))
    assert c.ids(c.ok(temperature=1.0, top_k=1, max_tokens=8)) == greedy


def _stop_token_ids(c: Call) -> None:
    greedy = c.ids(c.ok(max_tokens=8))
    choice = c.ok(stop_token_ids=[greedy[2]], max_tokens=8)["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == greedy[2]


def _include_stop_str_in_output(c: Call) -> None:
    text = c.text(c.ok(max_tokens=12))
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    assert stop.strip(), text
    assert not c.text(c.ok(max_tokens=12, stop=[stop])).endswith(stop)
    assert c.text(c.ok(max_tokens=12, stop=[stop], include_stop_str_in_output=True)).endswith(stop)


def _ignore_eos(c: Call) -> None:
    forced = {"logit_bias": {str(EOS): 100}}
    assert len(c.ids(c.ok(**forced, ignore_eos=True))) == 4
    choice = c.ok(**forced, ignore_eos=False)["choices"][0]
    assert choice["finish_reason"] == "stop" and len(choice["token_ids"]) <= 1


def _skip_special_tokens(c: Call) -> None:
    forced = {"logit_bias": {str(EOS): 100}, "max_tokens": 2}
    assert c.text(c.ok(**forced)) == ""
    assert "<|endoftext|>" in c.text(c.ok(**forced, skip_special_tokens=False))


def _spaces_between_special_tokens(c: Call) -> None:
    # It matters only where the tokenizer's decoder puts spaces between
    # tokens (a byte-level one does not): a server whose tokenizer decodes
    # WordPiece-style shows it (spaces kept by default, dropped on request).
    forced = {"logit_bias": {str(EOS): 100}, "max_tokens": 3, "skip_special_tokens": False}
    wordpiece = Call(c.spaced_server(), c.route)
    spaced = wordpiece.text(wordpiece.ok(**forced))
    assert spaced.strip() == " ".join(["<|endoftext|>"] * 3), spaced
    joined = wordpiece.text(wordpiece.ok(**forced, spaces_between_special_tokens=False))
    assert joined.strip() == "<|endoftext|>" * 3, joined


def _truncate_prompt_tokens(c: Call) -> None:
    assert c.prompt_tokens(truncate_prompt_tokens=3) == 3 < c.prompt_tokens()


def _allowed_token_ids(c: Call) -> None:
    assert set(c.ids(c.ok(allowed_token_ids=[9]))) == {9}


def _bad_words(c: Call) -> None:
    greedy = c.ids(c.ok())
    word = httpx.post(c.server.url_for("detokenize"), json={"tokens": greedy[:1]}).json()["prompt"]
    assert c.ids(c.ok(bad_words=[word]))[0] != greedy[0], word


def _prompt_logprobs(c: Call) -> None:
    body = c.ok(prompt_logprobs=1)
    found = (
        body["choices"][0]["prompt_logprobs"]
        if c.route == "completions"
        else body["prompt_logprobs"]
    )
    assert found and found[0] is None and len(found) == body["usage"]["prompt_tokens"]


def _request_id(c: Call) -> None:
    assert c.ok(request_id="probe-123")["id"].endswith("-probe-123")


def _return_token_ids(c: Call) -> None:
    assert "token_ids" in c.ok()["choices"][0]
    assert c.ok(return_token_ids=False)["choices"][0].get("token_ids") is None


def _return_tokens_as_token_ids(c: Call) -> None:
    if c.route == "completions":
        tokens = c.ok(logprobs=1, return_tokens_as_token_ids=True)["choices"][0]["logprobs"][
            "tokens"
        ]
    else:
        content = c.ok(logprobs=True, return_tokens_as_token_ids=True)["choices"][0]["logprobs"][
            "content"
        ]
        tokens = [entry["token"] for entry in content]
    assert tokens and all(re.fullmatch(r"token_id:\d+", t) for t in tokens), tokens


def _cache_salt(c: Call) -> None:
    # A prompt of several KV blocks: the same salt hits the prefix cache, another misses.
    long_prompt = (
        {"prompt": [5 + i % 50 for i in range(96)]}
        if c.route == "completions"
        else {"messages": [{"role": "user", "content": "fox " * 48}]}
    )

    def hits(salt: str) -> float:
        before = c.server.metrics()["vllm:prefix_cache_hits_total"]
        c.ok(**long_prompt, cache_salt=salt, max_tokens=1)
        return c.server.metrics()["vllm:prefix_cache_hits_total"] - before

    salt = f"salt-{c.route}"
    hits(salt)
    assert hits(salt) > 0 and hits(salt + "-other") == 0


def _max_tokens(c: Call) -> None:
    assert len(c.ids(c.ok(max_tokens=3))) == 3


def _max_completion_tokens(c: Call) -> None:
    assert len(c.ids(c.ok(max_tokens=None, max_completion_tokens=2))) == 2


def _model(c: Call) -> None:
    resp = c.post(model="no-such-model")
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"


def _add_special_tokens(c: Call) -> None:
    # This module's tokenizer prepends a BOS when asked to (see `model_dir`).
    assert c.prompt_tokens(add_special_tokens=True) == c.prompt_tokens(add_special_tokens=False) + 1


def _chat_echo(c: Call) -> None:
    prefill = [*MESSAGES, {"role": "assistant", "content": "Once upon"}]
    fields = dict(messages=prefill, add_generation_prompt=False, continue_final_message=True)
    assert not c.text(c.ok(**fields)).startswith("Once upon")
    assert c.text(c.ok(**fields, echo=True)).startswith("Once upon")


def _add_generation_prompt(c: Call) -> None:
    # The test template appends "<|assistant|>" only with add_generation_prompt.
    assert c.prompt_tokens(add_generation_prompt=False) < c.prompt_tokens()


def _continue_final_message(c: Call) -> None:
    # Continuing the last message drops what the template puts after it ("\n").
    fields = dict(
        messages=[*MESSAGES, {"role": "assistant", "content": "Once upon"}],
        add_generation_prompt=False,
    )
    assert c.prompt_tokens(**fields, continue_final_message=True) < c.prompt_tokens(**fields)


def _chat_template_kwargs(c: Call) -> None:
    # This module's template prints `greeting` when given (see TEMPLATE).
    assert c.prompt_tokens(chat_template_kwargs={"greeting": "hello there"}) > c.prompt_tokens()


def _tools(c: Call) -> None:
    # This module's template lists the tools' names; "none" keeps them in the prompt.
    tools = [{"type": "function", "function": {"name": "get_weather_in_a_city"}}]
    assert c.prompt_tokens(tools=tools, tool_choice="none") > c.prompt_tokens()


class TokenizeCall(Call):
    """`/tokenize`: `prompt_tokens` is the count of the rendered prompt."""

    def prompt_tokens(self, **fields: Any) -> int:
        base = {"prompt": PROMPT} if self.route == "completions" else {"messages": MESSAGES}
        resp = httpx.post(self.server.url_for("tokenize"), json={**base, **fields}, timeout=30)
        assert resp.status_code == 200, resp.text
        return resp.json()["count"]

    def post(self, **fields: Any) -> httpx.Response:
        base = {"prompt": PROMPT} if self.route == "completions" else {"messages": MESSAGES}
        return httpx.post(self.server.url_for("tokenize"), json={**base, **fields}, timeout=30)


def _tokenize_model(c: Call) -> None:
    _model(c)


def _return_token_strs(c: Call) -> None:
    body = c.ok(return_token_strs=True, add_special_tokens=True)
    assert len(body["token_strs"]) == body["count"] and body["token_strs"][0] == "<|endoftext|>"
    assert c.ok()["token_strs"] is None


def _tokenize_prompt(c: Call) -> None:
    assert c.prompt_tokens(prompt="ab") < c.prompt_tokens(prompt="ab cd ef gh")


def _tokenize_messages(c: Call) -> None:
    longer = [{"role": "user", "content": PROMPT * 2}]
    assert c.prompt_tokens(messages=longer) > c.prompt_tokens()


def _detokenize_tokens(c: Call) -> None:
    ids = TokenizeCall(c.server, "completions").ok(add_special_tokens=False)["tokens"]
    resp = httpx.post(c.server.url_for("detokenize"), json={"tokens": ids}, timeout=30)
    assert resp.json()["prompt"] == PROMPT


def _detokenize_model(c: Call) -> None:
    resp = httpx.post(
        c.server.url_for("detokenize"), json={"tokens": [1], "model": "no-such-model"}
    )
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"

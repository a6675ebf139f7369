"""Every request field of the OpenAI server works or is refused (issue 13).

One row per field of each request model: a probe (request_field_probes.py)
that shows the field's effect on a real `vllm serve`, a citation of another test that does (it must
name the field), a refusal (a non-default value is a 400 naming the field),
or an informational field upstream also accepts without effect. Adding a
field without a row fails `test_every_field_has_a_row`. Also here: unknown
fields are logged as upstream logs them, and scalars are strictly typed.
"""

from __future__ import annotations

import ast
import shutil
import typing
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, Strict

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args
from tests.entrypoints.openai.request_field_probes import (
    EOS,
    MESSAGES,
    PROMPT,
    Call,
    Cited,
    Informational,
    Probe,
    Refused,
    Row,
    TokenizeCall,
    _add_generation_prompt,
    _add_special_tokens,
    _allowed_token_ids,
    _bad_words,
    _cache_salt,
    _chat_echo,
    _chat_template_kwargs,
    _continue_final_message,
    _detokenize_model,
    _detokenize_tokens,
    _ignore_eos,
    _include_stop_str_in_output,
    _logit_bias,
    _max_completion_tokens,
    _max_tokens,
    _model,
    _n,
    _prompt_logprobs,
    _reaches_sampling_params,
    _request_id,
    _return_token_ids,
    _return_token_strs,
    _return_tokens_as_token_ids,
    _seed,
    _skip_special_tokens,
    _spaces_between_special_tokens,
    _stop_token_ids,
    _tokenize_messages,
    _tokenize_model,
    _tokenize_prompt,
    _tools,
    _top_k,
    _truncate_prompt_tokens,
)
from vllm.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    SamplingRequestMixin,
    StreamOptions,
    TokenizeChatRequest,
    TokenizeCompletionRequest,
)

REPO = Path(__file__).resolve().parents[3]
IGNORED_LOG = "The following fields were present in the request but ignored: "


SHARED: dict[str, Row] = {
    "model": Probe(_model),
    "frequency_penalty": _reaches_sampling_params("frequency_penalty", 3.0),
    "logit_bias": Probe(_logit_bias),
    "n": Probe(_n),
    "presence_penalty": _reaches_sampling_params("presence_penalty", -3.0),
    "response_format": Cited(
        "tests/entrypoints/openai/test_structured_outputs.py::test_chat_response_format_json_schema"
    ),
    "seed": Probe(_seed),
    "stop": Cited("tests/entrypoints/openai/test_serving.py::test_stop_strings"),
    "stream": Cited(
        "tests/entrypoints/openai/test_serving.py::test_chat_stream_equals_non_stream_and_usage"
    ),
    "stream_options": Cited(
        "tests/entrypoints/openai/test_serving.py::test_continuous_usage_stats"
    ),
    "temperature": _reaches_sampling_params("temperature", -1.0),
    "top_p": _reaches_sampling_params("top_p", 1.5),
    "user": Informational(
        "OpenAI's end-user id for abuse monitoring; upstream accepts it and does nothing with it"
    ),
    "top_k": Probe(_top_k),
    "min_p": _reaches_sampling_params("min_p", 2.0),
    "repetition_penalty": _reaches_sampling_params("repetition_penalty", 0.0),
    "stop_token_ids": Probe(_stop_token_ids),
    "include_stop_str_in_output": Probe(_include_stop_str_in_output),
    "ignore_eos": Probe(_ignore_eos),
    "min_tokens": _reaches_sampling_params("min_tokens", 10),  # > max_tokens
    "skip_special_tokens": Probe(_skip_special_tokens),
    "spaces_between_special_tokens": Probe(_spaces_between_special_tokens),
    "truncate_prompt_tokens": Probe(_truncate_prompt_tokens),
    "allowed_token_ids": Probe(_allowed_token_ids),
    "prompt_logprobs": Probe(_prompt_logprobs),
    "bad_words": Probe(_bad_words),
    "priority": _reaches_sampling_params("priority", 1),  # FCFS: only 0
    "request_id": Probe(_request_id),
    "return_token_ids": Probe(_return_token_ids),
    "return_tokens_as_token_ids": Probe(_return_tokens_as_token_ids),
    "cache_salt": Probe(_cache_salt),
    "vllm_xargs": Informational(
        "handed to SamplingParams.extra_args, as upstream, for "
        "custom extensions; no built-in component reads it"
    ),
    "structured_outputs": Cited(
        "tests/entrypoints/openai/test_structured_outputs.py"
        "::test_structured_outputs_choice_and_regex"
    ),
    "use_beam_search": Cited(
        "tests/entrypoints/openai/test_beam_search_server.py::test_beam_search_equals_offline"
    ),
    "length_penalty": Cited(
        "tests/entrypoints/openai/test_beam_search_server.py::test_beam_search_equals_offline"
    ),
}

COMPLETION_ONLY: dict[str, Row] = {
    "prompt": Cited("tests/entrypoints/openai/test_serving.py::test_completion_and_usage"),
    "echo": Cited("tests/entrypoints/openai/test_serving.py::test_echo"),
    "logprobs": Cited("tests/entrypoints/openai/test_serving.py::test_completion_logprobs"),
    "max_tokens": Probe(_max_tokens),
    "suffix": Refused(" and then"),
    "add_special_tokens": Probe(_add_special_tokens),
    "prompt_embeds": Refused("AAAA"),
}

CHAT_ONLY: dict[str, Row] = {
    "messages": Cited("tests/entrypoints/openai/test_serving.py::test_lenient_inputs"),
    "logprobs": Cited("tests/entrypoints/openai/test_serving.py::test_chat_logprobs"),
    "top_logprobs": Cited("tests/entrypoints/openai/test_serving.py::test_chat_logprobs"),
    "max_tokens": Probe(_max_tokens),
    "max_completion_tokens": Probe(_max_completion_tokens),
    "tools": Probe(_tools),
    "tool_choice": Cited("tests/entrypoints/openai/test_tool_choice.py::test_named_tool"),
    "parallel_tool_calls": Cited(
        "tests/entrypoints/openai/test_tool_choice.py::test_required_with_two_tools"
    ),
    "echo": Probe(_chat_echo),
    "add_generation_prompt": Probe(_add_generation_prompt),
    "continue_final_message": Probe(_continue_final_message),
    "add_special_tokens": Probe(_add_special_tokens),
    # Refused unless the server runs with --trust-request-chat-template.
    "chat_template": Refused("{{ messages }}"),
    "chat_template_kwargs": Probe(_chat_template_kwargs),
    "include_reasoning": Cited(
        "tests/entrypoints/openai/test_chat_tools_parsing.py::test_reasoning_parser_plugin"
    ),
}


TOKENIZE_COMPLETION: dict[str, Row] = {
    "model": Probe(_tokenize_model),
    "prompt": Probe(_tokenize_prompt),
    "add_special_tokens": Probe(_add_special_tokens),
    "return_token_strs": Probe(_return_token_strs),
}
TOKENIZE_CHAT: dict[str, Row] = {
    "model": Probe(_tokenize_model),
    "messages": Probe(_tokenize_messages),
    "add_generation_prompt": Probe(_add_generation_prompt),
    "continue_final_message": Probe(_continue_final_message),
    "add_special_tokens": Probe(_add_special_tokens),
    "return_token_strs": Probe(_return_token_strs),
    "chat_template": Refused("{{ messages }}"),
    "chat_template_kwargs": Probe(_chat_template_kwargs),
    "tools": Probe(_tools),
}
DETOKENIZE: dict[str, Row] = {
    "model": Probe(_detokenize_model),
    "tokens": Probe(_detokenize_tokens),
}

# (request model, its rows, the route its probes run on, the call class)
TABLES: list[tuple[type[BaseModel], dict[str, Row], str, type[Call]]] = [
    (CompletionRequest, {**SHARED, **COMPLETION_ONLY}, "completions", Call),
    (ChatCompletionRequest, {**SHARED, **CHAT_ONLY}, "chat", Call),
    (TokenizeCompletionRequest, TOKENIZE_COMPLETION, "completions", TokenizeCall),
    (TokenizeChatRequest, TOKENIZE_CHAT, "chat", TokenizeCall),
    (DetokenizeRequest, DETOKENIZE, "completions", TokenizeCall),
]


def _rows(kind: type) -> list[Any]:
    return [
        pytest.param(model, field, row, route, call_cls, id=f"{model.__name__}.{field}")
        for model, rows, route, call_cls in TABLES
        for field, row in rows.items()
        if isinstance(row, kind)
    ]


# ----------------------------------------------------------------------
# The server: the tiny model with a BOS-adding tokenizer and a template
# that shows tools and a template variable
# ----------------------------------------------------------------------

TEMPLATE = (
    "{% if tools %}{% for t in tools %}[{{ t['function']['name'] }}]{% endfor %}"
    "{% endif %}{% if greeting is defined %}{{ greeting }}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory) -> str:
    """The tiny llama, its tokenizer prepending <|endoftext|> (id 0) as a BOS
    when asked to add special tokens (so `add_special_tokens` shows)."""
    from tokenizers import Tokenizer
    from tokenizers.processors import TemplateProcessing

    out = tmp_path_factory.mktemp("bos-model") / "model"
    shutil.copytree(tiny_model_dir("llama"), out)
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    tok.post_processor = TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", EOS)]
    )
    tok.save(str(out / "tokenizer.json"))
    return str(out)


@pytest.fixture(scope="module")
def log_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("server-log") / "serve.log"


@pytest.fixture(scope="module")
def server(model_dir, chat_template_file, log_path, tmp_path_factory):
    template = tmp_path_factory.mktemp("template") / "tools.jinja"
    template.write_text(TEMPLATE)
    args = default_server_args(chat_template_file)
    args[args.index("--chat-template") + 1] = str(template)
    srv = RemoteOpenAIServer(model_dir, args, log_path=str(log_path))
    yield srv
    srv.stop()


# ----------------------------------------------------------------------
# The table is complete, and each row holds
# ----------------------------------------------------------------------


def test_every_field_has_a_row():
    for model, rows, _, _ in TABLES:
        assert set(rows) == set(model.model_fields), (
            f"{model.__name__}: add a row for each new field (probe, citation, refusal or "
            f"informational); stale rows: {set(rows) - set(model.model_fields)}, missing: "
            f"{set(model.model_fields) - set(rows)}"
        )
    assert set(SHARED) == set(SamplingRequestMixin.model_fields)


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


@pytest.mark.parametrize("model,field,row,route,call_cls", _rows(Cited))
def test_cited_test_exists_and_names_the_field(model, field, row, route, call_cls):
    path, func = row.test.split("::")
    source = (REPO / path).read_text()
    tree = ast.parse(source)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert func in funcs, f"{row.test} does not exist"
    # The field is named in the test or in a module constant the test uses.
    used = _names_in(funcs[func])
    texts = [ast.get_source_segment(source, funcs[func])]
    texts += [
        ast.get_source_segment(source, n)
        for n in tree.body
        if isinstance(n, ast.Assign) and _names_in(n.targets[0]) & used
    ]
    assert any(field in (t or "") for t in texts), f"{row.test} does not use {field}"


@pytest.fixture(scope="module")
def spaced_server(model_dir, chat_template_file, tmp_path_factory):
    """Started on first use: the model with a WordPiece decoder (spaces
    between tokens), for the one probe that needs it."""
    started: list[RemoteOpenAIServer] = []

    def get() -> RemoteOpenAIServer:
        if not started:
            from tokenizers import Tokenizer, decoders

            spaced = tmp_path_factory.mktemp("wordpiece") / "model"
            shutil.copytree(model_dir, spaced)
            tok = Tokenizer.from_file(str(spaced / "tokenizer.json"))
            tok.decoder = decoders.WordPiece()
            tok.save(str(spaced / "tokenizer.json"))
            started.append(RemoteOpenAIServer(str(spaced), default_server_args(chat_template_file)))
        return started[0]

    yield get
    for srv in started:
        srv.stop()


@pytest.mark.parametrize("model,field,row,route,call_cls", _rows(Probe))
def test_probe(server, spaced_server, model, field, row, route, call_cls):
    row.check(call_cls(server, route, spaced_server))


@pytest.mark.parametrize("model,field,row,route,call_cls", _rows(Refused))
def test_refused(server, model, field, row, route, call_cls):
    call_cls(server, route).bad(field, **{field: row.value})


@pytest.mark.parametrize("model,field,row,route,call_cls", _rows(Informational))
def test_informational_is_accepted(server, model, field, row, route, call_cls):
    value = "user-1" if field == "user" else {"probe": 1}
    assert call_cls(server, route).ok(**{field: value})["choices"]


# ----------------------------------------------------------------------
# Unknown fields are logged as ignored (as upstream), message keys are not
# ----------------------------------------------------------------------


def _log_tail(log_path: Path, start: int) -> str:
    return log_path.read_bytes()[start:].decode(errors="replace")


@pytest.mark.parametrize(
    "path,body",
    [
        ("v1/completions", {"prompt": PROMPT, "max_tokens": 1}),
        ("v1/chat/completions", {"messages": MESSAGES, "max_tokens": 1}),
        ("tokenize", {"prompt": PROMPT}),
        ("tokenize", {"messages": MESSAGES}),
        ("detokenize", {"tokens": [1, 2]}),
    ],
)
def test_unknown_fields_are_logged(server, log_path, path, body):
    start = log_path.stat().st_size
    resp = httpx.post(
        server.url_for(path), json={**body, "guided_json": {}, "zzz_extra": 1}, timeout=30
    )
    assert resp.status_code == 200, resp.text
    line = next((ln for ln in _log_tail(log_path, start).splitlines() if IGNORED_LOG in ln), None)
    assert line is not None and "'guided_json'" in line and "'zzz_extra'" in line, line


def test_nested_unknown_fields_are_logged_message_keys_are_not(server, log_path):
    start = log_path.stat().st_size
    msgs = [{"role": "user", "content": "hi", "extra_field": "0"}]
    resp = httpx.post(
        server.url_for("v1/chat/completions"),
        timeout=30,
        json={
            "messages": msgs,
            "max_tokens": 1,
            "stream": True,
            "stream_options": {"include_usage": True, "nested_extra": 1},
        },
    )
    assert resp.status_code == 200, resp.text
    resp = httpx.post(
        server.url_for("v1/completions"),
        timeout=30,
        json={
            "prompt": PROMPT,
            "max_tokens": 2,
            "structured_outputs": {"choice": ["a", "b"], "so_extra": 1},
        },
    )
    assert resp.status_code == 200, resp.text
    logged = [ln for ln in _log_tail(log_path, start).splitlines() if IGNORED_LOG in ln]
    assert any("'nested_extra'" in ln for ln in logged), logged
    assert any("'so_extra'" in ln for ln in logged), logged
    # Every key of a message reaches the chat template: not ignored, not logged.
    assert not any("extra_field" in ln for ln in logged), logged


def test_known_fields_are_not_logged(server, log_path):
    start = log_path.stat().st_size
    Call(server, "completions").ok(user="u", seed=1)
    assert IGNORED_LOG not in _log_tail(log_path, start)


def test_a_flood_of_unknown_fields_logs_a_bounded_line(server, log_path):
    start = log_path.stat().st_size
    junk = {f"{'k' * 1000}{i}": i for i in range(500)}
    Call(server, "completions").ok(**junk)
    logged = [ln for ln in _log_tail(log_path, start).splitlines() if IGNORED_LOG in ln]
    assert len(logged) == 1 and len(logged[0]) < 2000 and "(484 more)" in logged[0]


# ----------------------------------------------------------------------
# Strict scalars: a string is not a boolean, nor a number
# ----------------------------------------------------------------------


def _strict_scalars(model: type[BaseModel]) -> list[tuple[str, type]]:
    """(field, bool | int | float) for each strict scalar field of `model`."""
    found = []
    for name, info in model.model_fields.items():
        if not any(isinstance(m, Strict) for m in info.metadata):
            continue
        kinds = [
            t
            for t in (bool, int, float)
            if info.annotation is t or t in typing.get_args(info.annotation)
        ]
        found.append((name, kinds[0]))
    return found


WRONG_TYPES = {bool: ["true", "false", 1, 0, "str"], int: ["5", 5.0, True], float: ["0.5"]}
REQUEST_MODELS = [model for model, *_ in TABLES] + [StreamOptions]
STRICT_CASES = [
    pytest.param(model, field, bad, id=f"{model.__name__}.{field}={bad!r}")
    for model in REQUEST_MODELS
    for field, kind in _strict_scalars(model)
    for bad in WRONG_TYPES[kind]
]
BASE_BODIES = {
    CompletionRequest: {"prompt": PROMPT},
    ChatCompletionRequest: {"messages": MESSAGES},
    TokenizeCompletionRequest: {"prompt": PROMPT},
    TokenizeChatRequest: {"messages": MESSAGES},
    DetokenizeRequest: {"tokens": [1]},
    StreamOptions: {},
}


def test_every_scalar_request_field_is_strict():
    for model in REQUEST_MODELS:
        for name, info in model.model_fields.items():
            kinds = {info.annotation, *typing.get_args(info.annotation)} & {bool, int, float}
            strict = any(isinstance(m, Strict) for m in info.metadata)
            assert not kinds or strict, f"{model.__name__}.{name} is not strict"


@pytest.mark.parametrize("model,field,bad", STRICT_CASES)
def test_wrong_scalar_type_is_refused(model, field, bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        model.model_validate({**BASE_BODIES[model], field: bad})
    assert any(err["loc"][:1] == (field,) for err in e.value.errors()), e.value


@pytest.mark.parametrize(
    "constraint,message",
    [
        ({"choice": ["a"], "_backend": "xgrammar"}, "set by the server"),
        ({"choice": ["a"], "_backend_was_auto": True}, "set by the server"),
        ({"choice": ["a"], "disable_fallback": "yes"}, "must be a boolean"),
        ({"json_object": 1}, "must be a boolean"),
    ],
)
def test_structured_outputs_keys_are_checked(constraint, message):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=message):
        CompletionRequest.model_validate({"prompt": PROMPT, "structured_outputs": constraint})


def test_float_fields_take_json_integers():
    assert (
        CompletionRequest.model_validate(
            {"prompt": PROMPT, "temperature": 0, "top_p": 1}
        ).temperature
        == 0.0
    )


@pytest.mark.parametrize(
    "field,value",
    [
        ("stream", "true"),
        ("stream", "str"),
        ("echo", 1),
        ("max_tokens", "5"),
        ("temperature", "0.5"),
    ],
)
def test_wrong_scalar_type_is_a_400_on_the_server(server, field, value):
    resp = Call(server, "completions").post(**{field: value})
    # The param is where pydantic found the error: "body.<field>".
    assert resp.status_code == 400 and resp.json()["error"]["param"] == f"body.{field}", resp.text

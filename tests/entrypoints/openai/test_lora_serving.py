"""LoRA adapters on the OpenAI server (issue 18 item 4): `--lora-modules`
(both forms), adapters in /v1/models with `parent` and `root`, `model:
"<adapter>"` on completions and chat equal to transformers' greedy output of
peft's merged model (float32), several adapters and the base in one batch,
and the runtime routes under VLLM_ALLOW_RUNTIME_LORA_UPDATING behind
--api-key: load, unload (requests in flight finish with their adapter) and the
bad-input matrix (each refused with its status and envelope, nothing loaded,
the server keeps serving).

One server (module-scoped) serves every test but the in-process ones."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import torch
import transformers as tf
from fastapi.testclient import TestClient
from safetensors.torch import save_file

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args
from tests.lora.peft_utils import make_peft_adapter
from tests.utils import TINY_SHAPES, make_tiny_model, model_greedy
from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.entrypoints.openai.serving_models import LoRAModulePath
from vllm.utils.argparse_utils import FlexibleArgumentParser

BASE = "tiny-llama"
KEY = "sk-lora-test"
MAX_TOKENS = 8
PROMPTS = [[5, 17, 42, 99, 7], [300, 12, 8, 250, 33, 61, 4]]
LONG = [(7 * i + 3) % 500 + 1 for i in range(40)]  # over two KV blocks of 16


@dataclass
class Adapters:
    base: str
    paths: dict[str, str]  # name -> peft dir (a1, a2 served at start-up, a3 loaded at run time)
    merged: dict[str, Any]  # name -> transformers model: peft's merge_and_unload()
    expected: dict[str, list[list[int]]]  # name (or BASE) -> greedy tokens per prompt
    bad: dict[str, str]  # what is wrong -> a directory

    def greedy(self, name: str, prompt: list[int], n: int = MAX_TOKENS) -> list[int]:
        return model_greedy(self.merged[name], [prompt], n)[0]


def _unsupported_target_adapter(base_dir: str, out_dir: str) -> None:
    """A peft-format adapter whose target module (`rotary_proj`) the model
    does not have: written by hand, since peft refuses it too."""
    os.makedirs(out_dir)
    config = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["rotary_proj"]}
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump({**config, "base_model_name_or_path": base_dir, "bias": "none"}, f)
    prefix = "base_model.model.model.layers.0.self_attn.rotary_proj"
    tensors = {
        f"{prefix}.lora_A.weight": torch.ones(8, 64),
        f"{prefix}.lora_B.weight": torch.ones(64, 8),
    }
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> Adapters:
    root = tmp_path_factory.mktemp("lora-serving")
    base = make_tiny_model("llama", str(root / "base"))
    expected = {BASE: model_greedy(_load_base(base), PROMPTS, MAX_TOKENS)}
    paths, merged = {}, {}
    for name, r, alpha, rslora, seed in (
        ("a1", 8, 16, False, 1),
        ("a2", 16, 8, True, 2),
        ("a3", 8, 32, False, 3),
    ):
        paths[name] = str(root / name)
        model = make_peft_adapter(
            base, paths[name], r=r, lora_alpha=alpha, use_rslora=rslora, seed=seed
        )
        merged[name] = model.merge_and_unload().eval()
        expected[name] = model_greedy(merged[name], PROMPTS, MAX_TOKENS)
    bad = {"rank": str(root / "rank32"), "targets": str(root / "targets")}
    make_peft_adapter(base, bad["rank"], r=32, lora_alpha=32)
    _unsupported_target_adapter(base, bad["targets"])
    # An adapter for another (narrower) Llama: its tensors do not fit this one.
    other = str(root / "other")
    tf.LlamaForCausalLM(
        tf.LlamaConfig(
            **{**TINY_SHAPES, "hidden_size": 32, "intermediate_size": 64, "vocab_size": 512}
        )
    ).save_pretrained(other)
    bad["base"] = str(root / "other-adapter")
    make_peft_adapter(other, bad["base"], r=8, lora_alpha=16)
    bad["nonpeft"] = str(root / "nonpeft")
    os.makedirs(bad["nonpeft"])
    with open(os.path.join(bad["nonpeft"], "README.md"), "w") as f:
        f.write("not an adapter\n")
    return Adapters(base, paths, merged, expected, bad)


def _load_base(path: str) -> Any:
    return tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def server(adapters, chat_template_file):
    a2 = {"name": "a2", "path": adapters.paths["a2"], "base_model_name": BASE}
    args = default_server_args(chat_template_file) + [
        "--served-model-name", BASE, "--enable-lora", "--max-loras", "2",
        "--max-lora-rank", "16", "--max-cpu-loras", "4",
        "--lora-modules", f"a1={adapters.paths['a1']}", json.dumps(a2), "--api-key", KEY,
    ]  # fmt: skip
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}
    srv = RemoteOpenAIServer(adapters.base, args, env=env, api_key=KEY)
    try:
        yield srv
    finally:
        srv.stop()


def _post(server: RemoteOpenAIServer, path: str, body: dict, **kw) -> httpx.Response:
    headers = kw.pop("headers", server.headers())
    return httpx.post(
        server.url_for(*path.split("/")), json=body, headers=headers, timeout=60, **kw
    )


def _complete(server: RemoteOpenAIServer, model: str, prompt: list[int], **kw) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0.0}
    body |= {"ignore_eos": True, "return_token_ids": True}  # the reference never stops at EOS
    return _post(server, "v1/completions", {**body, **kw})


def _tokens(response: httpx.Response) -> list[int]:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["token_ids"]


def _model_ids(server: RemoteOpenAIServer) -> dict[str, dict]:
    r = httpx.get(server.url_for("v1", "models"), headers=server.headers(), timeout=10)
    assert r.status_code == 200, r.text
    return {card["id"]: card for card in r.json()["data"]}


def _assert_error(response: httpx.Response, status: int, err_type: str, *needles: str) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and error["type"] == err_type, error
    for needle in needles:
        assert needle in error["message"], error


# ---- start-up adapters, /v1/models, outputs ------------------------------------------


def test_models_lists_adapters_with_parent_and_root(server, adapters):
    cards = _model_ids(server)
    assert list(cards) == [BASE, "a1", "a2"]
    assert cards[BASE]["root"] == adapters.base and cards[BASE]["parent"] is None
    for name in ("a1", "a2"):
        assert cards[name]["parent"] == BASE and cards[name]["root"] == adapters.paths[name]


def test_adapter_outputs_equal_peft_merged_model(server, adapters):
    """Six concurrent requests over the base and two adapters (more than the
    engine's --max-loras 2 slots hold with the base): each gets transformers'
    greedy output of its peft-merged model, and names its model."""

    async def run() -> list[tuple[str, int, dict]]:
        async with httpx.AsyncClient(headers=server.headers(), timeout=60) as client:

            async def one(name: str, i: int) -> tuple[str, int, dict]:
                body = {"model": name, "prompt": PROMPTS[i], "max_tokens": MAX_TOKENS,
                        "temperature": 0.0, "ignore_eos": True,
                        "return_token_ids": True}  # fmt: skip
                r = await client.post(server.url_for("v1", "completions"), json=body)
                assert r.status_code == 200, r.text
                return name, i, r.json()

            jobs = [one(n, i) for n in (BASE, "a1", "a2") for i in range(len(PROMPTS))]
            return await asyncio.gather(*jobs)

    for name, i, body in asyncio.run(run()):
        assert body["choices"][0]["token_ids"] == adapters.expected[name][i], (name, i)
        assert body["model"] == name
    # The adapters change the output (random, non-zero B): the test can fail.
    assert len({str(adapters.expected[n]) for n in (BASE, "a1", "a2", "a3")}) == 4


def test_chat_and_stream_use_the_adapter(server, adapters):
    messages = [{"role": "user", "content": "The quick brown fox"}]
    tok = _post(server, "tokenize", {"model": "a2", "messages": messages})
    assert tok.status_code == 200, tok.text
    expected = adapters.greedy("a2", tok.json()["tokens"])
    body = {"model": "a2", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}  # fmt: skip
    r = _post(server, "v1/chat/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "a2" and r.json()["choices"][0]["token_ids"] == expected
    # Streamed: every chunk names the adapter, the tokens are the same.
    streamed: list[int] = []
    with httpx.stream("POST", server.url_for("v1", "chat", "completions"), headers=server.headers(),
                      json={**body, "stream": True}, timeout=60) as s:  # fmt: skip
        for line in s.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                assert chunk["model"] == "a2"
                for choice in chunk["choices"]:
                    streamed += choice.get("token_ids") or []
    assert streamed == expected


def test_unknown_model_is_a_404(server):
    _assert_error(_complete(server, "a9", PROMPTS[0]), 404, "NotFoundError", "`a9` does not exist")


# ---- runtime load / unload ---------------------------------------------------------------


def test_runtime_routes_need_the_api_key(server, adapters):
    body = {"lora_name": "a3", "lora_path": adapters.paths["a3"]}
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = _post(server, "v1/load_lora_adapter", body, headers=headers)
        assert r.status_code == 401
        r = _post(server, "v1/unload_lora_adapter", {"lora_name": "a1"}, headers=headers)
        assert r.status_code == 401
    assert list(_model_ids(server)) == [BASE, "a1", "a2"]


@pytest.mark.parametrize(
    "body,status,err_type,needle",
    [
        ({"lora_name": "x", "lora_path": "/no/such/adapter"}, 404, "NotFoundError",
         "Loading lora x failed: No adapter found for /no/such/adapter"),
        ({"lora_name": "x", "lora_path": "{nonpeft}"}, 404, "NotFoundError", "No adapter found"),
        ({"lora_name": "x", "lora_path": "{rank}"}, 400, "BadRequestError", "max_lora_rank"),
        ({"lora_name": "x", "lora_path": "{targets}"}, 400, "BadRequestError", "rotary_proj"),
        ({"lora_name": "x", "lora_path": "{base}"}, 400, "BadRequestError", "different base model"),
        ({"lora_name": "a1", "lora_path": "{a3}"}, 400, "InvalidUserInput", "already been loaded"),
        ({"lora_name": BASE, "lora_path": "{a3}"}, 400, "InvalidUserInput", "served model name"),
        ({"lora_name": "", "lora_path": "{a3}"}, 400, "InvalidUserInput", "must be provided"),
        ({"lora_name": "x"}, 400, "Bad Request", "lora_path"),
        ({"lora_name": "x", "lora_path": "{a3}", "is_3d_lora_weight": True}, 400,
         "BadRequestError", "is_3d_lora_weight"),
    ],
    ids=["missing-path", "non-peft-dir", "rank-too-big", "unsupported-targets", "base-mismatch",
         "duplicate-name", "served-name", "empty-name", "no-path", "3d-weights"],
)  # fmt: skip
def test_bad_adapter_is_refused_and_nothing_loads(server, adapters, body, status, err_type, needle):
    dirs = {**adapters.bad, "a3": adapters.paths["a3"]}
    body = {k: v.format(**dirs) if isinstance(v, str) else v for k, v in body.items()}
    r = _post(server, "v1/load_lora_adapter", body)
    _assert_error(r, status, err_type, needle)
    assert list(_model_ids(server)) == [BASE, "a1", "a2"]
    # Still serving, the adapters unchanged.
    assert _tokens(_complete(server, "a1", PROMPTS[0])) == adapters.expected["a1"][0]


def test_load_use_and_unload_at_run_time(server, adapters):
    r = _post(
        server, "v1/load_lora_adapter", {"lora_name": "a3", "lora_path": adapters.paths["a3"]}
    )
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a3' added successfully."
    cards = _model_ids(server)
    assert cards["a3"]["parent"] == BASE and cards["a3"]["root"] == adapters.paths["a3"]
    assert _tokens(_complete(server, "a3", PROMPTS[1])) == adapters.expected["a3"][1]
    # A prompt of several KV blocks, cached under a3 (the prefix cache is on).
    assert _tokens(_complete(server, "a3", LONG)) == adapters.greedy("a3", LONG)
    # load_inplace replaces what the name serves: a3 now runs a1's weights,
    # and none of the blocks cached under the old a3 are reused.
    body = {"lora_name": "a3", "lora_path": adapters.paths["a1"], "load_inplace": True}
    assert _post(server, "v1/load_lora_adapter", body).status_code == 200
    assert _tokens(_complete(server, "a3", PROMPTS[1])) == adapters.expected["a1"][1]
    assert _tokens(_complete(server, "a3", LONG)) == adapters.greedy("a1", LONG)
    r = _post(server, "v1/unload_lora_adapter", {"lora_name": "a3"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a3' removed successfully."
    assert "a3" not in _model_ids(server)
    _assert_error(_complete(server, "a3", PROMPTS[0]), 404, "NotFoundError", "does not exist")
    r = _post(server, "v1/unload_lora_adapter", {"lora_name": "a3"})
    _assert_error(r, 404, "NotFoundError", "The lora adapter 'a3' cannot be found.")
    r = _post(server, "v1/unload_lora_adapter", {"lora_name": ""})
    _assert_error(r, 400, "InvalidUserInput", "'lora_name' needs to be provided")
    # Loaded again under the same name: its own weights again (a new id, no stale cache).
    r = _post(
        server, "v1/load_lora_adapter", {"lora_name": "a3", "lora_path": adapters.paths["a3"]}
    )
    assert r.status_code == 200
    assert _tokens(_complete(server, "a3", PROMPTS[1])) == adapters.expected["a3"][1]
    assert _tokens(_complete(server, "a3", LONG)) == adapters.greedy("a3", LONG)
    assert _post(server, "v1/unload_lora_adapter", {"lora_name": "a3"}).status_code == 200


def test_load_and_unload_while_a_request_decodes(server, adapters):
    """A stream under a2 is decoding when a4 (a3's weights) is loaded and a2
    unloaded: the stream's tokens are a2's solo output, token for token; a
    request arriving afterwards gets a 404 for a2 and a3's output under a4.
    (48 tokens: the engine is still decoding when the routes answer.)"""
    n = 48
    expected = adapters.greedy("a2", PROMPTS[0], n)
    body = {"model": "a2", "prompt": PROMPTS[0], "max_tokens": n, "temperature": 0.0,
            "ignore_eos": True, "stream": True, "return_token_ids": True}  # fmt: skip
    streamed: list[int] = []
    changed_at = None
    with httpx.stream("POST", server.url_for("v1", "completions"), headers=server.headers(),
                      json=body, timeout=60) as s:  # fmt: skip
        for line in s.iter_lines():
            if not line.startswith("data: {"):
                continue
            streamed += json.loads(line[6:])["choices"][0].get("token_ids") or []
            if streamed and changed_at is None:
                changed_at = len(streamed)
                load = {"lora_name": "a4", "lora_path": adapters.paths["a3"]}
                r = _post(server, "v1/load_lora_adapter", load)
                assert r.status_code == 200, r.text
                r = _post(server, "v1/unload_lora_adapter", {"lora_name": "a2"})
                assert r.status_code == 200, r.text
    assert changed_at is not None and changed_at < n, "the stream ended before the change"
    assert streamed == expected
    _assert_error(_complete(server, "a2", PROMPTS[0]), 404, "NotFoundError", "does not exist")
    assert _tokens(_complete(server, "a4", PROMPTS[0])) == adapters.expected["a3"][0]
    # Back as before (the module's other tests may run after this one).
    assert _post(server, "v1/unload_lora_adapter", {"lora_name": "a4"}).status_code == 200
    body = {"lora_name": "a2", "lora_path": adapters.paths["a2"]}
    assert _post(server, "v1/load_lora_adapter", body).status_code == 200
    assert _tokens(_complete(server, "a2", PROMPTS[0])) == adapters.expected["a2"][0]


# ---- in process: flags and the gate ----------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    return make_arg_parser(FlexibleArgumentParser()).parse_args(list(argv))


def test_lora_modules_flag_forms_and_refusals(capsys):
    entry = {"name": "b", "path": "/p/b", "base_model_name": "m"}
    args = _parse("--enable-lora", "--served-model-name", "m", "n", "--lora-modules", "a=/p/a",
                  json.dumps(entry), json.dumps([{"name": "c", "path": "/p/c"}]))  # fmt: skip
    assert args.lora_modules == [
        LoRAModulePath("a", "/p/a"),
        LoRAModulePath("b", "/p/b", base_model_name="m"),
        LoRAModulePath("c", "/p/c"),
    ]
    validate_parsed_serve_args(args)
    for bad, message in (
        ("=x", "expected name=path"),
        ("{not json", "Invalid JSON format for --lora-modules"),
        ('{"name": "b"}', "Invalid fields for --lora-modules"),
        ('{"name": "b", "path": 3}', "bad value of 'path'"),
        ('{"name": "b", "path": "/p", "rank": 8}', "unexpected keyword argument 'rank'"),
    ):
        with pytest.raises(SystemExit):
            _parse("--lora-modules", bad)
        assert message in capsys.readouterr().err
    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        validate_parsed_serve_args(_parse("--lora-modules", "a=/p/a"))
    with pytest.raises(ValueError, match="adapter name 'a' is given twice"):
        validate_parsed_serve_args(_parse("--enable-lora", "--lora-modules", "a=/p", "a=/q"))
    with pytest.raises(ValueError, match="adapter name 'm' is a served model name"):
        validate_parsed_serve_args(
            _parse("--enable-lora", "--served-model-name", "m", "--lora-modules", "m=/p")
        )
    entry["base_model_name"] = "other"
    with pytest.raises(ValueError, match="base_model_name 'other' of adapter 'b' is not a served"):
        validate_parsed_serve_args(_parse("--enable-lora", "--lora-modules", json.dumps(entry)))


def test_runtime_routes_exist_only_with_the_gate(monkeypatch):
    """Off (unset, "0", ""): the routes do not exist, a 404 in the envelope as
    any unknown path; on ("1", "true"): they do (a body without lora_path is
    then the route's 400). No engine is needed for either answer."""
    from vllm.entrypoints.openai.api_server import build_app

    for value, present in (("0", False), ("", False), ("true", True), ("1", True)):
        monkeypatch.setenv("VLLM_ALLOW_RUNTIME_LORA_UPDATING", value)
        client = TestClient(build_app(_parse()))
        for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            r = client.post(path, json={})
            assert r.status_code == (400 if present else 404), (value, path, r.text)
            assert r.json()["error"]["code"] == r.status_code
            assert ("lora_name" in r.json()["error"]["message"]) is present

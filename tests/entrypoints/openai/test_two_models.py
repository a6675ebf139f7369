"""Two models, one server (issue 17 item 5, beyond upstream): `vllm serve GEN
--embedding-model EMB` on a tiny Llama and a tiny BERT sentence-transformers
directory, each in its own engine-core process.

Checked: /v1/models lists both with their tasks; 16 concurrent greedy chats
and 16 concurrent embeddings at once, the chats equal to transformers'
generate (token ids) and the embeddings to SentenceTransformer (cosine >=
0.9999); a model named on the other's route is a 400, an unknown one a 404;
SIGKILL of the embedding engine core turns /health to 503 (keep-alive: chat
still served) and shutdown leaves no process; without keep-alive the server
exits on its own (a Qwen3 last-token embedder there, with its own KV budget
and pooler config). Flag refusals are checked on the parser, in process."""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
import psutil
import pytest
import torch

from tests.entrypoints.openai.conftest import RemoteOpenAIServer, default_server_args, wait_exited
from tests.models.test_encoder_pooling import TEXTS, _st_dir

GEN, EMB = "gen", "emb"
NUM_CONCURRENT = 16
MAX_TOKENS = 8
# The embedding model's own template (given inline); GEN's is CHAT_TEMPLATE.
EMB_TEMPLATE = "{% for m in messages %}query: {{ m['content'] }}{% endfor %}"
# The watchdog (5 s period) stops the server this soon after the kill.
EXIT_DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory) -> str:
    return _st_dir("bert", tmp_path_factory.mktemp("two-models"))


def _server_args(st_dir: str, chat_template_file: str) -> list[str]:
    return default_server_args(chat_template_file) + [
        "--served-model-name",
        GEN,
        "--embedding-model",
        st_dir,
        "--embedding-served-model-name",
        EMB,
        "--embedding-dtype",
        "float32",
        "--embedding-max-model-len",
        "64",
        "--embedding-chat-template",
        EMB_TEMPLATE,
    ]


@pytest.fixture(scope="module")
def server(tiny_model_dir, st_dir, chat_template_file):
    srv = RemoteOpenAIServer(
        tiny_model_dir("llama"),
        _server_args(st_dir, chat_template_file),
        env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"},
    )
    try:
        yield srv
    finally:
        srv.stop()


def _messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"question number {i}: where is paris ?"}]


def _engine_cores(server: RemoteOpenAIServer) -> list[psutil.Process]:
    """[main engine core, embedding engine core] (the second starts later)."""
    procs = sorted(server.engine_processes(), key=lambda p: p.create_time())
    assert len(procs) == 2, procs
    return procs


def test_models_lists_both_with_tasks(server, tiny_model_dir, st_dir):
    cards = {c["id"]: c for c in httpx.get(server.url_for("v1/models")).json()["data"]}
    assert list(cards) == [GEN, EMB]
    assert cards[GEN]["supported_tasks"] == ["generate"]
    assert "embed" in cards[EMB]["supported_tasks"]
    assert "generate" not in cards[EMB]["supported_tasks"]
    assert cards[GEN]["root"] == tiny_model_dir("llama") and cards[EMB]["root"] == st_dir
    assert cards[EMB]["max_model_len"] == 64
    # The openai client reads the listing (the extra field is kept as extra).
    assert [m.id for m in server.get_client().models.list().data] == [GEN, EMB]


def _hf_greedy(model_dir: str, prompt_ids: list[int]) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    out = model.generate(
        torch.tensor([prompt_ids]),
        max_new_tokens=MAX_TOKENS,
        min_new_tokens=MAX_TOKENS,
        do_sample=False,
    )
    return out[0, len(prompt_ids) :].tolist()


async def _chat(client, i: int) -> list[int]:
    out = await client.chat.completions.create(
        model=GEN,
        messages=_messages(i),
        max_tokens=MAX_TOKENS,
        temperature=0.0,
        logprobs=True,
        extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
    )
    # With return_tokens_as_token_ids each token reads "token_id:<id>".
    return [int(t.token.split(":", 1)[1]) for t in out.choices[0].logprobs.content]


async def _embed(client, i: int) -> list[float]:
    out = await client.embeddings.create(model=EMB, input=TEXTS[i % len(TEXTS)])
    return out.data[0].embedding


def test_concurrent_chat_and_embeddings_match_references(server, tiny_model_dir, st_dir):
    from sentence_transformers import SentenceTransformer

    async def run() -> tuple[list, list]:
        client = server.get_async_client(timeout=120)
        chats = [_chat(client, i) for i in range(NUM_CONCURRENT)]
        embeds = [_embed(client, i) for i in range(NUM_CONCURRENT)]
        results = await asyncio.gather(*chats, *embeds)
        return list(results[:NUM_CONCURRENT]), list(results[NUM_CONCURRENT:])

    chat_ids, vectors = asyncio.run(run())
    model_dir = tiny_model_dir("llama")
    for i in (0, 7, 15):
        body = {"model": GEN, "messages": _messages(i), "add_generation_prompt": True}
        prompt_ids = httpx.post(server.url_for("tokenize"), json=body).json()["tokens"]
        assert chat_ids[i] == _hf_greedy(model_dir, prompt_ids), i
    ref = SentenceTransformer(st_dir, device="cpu").encode(TEXTS, convert_to_tensor=True)
    expected = torch.stack([ref[i % len(TEXTS)] for i in range(NUM_CONCURRENT)]).float()
    cos = torch.nn.functional.cosine_similarity(torch.tensor(vectors), expected, dim=-1)
    assert bool((cos >= 0.9999).all()), cos


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url_for(*path.split("/")), json=body, timeout=60)


def test_wrong_model_for_the_route(server):
    cases = [
        ("v1/embeddings", {"model": GEN, "input": "paris"}, GEN),
        ("pooling", {"model": GEN, "input": "paris"}, GEN),
        ("score", {"model": GEN, "text_1": "paris", "text_2": "france"}, GEN),
        ("v1/chat/completions", {"model": EMB, "messages": _messages(0)}, EMB),
        ("v1/completions", {"model": EMB, "prompt": "paris"}, EMB),
        ("tokenize", {"model": EMB, "prompt": "paris"}, EMB),
    ]
    for path, body, model in cases:
        r = _post(server, path, body)
        error = r.json()["error"]
        assert r.status_code == 400 and error["type"] == "BadRequestError", (path, r.text)
        assert error["param"] == "model"
        assert f"`{model}` does not support this API" in error["message"], error
    for path, body, _ in cases[:3]:
        r = _post(server, path, {**body, "model": "nope"})
        assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"]
    # No model: each route takes its own engine's.
    r = _post(server, "v1/embeddings", {"input": "paris"})
    assert r.status_code == 200 and r.json()["model"] == EMB
    r = _post(server, "v1/completions", {"prompt": "paris", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == GEN
    # /score (an embedding model's cosine) is served on EMB's engine too.
    r = _post(server, "score", {"text_1": "paris", "text_2": "france"})
    assert r.status_code == 200 and r.json()["model"] == EMB, r.text


def test_embedding_messages_use_its_own_template(server):
    """`messages` on EMB's routes render with --embedding-chat-template, not
    GEN's --chat-template (special tokens left to the template)."""

    def embed(body: dict) -> torch.Tensor:
        r = _post(server, "v1/embeddings", {"model": EMB, **body})
        assert r.status_code == 200, r.text
        return torch.tensor(r.json()["data"][0]["embedding"])

    by_messages = embed({"messages": [{"role": "user", "content": "where is paris ?"}]})
    own = embed({"input": "query: where is paris ?", "add_special_tokens": False})
    gens = embed({"input": "<|user|>where is paris ?\n", "add_special_tokens": False})
    torch.testing.assert_close(by_messages, own, atol=1e-6, rtol=0)
    assert not torch.allclose(by_messages, gens, atol=1e-3)


def test_embedding_engine_death_then_shutdown(server):
    """Last in the module: it kills the embedding engine of the shared server."""
    main_core, embed_core = _engine_cores(server)
    assert httpx.get(server.url_for("health")).status_code == 200
    embed_core.kill()
    deadline = time.monotonic() + 15
    while httpx.get(server.url_for("health")).status_code != 503:
        assert time.monotonic() < deadline, "/health still 200 after the kill"
        time.sleep(0.2)
    r = _post(server, "v1/embeddings", {"model": EMB, "input": "paris"})
    assert r.status_code == 500 and r.json()["error"]["type"] == "InternalServerError"
    # Keep-alive: the generative engine still serves.
    r = _post(server, "v1/completions", {"model": GEN, "prompt": "paris", "max_tokens": 2})
    assert r.status_code == 200, r.text
    assert main_core.is_running()
    tree = server.children()
    server.stop()
    wait_exited(tree)


def test_decoder_embedder_own_budget_and_exit_on_death(
    tiny_model_dir, chat_template_file, tmp_path
):
    """A decoder embedder (Qwen3, last-token pooling: it keeps a KV cache)
    with its own KV budget and pooler config; its engine's death stops the
    server (no keep-alive) and every process exits."""
    from sentence_transformers import SentenceTransformer

    from tests.models.language.pooling.st_utils import make_st_dir

    qwen3_st = make_st_dir("qwen3", str(tmp_path / "qwen3-st"), "lasttoken")
    args = _server_args(qwen3_st, chat_template_file)
    args += ["--embedding-kv-cache-memory-bytes", "16M"]
    args += ["--embedding-pooler-config", '{"use_activation": false}']
    log = tmp_path / "server.log"
    server = RemoteOpenAIServer(tiny_model_dir("llama"), args, log_path=str(log))
    try:
        vec = torch.tensor(
            _post(server, "v1/embeddings", {"input": TEXTS[1]}).json()["data"][0]["embedding"]
        )
        ref = SentenceTransformer(qwen3_st, device="cpu").encode(TEXTS[1], convert_to_tensor=True)
        assert torch.nn.functional.cosine_similarity(vec, ref.float(), dim=0) >= 0.9999
        assert abs(float(vec.norm()) - 1.0) > 1e-3  # use_activation: false reached its pooler
        # Each engine sized its own KV cache: 64 MiB (GEN), 16 MiB (EMB).
        budgets = [
            line.split("CPU KV cache space: ", 1)[1].split(" GiB", 1)[0]
            for line in log.read_text().splitlines()
            if "CPU KV cache space" in line
        ]
        assert sorted(budgets) == ["0.02", "0.06"], budgets
        tree = server.children()
        _engine_cores(server)[1].kill()
        server.proc.wait(EXIT_DEADLINE_S)
        wait_exited(tree)
    finally:
        server.stop()


def _parse(argv: list[str]) -> argparse.Namespace:
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args

    args = make_arg_parser(argparse.ArgumentParser()).parse_args(argv)
    validate_parsed_serve_args(args)
    return args


@pytest.mark.parametrize(
    "argv, message",
    [
        (["gen", "--embedding-dtype", "float32"], "--embedding-dtype needs --embedding-model"),
        (["gen", "--embedding-chat-template", "t"], "--embedding-chat-template needs"),
        (
            ["gen", "--embedding-model", "e", "--tensor-parallel-size", "2"],
            "not supported with --tensor-parallel-size 2",
        ),
        (
            ["gen", "--embedding-model", "e", "--data-parallel-size", "2"],
            "not supported with --data-parallel-size 2",
        ),
        (["gen", "--embedding-model", "e", "--runner", "pooling"], "generative main model"),
        (["m", "--embedding-model", "m"], "both served as ['m']"),
        (
            [
                "g",
                "--served-model-name",
                "x",
                "--embedding-model",
                "e",
                "--embedding-served-model-name",
                "x",
            ],
            "both served as ['x']",
        ),
    ],
)
def test_refused_flag_combinations(argv, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _parse(argv)


def test_embedding_engine_args():
    from vllm.entrypoints.openai.embedding_model import embedding_engine_args

    args = _parse(
        ["gen", "--dtype", "bfloat16", "--max-model-len", "512", "--kv-cache-memory-bytes", "1G"]
        + ["--embedding-model", "e", "--embedding-kv-cache-memory-bytes", "2M"]
        + ["--embedding-max-num-seqs", "4"]
        + ["--embedding-pooler-config", '{"use_activation": false}']
    )
    engine_args = embedding_engine_args(args)
    assert engine_args.model == "e" and engine_args.runner == "pooling"
    # Main-model flags stay with the main model; the embedding-* ones apply.
    assert engine_args.dtype == "auto" and engine_args.max_model_len is None
    assert engine_args.kv_cache_memory_bytes == 2 * 2**20
    assert engine_args.max_num_seqs == 4
    assert engine_args.pooler_config == {"use_activation": False}


def test_pooling_main_model_refused_before_any_engine_starts(st_dir):
    """A main model that resolves to the pooling runner (here by its
    modules.json, no --runner flag): refused from its config, no engine."""
    from vllm.entrypoints.openai.api_server import build_async_engine_client

    args = _parse([st_dir, "--embedding-model", st_dir, "--embedding-served-model-name", EMB])

    async def enter() -> None:
        async with build_async_engine_client(args):
            pytest.fail("an engine started")

    children = psutil.Process().children(recursive=True)
    with pytest.raises(ValueError, match="needs a generative main model.*runner 'pooling'"):
        asyncio.run(enter())
    assert psutil.Process().children(recursive=True) == children


def test_embedding_gpu_fraction_refused_on_cpu(st_dir):
    """The engine's own CPU refusal, prefixed with the flag's engine, before
    the embedding engine starts."""
    from vllm.entrypoints.openai.embedding_model import build_embedding_engine_client

    argv = ["gen", "--embedding-model", st_dir, "--embedding-gpu-memory-utilization", "0.1"]
    args = _parse(argv)

    async def enter() -> None:
        async with build_embedding_engine_client(args):
            pytest.fail("an engine started")

    with pytest.raises(ValueError, match=f"--embedding-model {st_dir}: .*no effect on CPU"):
        asyncio.run(enter())

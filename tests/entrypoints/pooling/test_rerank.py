"""`/score` and `/rerank` of an embedding model (a bi-encoder): a real
`vllm serve --runner pooling` subprocess on a tiny BERT sentence-transformers
directory (mean pooling + Normalize). A pair's score is the cosine of the
two texts' SentenceTransformer.encode vectors (1e-5 absolute, float32), a
single query embedded once for all documents; rerank returns the documents
by that cosine, the best top_n. The routes exist only for models with task
"score" or "embed" (upstream's rule): a generative model gets 404."""

from __future__ import annotations

import argparse

import httpx
import pytest
import torch

from tests.entrypoints.openai.conftest import RemoteOpenAIServer
from tests.models.test_encoder_pooling import DOCS, QUERY, TEXTS, _st_dir

MAX_LEN = 64
ROUTES = ["/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank"]


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory) -> str:
    return _st_dir("bert", tmp_path_factory.mktemp("rerank"))


@pytest.fixture(scope="module")
def server(st_dir):
    args = ["--runner", "pooling", "--dtype", "float32", "--max-model-len", str(MAX_LEN)]
    srv = RemoteOpenAIServer(st_dir, args)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def encode(st_dir):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(st_dir, device="cpu")
    return lambda texts: model.encode(texts, convert_to_tensor=True).float()


def _cosines(encode, firsts: list[str], seconds: list[str]) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(encode(firsts), encode(seconds), dim=-1)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url_for(path), json=body, timeout=60)


def _scores(res: httpx.Response) -> torch.Tensor:
    assert res.status_code == 200, res.text
    return torch.tensor([d["score"] for d in res.json()["data"]])


def test_score_is_cosine_of_sentence_transformers(server, encode, st_dir):
    from transformers import AutoTokenizer

    expected = _cosines(encode, [QUERY] * len(DOCS), DOCS)
    one_to_many = _post(server, "score", {"queries": QUERY, "documents": DOCS})
    torch.testing.assert_close(_scores(one_to_many), expected, atol=1e-5, rtol=0)
    # Each text encoded alone (no pair encoding); as upstream, a pair's
    # usage is its two texts' tokens and one pad token between them.
    tok = AutoTokenizer.from_pretrained(st_dir)
    n_query = len(tok(QUERY)["input_ids"])
    pair_tokens = sum(n_query + 1 + len(tok(d)["input_ids"]) for d in DOCS)
    assert one_to_many.json()["usage"]["prompt_tokens"] == pair_tokens
    pairs = _post(server, "v1/score", {"text_1": TEXTS[:3], "text_2": DOCS[:3]})
    torch.testing.assert_close(
        _scores(pairs), _cosines(encode, TEXTS[:3], DOCS[:3]), atol=1e-5, rtol=0
    )


def test_max_tokens_per_query(server, encode, st_dir):
    """The query's first 3 content tokens (cut at a character boundary)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(st_dir)
    offsets = tok(QUERY, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    query = QUERY[: offsets[2][1]]
    body = {"queries": QUERY, "documents": DOCS, "max_tokens_per_query": 3}
    expected = _cosines(encode, [query] * len(DOCS), DOCS)
    torch.testing.assert_close(_scores(_post(server, "score", body)), expected, atol=1e-5, rtol=0)


def test_rerank_orders_by_cosine(server, encode):
    expected = _cosines(encode, [QUERY] * len(DOCS), DOCS)
    order = expected.argsort(descending=True).tolist()
    res = _post(server, "v2/rerank", {"query": QUERY, "documents": DOCS, "top_n": 3})
    assert res.status_code == 200, res.text
    results = res.json()["results"]
    assert [r["index"] for r in results] == order[:3]
    assert [r["document"]["text"] for r in results] == [DOCS[i] for i in order[:3]]
    got = torch.tensor([r["relevance_score"] for r in results])
    torch.testing.assert_close(got, expected[order[:3]], atol=1e-5, rtol=0)
    every = _post(server, "rerank", {"query": QUERY, "documents": DOCS}).json()["results"]
    assert [r["index"] for r in every] == order


def test_bad_inputs_keep_serving(server, encode):
    for body, word in [
        ({"text_1": QUERY, "text_2": []}, "text_pair"),
        ({"text_1": QUERY, "text_2": "keys and values " * 40}, "maximum context length"),
    ]:
        res = _post(server, "score", body)
        assert res.status_code == 400 and word in res.json()["error"]["message"], res.text
    # As upstream v0.28 `use_activation` is also the embed task's option (its
    # normalisation): accepted, and the cosine does not depend on it.
    raw = _post(server, "score", {"text_1": QUERY, "text_2": DOCS[0], "use_activation": False})
    torch.testing.assert_close(_scores(raw), _cosines(encode, [QUERY], DOCS[:1]), atol=1e-5, rtol=0)
    ok = _post(server, "score", {"text_1": QUERY, "text_2": DOCS[0]})
    torch.testing.assert_close(_scores(ok), _cosines(encode, [QUERY], DOCS[:1]), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "tasks, served",
    [(("generate",), False), (("classify", "score"), True), (("embed", "token_embed"), True)],
)
def test_routes_only_for_score_or_embed_models(tasks, served):
    """No engine needed to see which routes a model's tasks register."""
    from fastapi.testclient import TestClient

    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser

    args = make_arg_parser(argparse.ArgumentParser()).parse_args([])
    client = TestClient(build_app(args, tasks))
    paths = client.get("/openapi.json").json()["paths"]
    assert all((route in paths) is served for route in ROUTES), paths.keys()
    if not served:
        res = client.post("/rerank", json={"query": "a", "documents": ["b"]})
        assert res.status_code == 404 and res.json()["error"]["code"] == 404

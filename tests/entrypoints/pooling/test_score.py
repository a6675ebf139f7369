"""`/score` and `/rerank` (+ /v1/score, /v1/rerank, /v2/rerank) of a real
`vllm serve --runner pooling` subprocess on a tiny one-label BERT
cross-encoder: each pair's score is the sigmoid of transformers'
BertForSequenceClassification logit on the tokenizer's pair encoding
(segment ids 0 / 1; 1e-5 absolute, float32 both sides), 1:1, 1:N and N:N,
under each of upstream's field spellings; rerank orders the documents as the
reference's scores do and keeps the best top_n. Bad inputs get the error
envelope and the server keeps serving; --api-key guards the routes."""

from __future__ import annotations

import httpx
import pytest
import torch
import transformers as tf

from tests.entrypoints.openai.conftest import RemoteOpenAIServer
from tests.models.test_encoder_pooling import DOCS, QUERY, TEXTS, _with_tokenizer

MAX_LEN = 64
API_KEY = "score-key"
LONG = "keys and values " * 40  # > MAX_LEN tokens


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("score")
    return _with_tokenizer("bert-cls", str(root / "bert-ce"), num_labels=1)


@pytest.fixture(scope="module")
def server(model_dir):
    args = ["--runner", "pooling", "--dtype", "float32", "--max-model-len", str(MAX_LEN)]
    srv = RemoteOpenAIServer(model_dir, [*args, "--api-key", API_KEY], api_key=API_KEY)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def hf_model(model_dir):
    model = tf.BertForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    return model.eval(), tf.AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def reference(hf_model):
    """logit(text_1, text_2, **tokenizer kwargs) of transformers' model."""
    model, tok = hf_model

    def logits(pairs: list[tuple[str, str]], **kwargs) -> torch.Tensor:
        with torch.no_grad():
            rows = [
                model(**tok(a, b, return_tensors="pt", **kwargs)).logits[0, 0] for a, b in pairs
            ]
        return torch.stack(rows)

    return logits


def _post(server, path: str, body: dict, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url_for(path), json=body, headers=headers, timeout=60)


def _scores(res: httpx.Response) -> torch.Tensor:
    assert res.status_code == 200, res.text
    data = res.json()["data"]
    assert [d["index"] for d in data] == list(range(len(data)))
    assert all(d["object"] == "score" for d in data)
    return torch.tensor([d["score"] for d in data])


@pytest.mark.parametrize(
    "side_1, side_2",
    [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")],
)
def test_one_to_many_matches_transformers(server, reference, side_1, side_2):
    res = _post(server, "score", {side_1: QUERY, side_2: DOCS})
    expected = reference([(QUERY, d) for d in DOCS]).sigmoid()
    torch.testing.assert_close(_scores(res), expected, atol=1e-5, rtol=0)
    body = res.json()
    assert body["object"] == "list" and body["id"].startswith("score-")
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 4 * len(DOCS)


def test_pairs_and_raw_logits(server, reference):
    firsts, seconds = TEXTS[:3], DOCS[:3]
    expected = reference(list(zip(firsts, seconds)))
    pairs = _post(server, "v1/score", {"text_1": firsts, "text_2": seconds})
    torch.testing.assert_close(_scores(pairs), expected.sigmoid(), atol=1e-5, rtol=0)
    one = _post(server, "score", {"text_1": [QUERY], "text_2": DOCS[0]})
    torch.testing.assert_close(
        _scores(one), reference([(QUERY, DOCS[0])]).sigmoid(), atol=1e-5, rtol=0
    )
    raw = _post(server, "score", {"text_1": firsts, "text_2": seconds, "use_activation": False})
    torch.testing.assert_close(_scores(raw), expected, atol=1e-5, rtol=0)


def test_truncation_is_the_tokenizers(server, reference):
    err = _post(server, "score", {"text_1": QUERY, "text_2": LONG})
    assert err.status_code == 400 and "maximum context length" in err.json()["error"]["message"]
    ok = _post(server, "score", {"text_1": QUERY, "text_2": LONG, "truncate_prompt_tokens": 16})
    assert ok.json()["usage"]["prompt_tokens"] == 16
    expected = reference([(QUERY, LONG)], truncation=True, max_length=16).sigmoid()
    torch.testing.assert_close(_scores(ok), expected, atol=1e-5, rtol=0)
    too_big = _post(server, "score", {"text_1": "a", "text_2": "b", "truncate_prompt_tokens": 65})
    assert too_big.status_code == 400


def test_truncation_side_left_keeps_the_pairs_end(server, hf_model):
    """truncation_side "left": the encoded pair's last 16 tokens, with their
    own segment ids (all of the document's: 1)."""
    model, tok = hf_model
    enc = tok(QUERY, LONG, return_tensors="pt")
    with torch.no_grad():
        logit = model(
            input_ids=enc["input_ids"][:, -16:], token_type_ids=enc["token_type_ids"][:, -16:]
        ).logits[0, 0]
    body = {"text_1": QUERY, "text_2": LONG, "truncate_prompt_tokens": 16}
    res = _post(server, "score", {**body, "truncation_side": "left"})
    torch.testing.assert_close(_scores(res), logit.sigmoid().reshape(1), atol=1e-5, rtol=0)
    assert res.json()["usage"]["prompt_tokens"] == 16


def test_max_tokens_per_doc_cuts_only_the_document(server, reference, model_dir):
    """The document's first 8 content tokens (cut at a character boundary),
    the query whole: equal to transformers on those two texts."""
    tok = tf.AutoTokenizer.from_pretrained(model_dir)
    offsets = tok(LONG, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    doc = LONG[: offsets[7][1]]
    res = _post(server, "score", {"text_1": QUERY, "text_2": LONG, "max_tokens_per_doc": 8})
    expected = reference([(QUERY, doc)]).sigmoid()
    torch.testing.assert_close(_scores(res), expected, atol=1e-5, rtol=0)
    n_query = len(tok(QUERY, add_special_tokens=False)["input_ids"])
    assert res.json()["usage"]["prompt_tokens"] == n_query + 8 + 3  # [CLS] q [SEP] d [SEP]


@pytest.mark.parametrize("path", ["rerank", "v1/rerank", "v2/rerank"])
def test_rerank_orders_by_reference(server, reference, path):
    expected = reference([(QUERY, d) for d in DOCS]).sigmoid()
    order = expected.argsort(descending=True).tolist()
    res = _post(server, path, {"query": QUERY, "documents": DOCS})
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["id"].startswith("score-") and body["usage"]["total_tokens"] > 4 * len(DOCS)
    results = body["results"]
    assert [r["index"] for r in results] == order
    assert [r["document"]["text"] for r in results] == [DOCS[i] for i in order]
    got = torch.tensor([r["relevance_score"] for r in results])
    torch.testing.assert_close(got, expected[order], atol=1e-5, rtol=0)
    top = _post(server, path, {"query": QUERY, "documents": DOCS, "top_n": 2}).json()
    assert [r["index"] for r in top["results"]] == order[:2]
    # top_n 0 (or past the end): every document.
    every = _post(server, path, {"query": QUERY, "documents": DOCS, "top_n": 0}).json()
    assert len(every["results"]) == len(DOCS)


@pytest.mark.parametrize(
    "path, body, word",
    [
        ("score", {"text_1": QUERY, "text_2": []}, "text_pair"),
        ("score", {"text_1": [], "text_2": DOCS}, "text element"),
        ("score", {"text_1": ["a", "b"], "text_2": DOCS}, "1:N or N:N"),
        ("score", {"text_1": QUERY}, None),
        ("score", {"text_1": QUERY, "text_2": 3}, None),
        ("rerank", {"query": QUERY, "documents": []}, "text_pair"),
        ("rerank", {"query": QUERY, "documents": [LONG]}, "maximum context length"),
        ("rerank", {"query": QUERY, "documents": DOCS, "top_n": "2"}, None),
        ("rerank", {"query": QUERY, "documents": DOCS, "top_n": -1}, None),
        ("score", {"text_1": QUERY, "text_2": DOCS, "max_tokens_per_doc": 64}, "less than"),
        ("score", {"text_1": QUERY, "text_2": DOCS, "max_tokens_per_query": -1}, "non-negative"),
        ("score", {"text_1": QUERY, "text_2": DOCS, "instruction": "rank"}, "instruction"),
        ("rerank", {"query": QUERY, "documents": DOCS, "model": "nope"}, "does not exist"),
    ],
)
def test_bad_inputs_get_the_envelope(server, reference, path, body, word):
    res = _post(server, path, body)
    assert res.status_code == (404 if "model" in body else 400), res.text
    error = res.json()["error"]
    assert error["code"] == res.status_code
    if word:
        assert word in error["message"], error
    # Still serving.
    ok = _post(server, "score", {"text_1": QUERY, "text_2": DOCS[0]})
    torch.testing.assert_close(
        _scores(ok), reference([(QUERY, DOCS[0])]).sigmoid(), atol=1e-5, rtol=0
    )


def test_classifier_without_one_label_gets_501(monkeypatch):
    """A classifier with more labels registers the routes (its tasks say
    "score") but has no handler: upstream's 501 on every path, no engine
    needed. The older /v1 paths (same handlers) ask the client to move:
    every /v1/score call warns, /v1/rerank warns once (as upstream)."""
    import argparse

    from fastapi.testclient import TestClient

    from vllm.entrypoints.openai.api_server import build_app
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.entrypoints.pooling.scoring import api_router

    warned: list[tuple[str, str]] = []
    for kind in ("warning", "warning_once"):
        monkeypatch.setattr(
            api_router.logger, kind, lambda msg, *a, k=kind: warned.append((k, msg))
        )
    args = make_arg_parser(argparse.ArgumentParser()).parse_args([])
    client = TestClient(build_app(args, ("classify", "score")))
    for path in ("score", "v1/score", "rerank", "v1/rerank", "v2/rerank"):
        api, body = (
            ("Score API", {"text_1": "a", "text_2": "b"})
            if path.endswith("score")
            else ("Rerank (Score) API", {"query": "a", "documents": ["b"]})
        )
        for _ in range(2):
            res = client.post(f"/{path}", json=body)
            assert res.status_code == 501, (path, res.text)
            assert res.json()["error"]["message"] == f"The model does not support {api}"
    assert [(k, m.split("`")[1]) for k, m in warned] == [
        ("warning", "/score"),
        ("warning", "/score"),
        ("warning_once", "/rerank"),
        ("warning_once", "/rerank"),
    ]


def test_api_key_guards_the_routes(server):
    for path, body in [
        ("score", {"text_1": "a", "text_2": "b"}),
        ("v2/rerank", {"query": "a", "documents": ["b"]}),
    ]:
        assert _post(server, path, body, key=None).status_code == 401
        assert _post(server, path, body, key="wrong").status_code == 401


def test_offline_score_shares_the_pairing(model_dir, reference, monkeypatch):
    """LLM.score runs the same helpers: N:N pairs, the tokenizer's own pair
    truncation ([CLS] kept, longest segment cut first), max_tokens_per_doc
    from pooling_params.extra_kwargs, and chat_template (score templates,
    not built) refused by name."""
    from vllm import LLM

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine core in process
    llm = LLM(model_dir, runner="pooling", dtype="float32", max_model_len=MAX_LEN)
    try:
        pairs = llm.score(TEXTS[:3], DOCS[:3], use_tqdm=False)
        expected = reference(list(zip(TEXTS[:3], DOCS[:3]))).sigmoid()
        got = torch.tensor([o.outputs.score for o in pairs])
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        truncation = {"truncation": True, "max_length": 16}
        cut = llm.score(QUERY, LONG, tokenization_kwargs=truncation, use_tqdm=False)[0]
        assert len(cut.prompt_token_ids) == 16
        expected = reference([(QUERY, LONG)], truncation=True, max_length=16).sigmoid()
        torch.testing.assert_close(torch.tensor([cut.outputs.score]), expected, atol=1e-5, rtol=0)
        # max_tokens_per_doc rides in pooling_params.extra_kwargs (upstream v0.28).
        from vllm import PoolingParams

        offsets = llm.get_tokenizer()(LONG, add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        params = PoolingParams(extra_kwargs={"max_tokens_per_doc": 8})
        doc_cut = llm.score(QUERY, LONG, pooling_params=params, use_tqdm=False)[0]
        expected = reference([(QUERY, LONG[: offsets[7][1]])]).sigmoid()
        torch.testing.assert_close(
            torch.tensor([doc_cut.outputs.score]), expected, atol=1e-5, rtol=0
        )
        with pytest.raises(ValueError, match="max_tokens_per_query"):
            bad = PoolingParams(extra_kwargs={"max_tokens_per_query": MAX_LEN})
            llm.score(QUERY, DOCS, pooling_params=bad, use_tqdm=False)
        with pytest.raises(ValueError, match="chat_template"):
            llm.score(QUERY, DOCS, chat_template="{{ query }}")
    finally:
        llm.llm_engine.shutdown()

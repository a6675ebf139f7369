"""`/classify` of a real `vllm serve --runner pooling` subprocess on a tiny
BERT sequence classifier (3 labels): probabilities equal the softmax of
transformers' BertForSequenceClassification logits (1e-5 absolute, float32
both sides), the label is id2label of the most probable class, and
`use_activation: false` returns the logits. A `messages` body is rendered
with the server's --chat-template (no special tokens added by default, as
upstream) and classified as the template's token ids. The classifier serves
no /v1/embeddings (its pooler has no "embed" task)."""

from __future__ import annotations

import httpx
import pytest
import torch

from tests.entrypoints.openai.conftest import RemoteOpenAIServer
from tests.models.test_encoder_pooling import TEXTS, _hf_logits, _with_tokenizer

MAX_LEN = 64
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} {% endfor %}"
MESSAGES = [
    {"role": "user", "content": "what is the capital of france ?"},
    {"role": "assistant", "content": "paris"},
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return _with_tokenizer("bert-cls", str(tmp_path_factory.mktemp("classify") / "bert-cls"))


@pytest.fixture(scope="module")
def server(model_dir):
    args = ["--runner", "pooling", "--dtype", "float32", "--max-model-len", str(MAX_LEN)]
    args += ["--chat-template", CHAT_TEMPLATE]
    srv = RemoteOpenAIServer(model_dir, args)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def logits(model_dir) -> torch.Tensor:
    return _hf_logits(model_dir, "bert-cls", TEXTS)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url_for(path), json=body, timeout=60)


def test_probs_and_labels_match_transformers(server, model_dir, logits):
    from transformers import AutoConfig

    res = _post(server, "classify", {"input": TEXTS})
    assert res.status_code == 200, res.text
    body = res.json()
    assert body["object"] == "list" and body["id"].startswith("classify-")
    assert body["id"] != _post(server, "classify", {"input": "x"}).json()["id"]
    probs = torch.tensor([d["probs"] for d in body["data"]])
    torch.testing.assert_close(probs, logits.softmax(-1), atol=1e-5, rtol=0)
    id2label = AutoConfig.from_pretrained(model_dir).id2label
    expected = [id2label[int(i)] for i in logits.argmax(-1)]
    assert [d["label"] for d in body["data"]] == expected
    assert [d["num_classes"] for d in body["data"]] == [3] * len(TEXTS)
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > len(TEXTS)


def test_use_activation_false_returns_logits(server, logits):
    res = _post(server, "classify", {"input": TEXTS[0], "use_activation": False})
    torch.testing.assert_close(
        torch.tensor(res.json()["data"][0]["probs"]), logits[0], atol=1e-5, rtol=0
    )


def test_errors_and_no_embedding_route(server, logits):
    long_text = "keys and values " * 40
    res = _post(server, "classify", {"input": long_text})
    # Upstream v0.28's message; a text is tokenized to at most MAX_LEN + 1 tokens.
    message = res.json()["error"]["message"]
    assert res.status_code == 400 and f"contains at least {MAX_LEN + 1} input tokens" in message
    assert _post(server, "classify", {"input": []}).status_code == 400
    assert (
        _post(server, "classify", {"input": "x", "dimensions": 4}).status_code == 200
    )  # ignored extra
    assert _post(server, "v1/embeddings", {"input": "paris"}).status_code == 404
    ok = _post(server, "classify", {"input": TEXTS[:1]}).json()["data"][0]["probs"]
    torch.testing.assert_close(torch.tensor(ok), logits[0].softmax(-1), atol=1e-5, rtol=0)


def test_pooling_route_defaults_to_classify(server, logits):
    res = _post(server, "pooling", {"input": TEXTS})
    assert res.status_code == 200, res.text
    probs = torch.tensor([d["data"] for d in res.json()["data"]])
    torch.testing.assert_close(probs, logits.softmax(-1), atol=1e-5, rtol=0)
    # `normalize` was removed (upstream v0.28): refused by name.
    assert _post(server, "pooling", {"input": "x", "normalize": True}).status_code == 400


def test_chat_messages_are_classified_as_the_template_renders_them(server, model_dir):
    from transformers import AutoTokenizer, BertForSequenceClassification

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template(MESSAGES, chat_template=CHAT_TEMPLATE, tokenize=False)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    model = BertForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0].softmax(-1)
    res = _post(server, "classify", {"messages": MESSAGES})
    assert res.status_code == 200, res.text
    assert res.json()["usage"]["prompt_tokens"] == len(ids)
    got = torch.tensor(res.json()["data"][0]["probs"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    # With the special tokens added on top: [CLS] ... [SEP].
    both = _post(server, "classify", {"messages": MESSAGES, "add_special_tokens": True})
    assert both.json()["usage"]["prompt_tokens"] == len(ids) + 2
    # Refusals: an untrusted request template, both prompt flags, no messages.
    for body in (
        {"messages": MESSAGES, "chat_template": "{{ messages }}"},
        {"messages": MESSAGES, "add_generation_prompt": True, "continue_final_message": True},
        {"messages": []},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
    ):
        err = _post(server, "classify", body)
        assert err.status_code == 400 and err.json()["error"]["message"], (body, err.text)

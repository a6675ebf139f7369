"""`/v1/embeddings` of a real `vllm serve` subprocess on a tiny random Qwen3
saved as a sentence-transformers directory with last-token pooling and
Normalize (Qwen3-Embedding style; the runner resolves to pooling from
modules.json), with small scheduler steps (--max-num-batched-tokens 32) so
the long inputs are prefilled in chunks:

- float and base64 through the `openai` client equal SentenceTransformer
  (cosine >= 0.9999, the issue's bar; and 1e-5 absolute);
- a batch mixing long and short inputs equals the inputs sent one by one;
- `messages` (one conversation, a batch of conversations, or conversations
  sent as `input`) are rendered with the tokenizer's chat template and
  embedded as that text without added special tokens (upstream's default);
  /pooling takes `messages` too.
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest
import torch

from tests.entrypoints.openai.conftest import RemoteOpenAIServer
from tests.models.language.pooling.st_utils import make_st_dir

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks. " * 6,
    "fox",
    "Paged attention stores keys and values in fixed-size blocks. " * 3 + "The end.",
]
# ChatML, as Qwen's tokenizers ship it.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATS = [
    [{"role": "user", "content": "What is paged attention?"}],
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "The quick brown fox?"},
        {"role": "assistant", "content": "Jumps."},
    ],
]


@pytest.fixture(scope="module")
def st_dir(tmp_path_factory) -> str:
    from transformers import AutoTokenizer

    out = make_st_dir("qwen3", str(tmp_path_factory.mktemp("qwen3-embed")), "lasttoken", seed=7)
    tok = AutoTokenizer.from_pretrained(out)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def server(st_dir):
    args = ["--dtype", "float32", "--max-model-len", "256", "--max-num-batched-tokens", "32"]
    args += ["--max-num-seqs", "4", "--kv-cache-memory-bytes", "64M"]
    srv = RemoteOpenAIServer(st_dir, args)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def st_model(st_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(st_dir, device="cpu")


def _encode(st_model, texts: list[str]) -> torch.Tensor:
    return st_model.encode(texts, convert_to_tensor=True).float()


def _post(server, path: str, body: dict) -> list[list[float]]:
    res = httpx.post(server.url_for(path), json=body, timeout=120)
    assert res.status_code == 200, res.text
    key = "embedding" if path.endswith("embeddings") else "data"
    return [d[key] for d in res.json()["data"]]


def _assert_matches(rows, ref: torch.Tensor) -> None:
    ours = torch.tensor(rows, dtype=torch.float32)
    cos = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    assert bool((cos >= 0.9999).all()), cos
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


def test_openai_client_float_and_base64_match_sentence_transformers(server, st_model):
    client = server.get_client()
    model = client.models.list().data[0].id
    ref = _encode(st_model, TEXTS)
    floats = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    _assert_matches([d.embedding for d in floats.data], ref)
    assert floats.usage.prompt_tokens > 32  # some input ran in chunks
    b64 = client.embeddings.create(model=model, input=TEXTS, encoding_format="base64")
    decoded = [np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in b64.data]
    _assert_matches(np.stack(decoded).tolist(), ref)


def test_mixed_batch_equals_one_by_one(server):
    batch = _post(server, "v1/embeddings", {"input": TEXTS})
    for text, row in zip(TEXTS, batch):
        single = _post(server, "v1/embeddings", {"input": text})[0]
        np.testing.assert_allclose(row, single, atol=1e-6)


def test_chat_messages_embed_the_rendered_template(server, st_dir, st_model):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(st_dir)
    rendered = [tok.apply_chat_template(c, tokenize=False) for c in CHATS]
    assert rendered[0].startswith("<|im_start|>user\n")
    ref = _encode(st_model, rendered)
    one = _post(server, "v1/embeddings", {"messages": CHATS[0]})
    _assert_matches(one, ref[:1])
    as_text = _post(server, "v1/embeddings", {"input": rendered[0], "add_special_tokens": False})
    np.testing.assert_allclose(one[0], as_text[0], atol=1e-6)
    _assert_matches(_post(server, "v1/embeddings", {"messages": CHATS}), ref)
    _assert_matches(_post(server, "v1/embeddings", {"input": CHATS[1]}), ref[1:])
    _assert_matches(_post(server, "v1/embeddings", {"input": CHATS}), ref)
    _assert_matches(_post(server, "pooling", {"messages": CHATS[1]}), ref[1:])
    # add_generation_prompt: the template's assistant header is embedded too.
    gen = tok.apply_chat_template(CHATS[0], tokenize=False, add_generation_prompt=True)
    body = {"messages": CHATS[0], "add_generation_prompt": True}
    _assert_matches(_post(server, "v1/embeddings", body), _encode(st_model, [gen]))


def test_bad_chat_requests(server):
    url = server.url_for("v1", "embeddings")
    for body in (
        {"messages": []},
        {"messages": [[]]},
        {"messages": CHATS[0], "chat_template": "{{ messages }}"},  # untrusted
        {"messages": CHATS[0], "add_generation_prompt": True, "continue_final_message": True},
        {"messages": CHATS[0], "mm_processor_kwargs": {}},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": [{"content": "no role"}]},
    ):
        res = httpx.post(url, json=body, timeout=60)
        assert res.status_code == 400, (body, res.text)
        assert res.json()["error"]["code"] == 400 and res.json()["error"]["message"]
    assert len(_post(server, "v1/embeddings", {"messages": CHATS[0]})) == 1  # still serving

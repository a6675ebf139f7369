"""A LoRA adapter on the pooling routes (upstream v0.28 runs them under the
adapter `model` names): a real `vllm serve` subprocess on a tiny random
Llama saved as a sentence-transformers directory (last-token pooling +
Normalize) with `--enable-lora --lora-modules`. `model: "<adapter>"` on
/v1/embeddings and /pooling equals SentenceTransformer on peft's merged
model (1e-5 absolute, float32); the base name still gives the base
embeddings, which differ from the adapter's."""

from __future__ import annotations

import os

import httpx
import pytest
import torch

from tests.entrypoints.openai.conftest import RemoteOpenAIServer
from tests.lora.peft_utils import make_peft_adapter
from tests.models.language.pooling.st_utils import make_st_dir

TEXTS = ["The quick brown fox jumps over the lazy dog.", "fox", "Paged attention " * 5]
ADAPTER = "emb-lora"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, str]:
    """The base ST directory, the adapter, and an ST directory of the merged model."""
    from sentence_transformers import SentenceTransformer, models

    root = str(tmp_path_factory.mktemp("embed-lora"))
    base = make_st_dir("llama", os.path.join(root, "base"), "lasttoken", seed=3)
    adapter = os.path.join(root, "adapter")
    peft_model = make_peft_adapter(os.path.join(base, "_hf"), adapter, r=8, lora_alpha=16, seed=5)
    merged_hf = os.path.join(root, "merged_hf")
    peft_model.merge_and_unload().save_pretrained(merged_hf, safe_serialization=True)
    SentenceTransformer(base, device="cpu").tokenizer.save_pretrained(merged_hf)
    transformer = models.Transformer(merged_hf, max_seq_length=256)
    pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="lasttoken")
    merged = os.path.join(root, "merged")
    modules = [transformer, pooling, models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(merged)
    return {"base": base, "adapter": adapter, "merged": merged}


@pytest.fixture(scope="module")
def server(dirs):
    args = ["--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "4"]
    args += ["--kv-cache-memory-bytes", "64M", "--enable-lora", "--max-lora-rank", "8"]
    args += ["--lora-modules", f"{ADAPTER}={dirs['adapter']}", "--served-model-name", "base"]
    srv = RemoteOpenAIServer(dirs["base"], args)
    try:
        yield srv
    finally:
        srv.stop()


def _st(path: str) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(path, device="cpu")
    return model.encode(TEXTS, convert_to_tensor=True).float()


def _post(server, path: str, model: str) -> torch.Tensor:
    res = httpx.post(server.url_for(path), json={"model": model, "input": TEXTS}, timeout=120)
    assert res.status_code == 200, res.text
    key = "embedding" if path.endswith("embeddings") else "data"
    return torch.tensor([row[key] for row in res.json()["data"]])


@pytest.mark.parametrize("path", ["v1/embeddings", "pooling"])
def test_adapter_embeddings_equal_merged_model(server, dirs, path):
    want_lora, want_base = _st(dirs["merged"]), _st(dirs["base"])
    assert (want_lora - want_base).abs().max() > 1e-2, "the adapter must change the embeddings"
    torch.testing.assert_close(_post(server, path, ADAPTER), want_lora, atol=1e-5, rtol=0)
    torch.testing.assert_close(_post(server, path, "base"), want_base, atol=1e-5, rtol=0)

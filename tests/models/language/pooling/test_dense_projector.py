"""A sentence-transformers dir with a Dense projector after pooling
(Transformer -> Pooling -> Dense(hidden -> 24, Tanh) -> Normalize): the
embeddings equal SentenceTransformer's, their width is the projector's
out_features, and `dimensions` is checked against that width."""

from __future__ import annotations

import os

import pytest
import torch

from tests.models.language.pooling.st_utils import ENGINE
from tests.utils import make_tiny_model

pytestmark = pytest.mark.usefixtures("in_process_engine")

TEXTS = ["the capital of france is paris", "a short one", "dense heads project the pooled vector"]
OUT = 24


@pytest.fixture(scope="module")
def dense_st_dir(tmp_path_factory):
    from sentence_transformers import SentenceTransformer, models

    out_dir = str(tmp_path_factory.mktemp("dense_st"))
    hf_dir = make_tiny_model("qwen3", os.path.join(out_dir, "_hf"), seed=3)
    transformer = models.Transformer(hf_dir, max_seq_length=256)
    hidden = transformer.get_embedding_dimension()
    torch.manual_seed(3)
    dense = models.Dense(hidden, OUT, activation_function=torch.nn.Tanh())
    with torch.no_grad():  # large enough weights that the Tanh is not near-linear
        dense.linear.weight.normal_(0.0, 1.0)
    pooling = models.Pooling(hidden, pooling_mode="lasttoken")
    modules = [transformer, pooling, dense, models.Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(out_dir)
    return out_dir


def test_dense_projector_matches_sentence_transformers(dense_st_dir):
    from sentence_transformers import SentenceTransformer

    from vllm import LLM
    from vllm.pooling_params import PoolingParams

    ref = SentenceTransformer(dense_st_dir, device="cpu").encode(TEXTS, convert_to_tensor=True)
    llm = LLM(dense_st_dir, runner="pooling", **ENGINE)
    try:
        assert llm.model_config.embedding_size == OUT
        outs = llm.embed(TEXTS, use_tqdm=False)
        got = torch.stack([torch.tensor(o.outputs.embedding) for o in outs])
        assert got.shape == (len(TEXTS), OUT)
        cos = torch.nn.functional.cosine_similarity(got, ref.float(), dim=-1)
        assert cos.min().item() >= 0.9999, cos
        # Not a Matryoshka model: dimensions refused with upstream's message.
        with pytest.raises(ValueError, match="does not support Matryoshka embeddings"):
            llm.embed(TEXTS[:1], pooling_params=PoolingParams(dimensions=8), use_tqdm=False)
    finally:
        llm.llm_engine.shutdown()

"""Sequence classification and scoring through the whole engine against
transformers' *ForSequenceClassification on tiny random Qwen2 / Llama /
Qwen3 checkpoints (float32; logits to 1e-4), cross-encoder `score`
(one label: sigmoid of the pair's logit) and bi-encoder `score` (cosine of
embeddings), 1:1 and 1:N."""

from __future__ import annotations

import pytest
import torch

from tests.models.language.pooling.st_utils import ENGINE, make_seq_cls_model, make_st_dir
from vllm import LLM, PoolingParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks. " * 5,
    "def hello(world):",
]


pytestmark = pytest.mark.usefixtures("in_process_engine")


ATOL = 1e-4


def _hf_logits(model_dir: str, ids_list: list[list[int]]) -> torch.Tensor:
    import transformers as tf

    model = tf.AutoModelForSequenceClassification.from_pretrained(
        model_dir, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        return torch.cat([model(torch.tensor([ids])).logits for ids in ids_list])


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_classify_matches_transformers(kind, tmp_path):
    model_dir = make_seq_cls_model(kind, str(tmp_path / kind), num_labels=3)
    # Small steps: the long prompt is prefilled in chunks (LAST pooling).
    llm = LLM(model_dir, max_num_batched_tokens=32, **ENGINE)
    assert llm.model_config.runner_type == "pooling"
    assert llm.model_config.convert_type == "none"
    outs = llm.classify(TEXTS, use_tqdm=False)
    ref = _hf_logits(model_dir, [o.prompt_token_ids for o in outs])
    probs = torch.tensor([o.outputs.probs for o in outs])
    assert torch.allclose(probs, ref.softmax(-1), atol=ATOL), (probs, ref.softmax(-1))
    raw = llm.classify(TEXTS, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
    logits = torch.tensor([o.outputs.probs for o in raw])
    assert torch.allclose(logits, ref, atol=ATOL), (logits - ref).abs().max()
    with pytest.raises(ValueError, match="num_labels == 1"):
        llm.score(TEXTS[0], TEXTS[1:])
    with pytest.raises(ValueError, match="Embedding API is not supported"):
        llm.embed(TEXTS[:1], use_tqdm=False)
    llm.llm_engine.shutdown()


def test_cross_encoder_score_and_reward(tmp_path):
    model_dir = make_seq_cls_model("qwen3", str(tmp_path / "ce"), num_labels=1)
    llm = LLM(model_dir, **ENGINE)
    assert llm.model_config.is_cross_encoder
    tok = llm.get_tokenizer()
    query, docs = "what stores keys?", TEXTS
    scores = llm.score(query, docs, use_tqdm=False)  # 1:N
    pair_ids = [tok(text=query, text_pair=d)["input_ids"] for d in docs]
    ref = _hf_logits(model_dir, pair_ids)[:, 0].sigmoid()
    got = torch.tensor([s.outputs.score for s in scores])
    assert torch.allclose(got, ref, atol=ATOL), (got, ref)
    assert [s.prompt_token_ids for s in scores] == pair_ids
    assert torch.argsort(got).tolist() == torch.argsort(ref).tolist()  # rerank order
    one = llm.score(docs[1], docs[2], use_tqdm=False)  # 1:1
    assert len(one) == 1
    # Reward: the score head over every token ([T, 1]), no activation by default here.
    rewards = llm.reward(
        TEXTS[:1], pooling_params=PoolingParams(use_activation=False), use_tqdm=False
    )
    import transformers as tf

    hf = tf.AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        hidden = hf.model(torch.tensor([rewards[0].prompt_token_ids])).last_hidden_state[0]
        per_token = hf.score(hidden)
    assert rewards[0].outputs.data.shape == per_token.shape
    assert torch.allclose(rewards[0].outputs.data, per_token, atol=ATOL)
    llm.llm_engine.shutdown()


def test_bi_encoder_score(tmp_path):
    from sentence_transformers import SentenceTransformer

    st_dir = make_st_dir("qwen3", str(tmp_path / "st"), "lasttoken", seed=3)
    llm = LLM(st_dir, **ENGINE)
    query = "what stores keys?"
    got = torch.tensor([s.outputs.score for s in llm.score(query, TEXTS, use_tqdm=False)])
    st = SentenceTransformer(st_dir, device="cpu")
    q = torch.as_tensor(st.encode([query]))
    d = torch.as_tensor(st.encode(TEXTS))
    ref = torch.nn.functional.cosine_similarity(q, d, dim=-1)
    assert torch.allclose(got, ref, atol=ATOL), (got, ref)
    pairs = llm.score(TEXTS, TEXTS, use_tqdm=False)  # N:N, each text with itself
    assert all(abs(p.outputs.score - 1.0) < 1e-5 for p in pairs)
    llm.llm_engine.shutdown()


def _bert_tokenizer(out_dir: str) -> None:
    """A WordPiece tokenizer over a 512-entry vocab (specials, words, fillers)."""
    from transformers import BertTokenizerFast

    words = sorted(set(" ".join(TEXTS + ["what stores keys?"]).lower().replace(".", " . ")
                       .replace("?", " ? ").replace("(", " ( ").replace(")", " ) ")
                       .replace(":", " : ").split()))  # fmt: skip
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    vocab += [f"[unused{i}]" for i in range(512 - len(vocab))]
    path = f"{out_dir}/vocab.txt"
    with open(path, "w") as f:
        f.write("\n".join(vocab) + "\n")
    BertTokenizerFast(vocab_file=path).save_pretrained(out_dir)


def test_bert_cross_encoder_score_uses_segment_ids(tmp_path):
    """A BERT cross-encoder reads the pair's second text as segment 1 (the
    runner hands token_type_ids from PoolingParams.extra_kwargs to the model)."""
    from tests.models.test_bert import make_tiny_encoder

    model_dir = make_tiny_encoder("bert-cls", str(tmp_path / "bert"), num_labels=1)
    _bert_tokenizer(model_dir)
    llm = LLM(model_dir, **ENGINE)
    assert llm.model_config.is_cross_encoder
    tok = llm.get_tokenizer()
    query = "what stores keys?"
    got = torch.tensor([s.outputs.score for s in llm.score(query, TEXTS, use_tqdm=False)])
    import transformers as tf

    hf = tf.AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        enc = [tok(text=query, text_pair=d, return_tensors="pt") for d in TEXTS]
        ref = torch.cat([hf(**e).logits[:, 0] for e in enc]).sigmoid()
    assert torch.allclose(got, ref, atol=ATOL), (got, ref)
    llm.llm_engine.shutdown()

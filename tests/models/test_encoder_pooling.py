"""Encoder-only models through the engine (runner="pooling"): LLM.embed of a
tiny BERT / XLM-R sentence-transformers directory against
SentenceTransformer.encode, and LLM.classify / LLM.score of tiny BERT and
XLM-R cross-encoders against transformers' *ForSequenceClassification on the
same tokens (pairs with their segment ids).

Tolerances: embeddings cosine >= 0.9999 per text (the issue's bar; measured
> 1 - 1e-6); class probabilities and scores within 1e-5 absolute (float32
both sides, one sequence at a time in transformers, batched here).
"""

from __future__ import annotations

import os

import pytest
import torch
import transformers as tf

from tests.models.test_bert import TINY, make_tiny_encoder
from vllm import LLM

_CORPUS = (
    "the quick brown fox jumps over the lazy dog . paged attention stores keys and values "
    "in fixed size blocks . what is the capital of france ? paris is the capital of france . "
    "encoders read the whole sentence at once and pool it into one vector . "
) * 8
TEXTS = [
    "the quick brown fox",
    "what is the capital of france ?",
    "paris",
    "encoders read the whole sentence at once and pool it into one vector . " * 3,
    "keys and values",
]
QUERY = "what is the capital of france ?"
DOCS = ["paris is the capital of france .", "the lazy dog", "fixed size blocks", "paris"]


def _bert_tokenizer(out_dir: str) -> None:
    """A WordPiece tokenizer over the tiny vocabulary ([PAD] 0, [UNK] 1,
    [CLS] 2, [SEP] 3, [MASK] 4), saved as BertTokenizerFast."""
    from tokenizers import BertWordPieceTokenizer

    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator(
        [_CORPUS],
        vocab_size=TINY["vocab_size"],
        special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
        show_progress=False,
    )
    wp.save_model(out_dir)
    tf.BertTokenizerFast(vocab_file=os.path.join(out_dir, "vocab.txt")).save_pretrained(out_dir)


def _xlmr_tokenizer(out_dir: str) -> None:
    """A byte-level BPE tokenizer with XLM-R's special ids (<s> 0, <pad> 1,
    </s> 2, <unk> 3) and pair layout (<s> a </s></s> b </s>)."""
    from tokenizers import ByteLevelBPETokenizer, processors

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [_CORPUS],
        vocab_size=TINY["vocab_size"],
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        show_progress=False,
    )
    bpe.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok = tf.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        # As XLM-R's tokenizer: one segment, no token_type_ids.
        model_input_names=["input_ids", "attention_mask"],
    )
    tok.save_pretrained(out_dir)


def _with_tokenizer(variant: str, out_dir: str, **overrides) -> str:
    make_tiny_encoder(variant, out_dir, **overrides)
    (_bert_tokenizer if variant.startswith("bert") else _xlmr_tokenizer)(out_dir)
    return out_dir


def _st_dir(variant: str, root) -> str:
    """A sentence-transformers directory: the tiny encoder + mean pooling +
    Normalize."""
    from sentence_transformers import SentenceTransformer, models

    hf_dir = _with_tokenizer(variant, str(root / f"{variant}-hf"))
    body = models.Transformer(hf_dir, max_seq_length=256)
    pooling = models.Pooling(body.get_embedding_dimension(), pooling_mode="mean")
    st_dir = str(root / f"{variant}-st")
    SentenceTransformer(modules=[body, pooling, models.Normalize()], device="cpu").save(st_dir)
    return st_dir


@pytest.mark.parametrize("variant", ["bert", "xlmr"])
def test_embed_matches_sentence_transformers(tmp_path, variant):
    from sentence_transformers import SentenceTransformer

    st_dir = _st_dir(variant, tmp_path)
    ref = SentenceTransformer(st_dir, device="cpu").encode(TEXTS, convert_to_tensor=True)
    llm = LLM(st_dir, runner="pooling", dtype="float32", max_model_len=256)
    config = llm.llm_engine.vllm_config
    # Encoder-only: whole prompts per step, nothing cached between requests.
    assert not config.scheduler_config.enable_chunked_prefill
    assert not config.cache_config.enable_prefix_caching
    outs = llm.embed(TEXTS, use_tqdm=False)
    ours = torch.tensor([o.outputs.embedding for o in outs])
    cos = torch.nn.functional.cosine_similarity(ours, ref.float(), dim=-1)
    assert bool((cos >= 0.9999).all()), cos
    # Mean + Normalize: unit vectors equal to the reference's, not merely parallel.
    torch.testing.assert_close(ours, ref.float(), atol=1e-5, rtol=0)
    one_by_one = [llm.embed([t], use_tqdm=False)[0].outputs.embedding for t in TEXTS]
    torch.testing.assert_close(torch.tensor(one_by_one), ours, atol=1e-6, rtol=0)


def _hf_logits(model_dir: str, variant: str, *texts: list[str]) -> torch.Tensor:
    cls = {"bert-cls": tf.BertForSequenceClassification}.get(
        variant, tf.XLMRobertaForSequenceClassification
    )
    model = cls.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = tf.AutoTokenizer.from_pretrained(model_dir)
    rows = []
    with torch.no_grad():
        for args in zip(*texts):
            enc = tok(*args, return_tensors="pt")
            rows.append(model(**enc).logits[0])
    return torch.stack(rows)


@pytest.mark.parametrize("variant", ["bert-cls", "xlmr-cls"])
def test_classify_matches_transformers(tmp_path, variant):
    """Class probabilities (softmax over 3 / 2 labels) of single texts."""
    model_dir = _with_tokenizer(variant, str(tmp_path / variant))
    llm = LLM(model_dir, runner="pooling", dtype="float32", max_model_len=256)
    probs = torch.tensor([o.outputs.probs for o in llm.classify(TEXTS, use_tqdm=False)])
    expected = _hf_logits(model_dir, variant, TEXTS).softmax(-1)
    torch.testing.assert_close(probs, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["bert-cls", "xlmr-cls"])
def test_score_matches_transformers(tmp_path, variant):
    """One-label cross-encoders: the query paired with each document (BERT:
    segment ids 0 / 1; XLM-R: one segment, <s> q </s></s> d </s>), sigmoid
    of transformers' logit; the ranking is the reference's."""
    model_dir = _with_tokenizer(variant, str(tmp_path / variant), num_labels=1)
    llm = LLM(model_dir, runner="pooling", dtype="float32", max_model_len=256)
    scores = torch.tensor([o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)])
    expected = _hf_logits(model_dir, variant, [QUERY] * len(DOCS), DOCS)[:, 0].sigmoid()
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
    assert scores.argsort().tolist() == expected.argsort().tolist()


def test_tp2_embed_and_score_match(tmp_path):
    """Tensor parallelism 2: the heads, the MLP and the embedding tables split
    over two ranks (the 2-row segment table on one of them); embeddings
    still equal sentence-transformers' and pair scores transformers'. Each
    engine is shut down explicitly: a TP engine left to the garbage collector
    can block in zmq's Context.term (its message queues' sockets still open)."""
    from sentence_transformers import SentenceTransformer

    st_dir = _st_dir("bert", tmp_path)
    ref = SentenceTransformer(st_dir, device="cpu").encode(TEXTS, convert_to_tensor=True)
    llm = LLM(st_dir, runner="pooling", dtype="float32", max_model_len=256, tensor_parallel_size=2)
    try:
        ours = torch.tensor([o.outputs.embedding for o in llm.embed(TEXTS, use_tqdm=False)])
    finally:
        llm.llm_engine.shutdown()
    torch.testing.assert_close(ours, ref.float(), atol=1e-5, rtol=0)

    model_dir = _with_tokenizer("bert-cls", str(tmp_path / "ce"), num_labels=1)
    llm = LLM(
        model_dir, runner="pooling", dtype="float32", max_model_len=256, tensor_parallel_size=2
    )
    try:
        scores = torch.tensor([o.outputs.score for o in llm.score(QUERY, DOCS, use_tqdm=False)])
    finally:
        llm.llm_engine.shutdown()
    expected = _hf_logits(model_dir, "bert-cls", [QUERY] * len(DOCS), DOCS)[:, 0].sigmoid()
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)

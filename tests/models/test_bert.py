"""BERT / RoBERTa / XLM-R (encoder-only) forward and pooler heads vs
transformers, in float32, on one batch of unpadded sequences of different
lengths laid out back to back as the model runner lays them out.

The pooling engine path (LLM.embed / classify / score) is tested in
tests/models/test_encoder_pooling.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from vllm.config import CacheConfig, VllmConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.forward_context import set_forward_context
from vllm.model_executor.model_loader import get_model
from vllm.model_executor.models.bert import _decode_token_type_ids, _encode_token_type_ids
from vllm.pooling_params import PoolingParams
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec
from vllm.v1.pool.metadata import PoolingMetadata

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    type_vocab_size=2,
)
# variant -> (config class, model class, extra config)
VARIANTS = {
    "bert": (tf.BertConfig, tf.BertModel, {"max_position_embeddings": 512}),
    "bert-cls": (
        tf.BertConfig,
        tf.BertForSequenceClassification,
        {"max_position_embeddings": 512, "num_labels": 3},
    ),
    "roberta": (tf.RobertaConfig, tf.RobertaModel, {"max_position_embeddings": 514}),
    "roberta-cls": (
        tf.RobertaConfig,
        tf.RobertaForSequenceClassification,
        {"max_position_embeddings": 514, "num_labels": 1},
    ),
    "xlmr": (tf.XLMRobertaConfig, tf.XLMRobertaModel, {"max_position_embeddings": 514}),
    "xlmr-cls": (
        tf.XLMRobertaConfig,
        tf.XLMRobertaForSequenceClassification,
        {"max_position_embeddings": 514, "num_labels": 2},
    ),
}
# One-token and 300-token requests (the latter through SDPA) among others.
LENGTHS = [7, 1, 300, 20]


def make_tiny_encoder(variant: str, out_dir: str, seed: int = 0, **overrides) -> str:
    """A tiny random `variant` checkpoint (float32) in `out_dir`; LayerNorm
    weights perturbed so a norm bug shows, segment embeddings scaled up so a
    lost segment id shows. RoBERTa-style configs pad with id 1."""
    config_cls, model_cls, extra = VARIANTS[variant]
    kwargs = {**TINY, **extra}
    if config_cls is not tf.BertConfig:
        kwargs.update(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    kwargs.update(overrides)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if "token_type_embeddings" in name:
                p.mul_(25.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(variant: str) -> str:
        if variant not in cache:
            cache[variant] = make_tiny_encoder(variant, str(tmp_path_factory.mktemp(variant)))
        return cache[variant]

    return get


def _load(model_dir: str):
    """Our model for `model_dir` under runner="pooling". The engine-level
    cross-checks of VllmConfig are not what is tested here, so the model
    config is set on a default VllmConfig."""
    model_config = EngineArgs(
        model=model_dir, dtype="float32", device="cpu", runner="pooling"
    ).create_model_config()
    vllm_config = VllmConfig(cache_config=CacheConfig(block_size=16))
    vllm_config.model_config = model_config
    return get_model(vllm_config=vllm_config), vllm_config


def _attn_metadata(vllm_config: VllmConfig, lengths: list[int]) -> dict[str, object]:
    """What the runner builds for the encoder-only group of one step."""
    layers = vllm_config.compilation_config.static_forward_context
    first = next(iter(layers.values()))
    spec = EncoderOnlyAttentionSpec(
        block_size=16, num_kv_heads=first.num_kv_heads, head_size=first.head_size,
        dtype=torch.float32,
    )  # fmt: skip
    builder = first.get_attn_backend().get_builder_cls()(
        spec, list(layers), vllm_config, torch.device("cpu")
    )
    qsl = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    seq = torch.tensor(lengths, dtype=torch.int32)
    common = CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=seq,
        seq_lens_cpu=seq,
        num_computed_tokens_cpu=torch.zeros_like(seq),
        num_reqs=len(lengths),
        num_actual_tokens=sum(lengths),
        max_query_len=max(lengths),
        max_seq_len=max(lengths),
        block_table_tensor=torch.zeros(len(lengths), 1, dtype=torch.int32),
        slot_mapping=torch.full((sum(lengths),), -1, dtype=torch.int64),
    )
    md = builder.build(0, common)
    return {name: md for name in layers}


def _batch(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids (no special ids 0..2) and pair segment ids (first half 0,
    second half 1, as a tokenizer marks a query / document pair)."""
    gen = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(3, TINY["vocab_size"], (n,), generator=gen).tolist() for n in LENGTHS]
    types = [[0] * (n // 2) + [1] * (n - n // 2) for n in LENGTHS]
    return seqs, types


def _run(model, vllm_config, seqs, token_types=None) -> torch.Tensor:
    ids = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    kwargs = {}
    if token_types is not None:
        kwargs["token_type_ids"] = torch.tensor([t for s in token_types for t in s])
    with (
        torch.inference_mode(),
        set_forward_context(_attn_metadata(vllm_config, [len(s) for s in seqs]), vllm_config),
    ):
        return model(ids, positions, **kwargs)


def _hf(model_dir: str, variant: str):
    cls = VARIANTS[variant][1]
    return cls.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_hidden_states_match_transformers(model_dir, variant):
    """Last hidden states of every token, each sequence against transformers
    run on it alone (classifiers: with pair segment ids)."""
    path = model_dir(variant)
    model, vllm_config = _load(path)
    seqs, types = _batch()
    pairs = variant.endswith("-cls")
    hidden = _run(model, vllm_config, seqs, types if pairs else None)
    hf = _hf(path, variant)
    start = 0
    for ids, tt in zip(seqs, types):
        with torch.no_grad():
            kwargs = {"token_type_ids": torch.tensor([tt])} if pairs else {}
            out = hf(torch.tensor([ids]), output_hidden_states=True, **kwargs)
        ref = out.hidden_states[-1][0]
        torch.testing.assert_close(hidden[start : start + len(ids)], ref, atol=2e-5, rtol=1e-4)
        start += len(ids)


def _pooling_metadata(task: str, lengths: list[int], model_config, **params) -> PoolingMetadata:
    pooling_params = []
    for _ in lengths:
        p = PoolingParams(**params)
        p.verify(task, model_config)
        pooling_params.append(p)
    md = PoolingMetadata(
        prompt_lens=torch.tensor(lengths), prompt_token_ids=None, pooling_params=pooling_params
    )
    md.build_pooling_cursor(lengths, torch.tensor(lengths), torch.device("cpu"))
    return md


@pytest.mark.parametrize("variant", ["bert-cls", "roberta-cls", "xlmr-cls"])
def test_classifier_logits_match_transformers(model_dir, variant):
    """The classify pooler's raw logits (use_activation=False) equal
    transformers' logits, and with the activation softmax / sigmoid of them."""
    path = model_dir(variant)
    model, vllm_config = _load(path)
    seqs, types = _batch(seed=1)
    hidden = _run(model, vllm_config, seqs, types)
    hf = _hf(path, variant)
    with torch.no_grad():
        logits = [
            hf(torch.tensor([s]), token_type_ids=torch.tensor([t])).logits
            for s, t in zip(seqs, types)
        ]
        ref = torch.cat(logits)
    mc = vllm_config.model_config
    raw = model.pooler(hidden, _pooling_metadata("classify", LENGTHS, mc, use_activation=False))
    torch.testing.assert_close(torch.stack(raw), ref, atol=2e-5, rtol=1e-4)
    probs = torch.stack(model.pooler(hidden, _pooling_metadata("classify", LENGTHS, mc)))
    expected = ref.sigmoid() if ref.shape[-1] == 1 else ref.softmax(-1)
    torch.testing.assert_close(probs, expected, atol=2e-5, rtol=1e-4)


def test_cls_embedding_is_normalised_cls_state(model_dir):
    """BertModel as an embedder: the default (CLS) pooler returns the first
    token's hidden state, L2-normalised; its weights' `pooler.*` are unused."""
    path = model_dir("bert")
    model, vllm_config = _load(path)
    seqs, _ = _batch(seed=2)
    hidden = _run(model, vllm_config, seqs)
    out = model.pooler(hidden, _pooling_metadata("embed", LENGTHS, vllm_config.model_config))
    hf = _hf(path, "bert")
    for ids, emb in zip(seqs, out):
        with torch.no_grad():
            cls = hf(torch.tensor([ids])).last_hidden_state[0, 0]
        torch.testing.assert_close(
            emb, torch.nn.functional.normalize(cls, dim=-1), atol=1e-5, rtol=0
        )


def test_token_type_bits_round_trip():
    """Segment ids ride in bit 30 of the int32 ids and come out unchanged."""
    ids = torch.tensor([5, 511, 0, 7, 9], dtype=torch.int32)
    original = ids.clone()
    _encode_token_type_ids(ids, torch.tensor([0, 1, 1, 0]))  # shorter: padding stays 0
    assert ids.tolist() == [5, 511 | 1 << 30, 1 << 30, 7, 9]
    assert _decode_token_type_ids(ids).tolist() == [0, 1, 1, 0, 0]
    assert torch.equal(ids, original)


def test_unsupported_position_embedding_refused(tmp_path):
    config = tf.BertConfig(**TINY, max_position_embeddings=64)
    config.position_embedding_type = "relative_key"
    tf.BertModel(config).save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        _load(str(tmp_path))


@pytest.mark.parametrize("variant", ["roberta", "xlmr-cls"])
def test_roberta_max_model_len_leaves_room_for_the_position_offset(model_dir, variant):
    """514 position rows, positions from pad_token_id + 1 = 2: 512 tokens fit
    (a 514-token prompt would read past the table, into its zero padding rows)."""
    path = model_dir(variant)
    args = dict(model=path, dtype="float32", device="cpu", runner="pooling")
    assert EngineArgs(**args).create_model_config().max_model_len == 512
    with pytest.raises(ValueError, match="max_model_len"):
        EngineArgs(**args, max_model_len=514).create_model_config()
    bert = EngineArgs(**{**args, "model": model_dir("bert")}).create_model_config()
    assert bert.max_model_len == 512  # BERT's positions start at 0: all 512 rows

"""Embeddings through the whole engine (V1 runner, runner="pooling") against
sentence-transformers on tiny random decoders saved as sentence-transformers
directories: Qwen3 with last-token pooling (Qwen3-Embedding style) and Llama
with mean pooling, both normalised. Also chunked prefill (long and short
inputs in one batch equal one-by-one), Matryoshka `dimensions`, token-level
outputs and the refusals."""

from __future__ import annotations

import pytest
import torch

from tests.models.language.pooling.st_utils import ENGINE, make_st_dir
from tests.models.zoo_utils import spy_preemptions
from vllm import LLM, PoolingParams

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores keys and values in fixed-size blocks. " * 6,
    "def hello(world):",
    "fox",
    "Paged attention stores keys and values in fixed-size blocks. " * 3 + "The end.",
]
COSINE_MIN = 0.9999


pytestmark = pytest.mark.usefixtures("in_process_engine")


@pytest.fixture(scope="module")
def qwen3_st(tmp_path_factory) -> str:
    return make_st_dir("qwen3", str(tmp_path_factory.mktemp("st-qwen3")), "lasttoken")


@pytest.fixture(scope="module")
def llama_st(tmp_path_factory) -> str:
    return make_st_dir("llama", str(tmp_path_factory.mktemp("st-llama")), "mean", seed=1)


def _st_encode(model_dir: str, texts: list[str]) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model_dir, device="cpu")
    return torch.as_tensor(st.encode(texts, convert_to_numpy=True)).float()


def _vectors(outputs) -> torch.Tensor:
    return torch.tensor([o.outputs.embedding for o in outputs])


def _assert_cosine(got: torch.Tensor, ref: torch.Tensor) -> None:
    assert got.shape == ref.shape
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    assert bool((cos >= COSINE_MIN).all()), cos.tolist()


@pytest.fixture(scope="module")
def qwen3_llm(qwen3_st):
    # Runner "auto" resolves to pooling from modules.json; small steps so the
    # long texts are prefilled in chunks (LAST pooling keeps chunked prefill on).
    llm = LLM(qwen3_st, max_num_batched_tokens=32, max_num_seqs=4, **ENGINE)
    yield llm
    llm.llm_engine.shutdown()


def test_qwen3_last_token_matches_sentence_transformers(qwen3_llm, qwen3_st):
    mc = qwen3_llm.model_config
    assert mc.runner_type == "pooling" and mc.convert_type == "embed"
    assert mc.pooler_config.seq_pooling_type == "LAST" and mc.pooler_config.use_activation is True
    sched = qwen3_llm.llm_engine.vllm_config.scheduler_config
    assert sched.enable_chunked_prefill and sched.max_num_batched_tokens == 32
    assert qwen3_llm.llm_engine.vllm_config.cache_config.enable_prefix_caching
    outs = qwen3_llm.embed(TEXTS, use_tqdm=False)
    assert max(len(o.prompt_token_ids) for o in outs) > 32  # some prompt ran in chunks
    _assert_cosine(_vectors(outs), _st_encode(qwen3_st, TEXTS))
    norms = _vectors(outs).norm(dim=-1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)


def test_chunked_batch_equals_one_by_one(qwen3_llm):
    batch = _vectors(qwen3_llm.embed(TEXTS, use_tqdm=False))
    single = torch.cat([_vectors(qwen3_llm.embed([t], use_tqdm=False)) for t in TEXTS])
    assert torch.allclose(batch, single, atol=1e-5), (batch - single).abs().max()
    # A repeat hits the prefix cache (the last token is always recomputed).
    again = _vectors(qwen3_llm.embed(TEXTS, use_tqdm=False))
    assert torch.allclose(batch, again, atol=1e-5)


def test_llama_mean_matches_sentence_transformers(llama_st):
    llm = LLM(llama_st, **ENGINE)
    mc = llm.model_config
    assert mc.pooler_config.seq_pooling_type == "MEAN"
    vconfig = llm.llm_engine.vllm_config
    # As upstream: MEAN pooling needs the whole prompt -> no chunking, no prefix cache.
    assert not vconfig.scheduler_config.enable_chunked_prefill
    assert not vconfig.cache_config.enable_prefix_caching
    _assert_cosine(_vectors(llm.embed(TEXTS, use_tqdm=False)), _st_encode(llama_st, TEXTS))
    llm.llm_engine.shutdown()


def test_mean_pooling_forced_chunks_joins_the_chunks(llama_st, monkeypatch):
    """Chunked prefill forced on with MEAN: the earlier chunks' hidden states
    wait in the request's PoolingStates and the mean covers the whole prompt;
    with 6 KV blocks (5 usable) for 5 requests some are preempted mid-prompt, and their
    kept chunks are dropped when they are recomputed."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # reach the scheduler
    llm = LLM(
        llama_st,
        enable_chunked_prefill=True,
        max_num_batched_tokens=64,
        long_prefill_token_threshold=16,  # long prompts advance 16 tokens a step, together
        max_num_seqs=4,
        num_gpu_blocks_override=6,
        **ENGINE,
    )
    preempted = spy_preemptions(llm)
    got = _vectors(llm.embed(TEXTS, use_tqdm=False))
    assert preempted, "no request was preempted: the case is not exercised"
    _assert_cosine(got, _st_encode(llama_st, TEXTS))
    llm.llm_engine.shutdown()


def test_pooler_config_overrides_and_matryoshka(qwen3_st):
    llm = LLM(
        qwen3_st,
        pooler_config={"pooling_type": "MEAN", "use_activation": False},
        hf_overrides={"matryoshka_dimensions": [16, 32]},
        **ENGINE,
    )
    assert llm.model_config.pooler_config.seq_pooling_type == "MEAN"
    full = _vectors(llm.embed(TEXTS[:2], use_tqdm=False))
    assert not torch.allclose(full.norm(dim=-1), torch.ones(2))  # use_activation=False kept
    short = _vectors(
        llm.embed(
            TEXTS[:2],
            pooling_params=PoolingParams(dimensions=16, use_activation=True),
            use_tqdm=False,
        )
    )
    ref = torch.nn.functional.normalize(full[:, :16], dim=-1)  # truncate, then normalise
    assert short.shape == (2, 16) and torch.allclose(short, ref, atol=1e-5)
    with pytest.raises(ValueError, match=r"only supports Matryoshka dimensions \[16, 32\]"):
        llm.embed(TEXTS[:1], pooling_params=PoolingParams(dimensions=8), use_tqdm=False)
    with pytest.raises(ValueError, match=r"only supports dimensions in range \[1, \d+\], got 0"):
        llm.embed(TEXTS[:1], pooling_params=PoolingParams(dimensions=0), use_tqdm=False)
    llm.llm_engine.shutdown()


def test_token_embed_and_encode(qwen3_llm, qwen3_st):
    import transformers as tf

    out = qwen3_llm.encode(TEXTS[:2], pooling_task="token_embed", use_tqdm=False)
    model = tf.AutoModel.from_pretrained(f"{qwen3_st}/_hf", dtype=torch.float32).eval()
    for o in out:
        with torch.no_grad():
            ref = model(torch.tensor([o.prompt_token_ids])).last_hidden_state[0]
        ref = torch.nn.functional.normalize(ref, dim=-1)
        assert o.outputs.data.shape == ref.shape  # one row per prompt token
        assert torch.allclose(o.outputs.data, ref, atol=1e-4)
    with pytest.raises(ValueError, match="pooling_task required"):
        qwen3_llm.encode(TEXTS[:1], use_tqdm=False)


def test_refusals(qwen3_llm, tiny_model_dir):
    with pytest.raises(ValueError, match="does not support Matryoshka embeddings"):
        qwen3_llm.embed(TEXTS[:1], pooling_params=PoolingParams(dimensions=16), use_tqdm=False)
    with pytest.raises(ValueError, match=r"Task 'classify' only supports \['use_activation'\]"):
        PoolingParams(dimensions=8).verify("classify")
    with pytest.raises(ValueError, match="classify"):
        qwen3_llm.classify(TEXTS[:1], use_tqdm=False)  # an embedder is no classifier
    assert qwen3_llm.embed([], use_tqdm=False) == []
    with pytest.raises(ValueError, match="At least one text element"):
        qwen3_llm.score([], TEXTS[:1])
    with pytest.raises(ValueError, match="1:1, 1:N or N:N"):
        qwen3_llm.score(TEXTS[:2], TEXTS[:3])
    with pytest.raises(ValueError, match="enable_chunked_processing"):
        LLM(
            tiny_model_dir("qwen3"),
            runner="pooling",
            pooler_config={"enable_chunked_processing": True},
            **ENGINE,
        )
    gen_dir = tiny_model_dir("qwen3")
    gen = LLM(gen_dir, **ENGINE)  # a plain causal LM: the generate runner
    with pytest.raises(ValueError, match=rf"only supported for pooling models; model '{gen_dir}'"):
        gen.embed(TEXTS[:1], use_tqdm=False)
    gen.llm_engine.shutdown()


def test_use_activation_is_the_embedding_normalisation(qwen3_llm):
    """As upstream v0.28: PoolingParams(use_activation=False) returns the raw
    pooled vector (the model's ST Normalize module skipped), True (default)
    its L2 normalisation; `normalize` is no field and the removed tasks
    `score` / `encode` are refused with upstream's messages."""
    raw = _vectors(
        qwen3_llm.embed(
            TEXTS[:2], pooling_params=PoolingParams(use_activation=False), use_tqdm=False
        )
    )
    normed = _vectors(qwen3_llm.embed(TEXTS[:2], use_tqdm=False))
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(2), atol=1e-3)
    assert torch.allclose(normed, torch.nn.functional.normalize(raw, dim=-1), atol=1e-5)
    with pytest.raises(TypeError, match="normalize"):
        PoolingParams(normalize=True)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="`score` task was removed; use `classify` instead."):
        PoolingParams(task="score")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`encode` task was removed; use `token_embed`"):
        qwen3_llm.encode(TEXTS[:1], pooling_task="encode")  # type: ignore[arg-type]
    assert "score" not in qwen3_llm.supported_tasks


def test_truncate_prompt_tokens(qwen3_llm):
    long = TEXTS[1]
    full = qwen3_llm.embed([long], use_tqdm=False)[0]
    cut = qwen3_llm.embed([long], truncate_prompt_tokens=7, use_tqdm=False)[0]
    assert cut.prompt_token_ids == full.prompt_token_ids[-7:]
    ref = qwen3_llm.embed([{"prompt_token_ids": full.prompt_token_ids[-7:]}], use_tqdm=False)[0]
    assert torch.allclose(torch.tensor(cut.outputs.embedding), torch.tensor(ref.outputs.embedding))


def test_convert_embed_on_a_causal_lm(tiny_model_dir):
    """A plain *ForCausalLM checkpoint with runner="pooling" and --convert
    embed: the LM head is dropped and the last token's state normalised."""
    import transformers as tf

    model_dir = tiny_model_dir("qwen3")
    llm = LLM(model_dir, runner="pooling", convert="embed", **ENGINE)
    assert llm.model_config.convert_type == "embed"
    assert llm.supported_tasks == ("embed", "token_embed")
    out = llm.embed(TEXTS[:2], use_tqdm=False)
    hf = tf.AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
    for o in out:
        with torch.no_grad():
            ref = hf(torch.tensor([o.prompt_token_ids])).last_hidden_state[0, -1]
        _assert_cosine(torch.tensor([o.outputs.embedding]), ref.unsqueeze(0))
    llm.llm_engine.shutdown()

"""Greedy parity with transformers' `generate` for RoPE-scaled checkpoints, on
prompts longer than the original context (original_max_position_embeddings /
max_position_embeddings kept tiny so the prompts stay short), under both model
runners: Llama with yarn and with dynamic NTK, Phi-3 with longrope (partial
rotary), DeepSeek-V2 with YaRN + mscale / mscale_all_dim (MLA). Each checkpoint
also checks that its scaling changes transformers' tokens (so parity is not
reached by ignoring it) and the max_model_len the engine derives from it."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.models.zoo_utils import ZOO
from tests.utils import TINY_SHAPES, TINY_VOCAB, make_tiny_tokenizer, model_greedy
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

_IDS = dict(vocab_size=TINY_VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
# Sharper attention than the 0.02 init gives, so positions decide the tokens.
_QK = ("q_proj.weight", "k_proj.weight", "qkv_proj.weight", "kv_a_proj_with_mqa.weight")
MAX_TOKENS = 12
ORIGINAL = 16
DYNAMIC_FACTOR = 8
_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}


def _phi3_rope() -> dict[str, Any]:
    rng = random.Random(0)
    return {  # 4 factors: head 16 * partial 0.5 / 2
        "rope_type": "longrope",
        "short_factor": [1.0 + rng.random() for _ in range(4)],
        "long_factor": [2.0 + 6.0 * rng.random() for _ in range(4)],
    }


def _build_llama(rope: dict, max_pos: int) -> Callable[[str], str]:
    import transformers as tf

    kwargs = dict(TINY_SHAPES, **_IDS, tie_word_embeddings=False)
    kwargs["max_position_embeddings"] = max_pos
    return lambda d: _save_hf(
        d, tf.LlamaConfig(**kwargs, rope_parameters=rope), tf.LlamaForCausalLM
    )


def _build_phi3(d: str) -> str:
    import transformers as tf

    return _save_hf(
        d,
        tf.Phi3Config(
            **dict(ZOO["phi3"].kwargs, max_position_embeddings=64),
            original_max_position_embeddings=ORIGINAL,
            rope_parameters=_phi3_rope(),
        ),
        tf.Phi3ForCausalLM,
    )


def _build_deepseek(d: str) -> str:
    import transformers as tf

    rope = dict(_YARN, mscale=2.0, mscale_all_dim=3.0)
    kwargs = dict(ZOO["deepseek_v2-lite"].kwargs, max_position_embeddings=64)
    model_dir = _save_hf(
        d, tf.DeepseekV2Config(**kwargs, rope_parameters=rope), tf.DeepseekV2ForCausalLM
    )
    return model_dir


def _save_hf(out_dir: str, config: Any, model_cls: Any) -> str:
    torch.manual_seed(0)
    model = model_cls(config).eval().to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
            if name.endswith(_QK):
                p.mul_(4.0)
            if name.endswith("mlp.gate.weight"):
                p.copy_(torch.randn_like(p) * 0.5)  # routers with real preferences
    model.config.dtype = torch.float32
    model.save_pretrained(out_dir, safe_serialization=True)
    make_tiny_tokenizer(out_dir)
    return out_dir


def _prewarm_dynamic(model: Any) -> None:
    """transformers' dynamic rope recomputes per length; run it once at the full
    length (max * factor), the state upstream's fixed table equals. Prompts are
    longer than max_position_embeddings, so it never resets to the plain base."""
    rotary = model.model.rotary_emb
    full = rotary.original_max_seq_len * DYNAMIC_FACTOR
    rotary(torch.zeros(1), torch.tensor([[full - 1]]))


# kind -> (builder, prompt lengths, derived max_model_len, hf model hook)
CASES: dict[str, tuple[Callable[[str], str], tuple[int, ...], int, Any]] = {
    "llama-yarn": (_build_llama(_YARN, 64), (17, 25, 40), 64, None),
    "llama-dynamic": (
        _build_llama({"rope_type": "dynamic", "factor": DYNAMIC_FACTOR}, 8),
        (17, 25, 40),
        64,
        _prewarm_dynamic,
    ),
    "phi3-longrope": (_build_phi3, (17, 25, 40), 64, None),
    "deepseek_v2-yarn": (_build_deepseek, (17, 25, 40), 64, None),
}


def _prompts(lens: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(1, 512) for _ in range(n)] for n in lens]


def _hf_greedy(model_dir: str, prompts: list[list[int]], hook: Any, **config_patch) -> list:
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    for k, v in config_patch.items():
        setattr(config, k, v)
    model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32)
    model.eval()
    if hook is not None:
        hook(model)
    return model_greedy(model, prompts, MAX_TOKENS)


@pytest.fixture(scope="module")
def rope_checkpoint(tmp_path_factory):
    """kind -> (model dir, transformers' greedy tokens), built once per module."""
    cache: dict[str, tuple[str, list[list[int]]]] = {}

    def get(kind: str) -> tuple[str, list[list[int]]]:
        if kind not in cache:
            build, lens, _, hook = CASES[kind]
            model_dir = build(str(tmp_path_factory.mktemp(kind)))
            prompts = _prompts(lens)
            expected = _hf_greedy(model_dir, prompts, hook)
            # The scaling matters: without it transformers' tokens change.
            theta = json.loads((Path(model_dir) / "config.json").read_text())
            plain = {"rope_type": "default", "rope_theta": _theta(theta)}
            if kind.startswith("phi3"):
                plain["partial_rotary_factor"] = 0.5
            assert _hf_greedy(model_dir, prompts, None, rope_parameters=plain) != expected
            cache[kind] = (model_dir, expected)
        return cache[kind]

    return get


def _theta(config: dict) -> float:
    return (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))


@pytest.mark.parametrize("runner", ["0", "1"])
@pytest.mark.parametrize("kind", list(CASES))
def test_rope_scaled_greedy_parity(rope_checkpoint, monkeypatch, kind, runner):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", runner)
    model_dir, expected = rope_checkpoint(kind)
    _, lens, derived_len, _ = CASES[kind]
    llm = LLM(model=model_dir, dtype="float32", seed=0, max_num_batched_tokens=64)
    assert llm.llm_engine.vllm_config.model_config.max_model_len == derived_len
    sp = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(lens)]
    outs = llm.generate(prompts, sp, use_tqdm=False)
    assert [list(o.outputs[0].token_ids) for o in outs] == expected


def test_longrope_short_factors_within_the_original_context(rope_checkpoint, monkeypatch):
    """max_model_len <= original: short factors, transformers' choice for short prompts."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model_dir, _ = rope_checkpoint("phi3-longrope")
    prompts = _prompts((5, 8))
    expected = _hf_greedy(model_dir, prompts, None)
    llm = LLM(model=model_dir, dtype="float32", seed=0, max_model_len=ORIGINAL)
    # Each sequence ends exactly at the original length.
    sps = [
        SamplingParams(temperature=0.0, max_tokens=ORIGINAL - len(p), ignore_eos=True)
        for p in prompts
    ]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], sps, use_tqdm=False)
    got = [list(o.outputs[0].token_ids) for o in outs]
    assert got == [e[: ORIGINAL - len(p)] for e, p in zip(expected, prompts)]

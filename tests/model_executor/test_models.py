"""Our Llama/Mistral/Qwen2/Qwen3 over the paged KV cache vs transformers (fp32)."""

from __future__ import annotations

import pytest
import torch

from tests.model_executor.paged_harness import PagedHarness
from tests.utils import make_tiny_model
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader import get_model

# (family, make_tiny_model overrides): the defaults plus the variants that
# change the code path (tied head, a sliding window shorter than the prompts).
VARIANTS = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    # Llama 3.1 rope scaling: with head_dim 16 and an original context of 64, the
    # 8 frequencies fall in all three bands (kept, interpolated, divided).
    "llama-rope-llama3": (
        "llama",
        {
            "rope_parameters": {
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama-rope-linear": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    ),
    "mistral-window": ("mistral", {"sliding_window": 8}),
    "qwen2": ("qwen2", {}),
    "qwen2-tied": ("qwen2", {"tie_word_embeddings": True}),
    "qwen3": ("qwen3", {}),
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    cache: dict[str, str] = {}

    def get(variant: str) -> str:
        if variant not in cache:
            kind, overrides = VARIANTS[variant]
            cache[variant] = make_tiny_model(
                kind, str(tmp_path_factory.mktemp(variant)), **overrides
            )
        return cache[variant]

    return get


def _load(model_dir: str, block_size: int = 8):
    config = EngineArgs(
        model=model_dir, dtype="float32", block_size=block_size, device="cpu"
    ).create_engine_config()
    return get_model(vllm_config=config), config


def _hf_logits(model_dir: str, token_ids: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([token_ids])).logits[0]


def _close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_prefill_then_decode_matches_transformers(model_dirs, variant):
    model_dir = model_dirs(variant)
    model, config = _load(model_dir)
    gen = torch.Generator().manual_seed(1)
    seq_a = torch.randint(0, 512, (26,), generator=gen).tolist()
    seq_b = torch.randint(0, 512, (30,), generator=gen).tolist()
    ref_a, ref_b = _hf_logits(model_dir, seq_a), _hf_logits(model_dir, seq_b)
    harness = PagedHarness(model, config)

    # Step 1: A's 20-token prompt in one prefill.
    (logits_a,) = harness.step([("a", seq_a[:20])])
    _close(logits_a, ref_a[:20])
    # Steps 2-3: A decodes while B's prompt arrives in two chunks (13 + 17).
    out = harness.step([("a", [seq_a[20]]), ("b", seq_b[:13])])
    _close(out[0], ref_a[20:21])
    _close(out[1], ref_b[:13])
    out = harness.step([("a", [seq_a[21]]), ("b", seq_b[13:])])
    _close(out[0], ref_a[21:22])
    _close(out[1], ref_b[13:])
    # Steps 4+: both decode token by token through the paged cache.
    for pos in range(22, 26):
        out = harness.step([("a", [seq_a[pos]])])
        _close(out[0], ref_a[pos : pos + 1])


def test_dummy_run_without_metadata_leaves_cache_untouched(model_dirs):
    from vllm.forward_context import set_forward_context

    model, config = _load(model_dirs("llama"))
    harness = PagedHarness(model, config)
    with torch.inference_mode(), set_forward_context(None, config):
        hidden = model(torch.tensor([1, 2, 3]), torch.arange(3))
    assert hidden.shape == (3, 64) and torch.isfinite(hidden).all()
    layers = config.compilation_config.static_forward_context.values()
    assert all(torch.count_nonzero(layer.kv_cache[0]) == 0 for layer in layers)
    assert model.compute_logits(hidden).shape == (3, 512)
    assert harness.block_size == 8


def test_weights_loaded_and_model_contract(model_dirs):
    model, config = _load(model_dirs("qwen2-tied"))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not model.training
    names = list(config.compilation_config.static_forward_context)
    assert names == ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    assert model.packed_modules_mapping["qkv_proj"] == ["q_proj", "k_proj", "v_proj"]
    ids = torch.tensor([5, 6])
    torch.testing.assert_close(model.embed_input_ids(ids), model.model.embed_tokens.weight[ids])
    # The default dtype is restored after building in the model dtype.
    assert torch.get_default_dtype() == torch.float32


def test_dummy_load_format_gives_random_weights(model_dirs):
    config = EngineArgs(
        model=model_dirs("llama"), dtype="float32", device="cpu", load_format="dummy"
    ).create_engine_config()
    model = get_model(vllm_config=config)
    w = model.model.embed_tokens.weight
    assert w.abs().max() <= 1e-3 and w.std() > 0
    # The body still computes something finite from those weights.
    harness = PagedHarness(model, config)
    (logits,) = harness.step([("r", [1, 2, 3])])
    assert torch.isfinite(logits).all()


def test_same_config_cannot_build_twice(model_dirs):
    model, config = _load(model_dirs("llama"))
    with pytest.raises(ValueError, match="Duplicate layer name"):
        get_model(vllm_config=config)


def test_unknown_architecture_lists_supported(model_dirs):
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        EngineArgs(
            model=model_dirs("llama"),
            dtype="float32",
            device="cpu",
            hf_overrides={"architectures": ["FooForCausalLM"]},
        ).create_engine_config()


def test_pytorch_bin_checkpoint_loads_like_safetensors(model_dirs, tmp_path):
    import shutil

    from safetensors.torch import load_file

    src = model_dirs("qwen3")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{src}/{name}", tmp_path / name)
    torch.save(load_file(f"{src}/model.safetensors"), tmp_path / "pytorch_model.bin")
    prompt = list(range(3, 40))
    logits = []
    for model_dir in (src, str(tmp_path)):
        model, config = _load(model_dir)
        logits.append(PagedHarness(model, config).step([("r", prompt)])[0])
    torch.testing.assert_close(logits[0], logits[1], atol=0, rtol=0)
    with pytest.raises(ValueError, match="safetensors"):
        config = EngineArgs(
            model=str(tmp_path), dtype="float32", device="cpu", load_format="safetensors"
        ).create_engine_config()
        get_model(vllm_config=config)

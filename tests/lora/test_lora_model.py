"""peft adapter loading (issue 18 item 3): LoRAModel.from_local_checkpoint
reads exactly peft's A, B and scaling for every targeted module of a tiny
random Llama, W + scaling * B @ A equals peft's merge_and_unload weight, and
bad adapters are refused with upstream's messages."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.lora.peft_utils import LLAMA_TARGETS, make_peft_adapter
from tests.utils import make_tiny_model
from vllm.config.lora import LoRAConfig
from vllm.lora.lora_model import LoRAModel
from vllm.lora.lora_weights import PackedLoRALayerWeights
from vllm.lora.peft_helper import PEFTHelper

EXPECTED = set(LLAMA_TARGETS)
MAX_POS = 512


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    return make_tiny_model("llama", str(tmp_path_factory.mktemp("lora-base")))


def _load(path: str, max_lora_rank: int = 16, expected: set[str] = EXPECTED) -> LoRAModel:
    helper = PEFTHelper.from_local_dir(path, MAX_POS)
    helper.validate_legal(LoRAConfig(max_lora_rank=max_lora_rank))  # type: ignore[arg-type]
    return LoRAModel.from_local_checkpoint(
        path, expected, helper, lora_model_id=1, device="cpu", dtype=torch.float32
    )


@pytest.mark.parametrize(
    "r,alpha,rslora,safe",
    [(8, 16, False, True), (16, 8, True, True), (8, 32, True, False)],
    ids=["r8", "r16-rslora", "r8-rslora-bin"],
)
def test_matches_peft_tensors_scaling_and_merge(base_dir, tmp_path, r, alpha, rslora, safe):
    path = str(tmp_path / "adapter")
    peft_model = make_peft_adapter(
        base_dir, path, r=r, lora_alpha=alpha, use_rslora=rslora, safe_serialization=safe
    )
    assert os.path.isfile(
        os.path.join(path, "adapter_model.safetensors" if safe else "adapter_model.bin")
    )
    lora = _load(path)
    assert lora.id == 1 and lora.rank == r
    expected_scaling = alpha / r**0.5 if rslora else alpha / r

    peft_modules = {
        name.removeprefix("base_model.model."): m
        for name, m in peft_model.named_modules()
        if hasattr(m, "lora_A") and "default" in m.lora_A
    }
    assert set(lora.loras) == set(peft_modules) and len(peft_modules) == 2 * len(LLAMA_TARGETS)
    base_weights = {n: m.base_layer.weight.detach().clone() for n, m in peft_modules.items()}
    for name, m in peft_modules.items():
        ours = lora.get_lora(name)
        assert ours is not None and ours.lora_a is not None and ours.lora_b is not None
        assert (
            ours.scaling == pytest.approx(m.scaling["default"]) == pytest.approx(expected_scaling)
        )
        torch.testing.assert_close(ours.lora_a, m.lora_A["default"].weight, rtol=0, atol=0)
        torch.testing.assert_close(ours.lora_b, m.lora_B["default"].weight, rtol=0, atol=0)
        assert (ours.input_dim, ours.output_dim) == (m.in_features, m.out_features)

    merged = dict(peft_model.merge_and_unload().named_modules())
    for name, w in base_weights.items():
        ours = lora.get_lora(name)
        assert ours is not None and ours.lora_a is not None and ours.lora_b is not None
        ours.optimize()  # folds scaling into B
        assert ours.scaling == 1
        torch.testing.assert_close(w + ours.lora_b @ ours.lora_a, merged[name].weight)


def test_pack_folds_each_slice_scaling(base_dir, tmp_path):
    path = str(tmp_path / "adapter")
    make_peft_adapter(base_dir, path, r=8, lora_alpha=24, target_modules=["q_proj", "v_proj"])
    lora = _load(path)
    prefix = "model.layers.0.self_attn."
    q, v = lora.get_lora(prefix + "q_proj"), lora.get_lora(prefix + "v_proj")
    assert q is not None and v is not None and q.lora_b is not None and v.lora_b is not None
    want_q, want_v = q.lora_b * 3.0, v.lora_b * 3.0
    packed = PackedLoRALayerWeights.pack([q, None, v])  # k has no LoRA
    assert packed.is_packed and packed.rank == 8
    assert packed.scaling == [1.0, None, 1.0] and packed.lora_alphas == [24, None, 24]
    b_slices: list = packed.lora_b  # type: ignore[assignment]
    assert b_slices[1] is None
    torch.testing.assert_close(b_slices[0], want_q)
    torch.testing.assert_close(b_slices[2], want_v)


def test_clone_shares_tensors_under_new_id(base_dir, tmp_path):
    path = str(tmp_path / "adapter")
    make_peft_adapter(base_dir, path, r=8, lora_alpha=8, target_modules=["o_proj"])
    lora = _load(path)
    other = lora.clone(7)
    assert other.id == 7 and other.loras is not lora.loras
    name = "model.layers.1.self_attn.o_proj"
    assert other.get_lora(name) is lora.get_lora(name)
    with pytest.raises(ValueError, match="greater than 0"):
        lora.clone(0)


def test_supported_modules_of_our_llama_unpack_to_peft_targets(base_dir):
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.lora.utils import get_supported_lora_modules
    from vllm.model_executor.models.llama import LlamaForCausalLM

    config = VllmConfig(model_config=ModelConfig(model=base_dir, dtype="float32"))
    with set_current_vllm_config(config):
        model = LlamaForCausalLM(vllm_config=config)
    supported = get_supported_lora_modules(model)
    assert {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"} <= set(supported)
    mapping = LlamaForCausalLM.packed_modules_mapping
    expected = {child for m in supported for child in mapping.get(m, [m])}
    assert expected >= EXPECTED


# ---- refusals --------------------------------------------------------------


def test_missing_path_and_non_peft_dir_are_not_found(base_dir, tmp_path):
    with pytest.raises(FileNotFoundError):
        PEFTHelper.from_local_dir(str(tmp_path / "nope"), MAX_POS)
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        PEFTHelper.from_local_dir(base_dir, MAX_POS)  # a model dir, not an adapter


def test_config_without_lora_fields_or_tensors(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"peft_type": "PREFIX_TUNING"}))
    with pytest.raises(ValueError, match="Missing required configuration fields"):
        PEFTHelper.from_local_dir(str(tmp_path), MAX_POS)
    cfg = {"peft_type": "LORA", "r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    helper = PEFTHelper.from_local_dir(str(tmp_path), MAX_POS)
    with pytest.raises(ValueError, match="doesn't contain tensors"):
        LoRAModel.from_local_checkpoint(str(tmp_path), EXPECTED, helper, device="cpu")


def test_rank_above_max_lora_rank(base_dir, tmp_path):
    path = str(tmp_path / "adapter")
    make_peft_adapter(base_dir, path, r=16, lora_alpha=16, target_modules=["q_proj"])
    with pytest.raises(ValueError, match="LoRA rank 16 is greater than max_lora_rank 8."):
        _load(path, max_lora_rank=8)


def test_unsupported_target_refused_by_name(base_dir, tmp_path):
    path = str(tmp_path / "adapter")
    make_peft_adapter(base_dir, path, r=8, lora_alpha=8, target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValueError, match=r"but received \['lm_head'\]"):
        _load(path)
    # A model that cannot adapt its MLP refuses an all-projections adapter,
    # naming each MLP module.
    path2 = str(tmp_path / "adapter2")
    make_peft_adapter(base_dir, path2, r=8, lora_alpha=8)
    attn_only = {"q_proj", "k_proj", "v_proj", "o_proj"}
    with pytest.raises(ValueError, match="model.layers.1.mlp.down_proj") as e:
        _load(path2, expected=attn_only)
    assert "self_attn" not in str(e.value)


def test_modules_to_save_dora_and_bias_refused(base_dir, tmp_path):
    path = str(tmp_path / "adapter")
    make_peft_adapter(
        base_dir, path, r=8, lora_alpha=8, target_modules=["q_proj"], modules_to_save=["lm_head"]
    )
    with pytest.raises(ValueError, match="vLLM only supports modules_to_save being None."):
        _load(path)
    helper = PEFTHelper.from_local_dir(path, MAX_POS)
    with pytest.raises(ValueError, match="modules_to_save"):
        LoRAModel.from_local_checkpoint(path, EXPECTED, helper, device="cpu")
    cfg = {"r": 32, "lora_alpha": 8, "target_modules": ["q_proj"], "use_dora": True, "bias": "all"}
    with pytest.raises(ValueError) as e:
        PEFTHelper.from_dict(cfg).validate_legal(LoRAConfig(max_lora_rank=16))
    assert str(e.value) == (
        "vLLM does not yet support DoRA. LoRA rank 32 is greater than max_lora_rank 16. "
        "Adapter bias is not supported."
    )


def test_truncated_checkpoint_refused(base_dir, tmp_path):
    path = str(tmp_path / "adapter")
    make_peft_adapter(base_dir, path, r=8, lora_alpha=8, target_modules=["q_proj"])
    file = os.path.join(path, "adapter_model.safetensors")
    tensors = load_file(file)
    dropped = next(k for k in tensors if k.endswith("lora_B.weight"))
    del tensors[dropped]
    save_file(tensors, file)
    with pytest.raises(ValueError, match="has no lora_B tensor"):
        _load(path)
    # A checkpoint whose tensors are not the config's rank.
    cfg_path = os.path.join(path, "adapter_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["r"] = 4
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    tensors[dropped] = torch.zeros(64, 8)
    save_file(tensors, file)
    with pytest.raises(ValueError, match="do not match the adapter's rank r=4"):
        _load(path)


def test_non_lora_tensor_refused(tmp_path):
    cfg = {"r": 8, "lora_alpha": 8, "target_modules": ["q_proj"]}
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    save_file(
        {"base_model.model.model.norm.weight": torch.ones(4)},
        tmp_path / "adapter_model.safetensors",
    )
    helper = PEFTHelper.from_local_dir(str(tmp_path), MAX_POS)
    with pytest.raises(ValueError, match="is unsupported LoRA weight"):
        LoRAModel.from_local_checkpoint(str(tmp_path), EXPECTED, helper, device="cpu")


def test_embedding_lora_layout_and_vocab_check(base_dir, tmp_path):
    path = str(tmp_path / "adapter")
    peft_model = make_peft_adapter(
        base_dir, path, r=8, lora_alpha=16, target_modules=["embed_tokens"]
    )
    helper = PEFTHelper.from_local_dir(path, MAX_POS)
    expected = EXPECTED | {"embed_tokens"}
    lora = LoRAModel.from_local_checkpoint(
        path, expected, helper, device="cpu", model_vocab_size=512
    )
    ours = lora.get_lora("model.embed_tokens")
    peft_emb = peft_model.base_model.model.model.embed_tokens
    assert ours is not None and lora.id >= 1  # id from the global counter
    # peft's embedding layout: A [r, vocab], B [hidden, r].
    torch.testing.assert_close(ours.lora_a, peft_emb.lora_embedding_A["default"], rtol=0, atol=0)
    torch.testing.assert_close(ours.lora_b, peft_emb.lora_embedding_B["default"], rtol=0, atol=0)
    assert ours.scaling == pytest.approx(peft_emb.scaling["default"])
    with pytest.raises(RuntimeError, match=r"embedding LoRA size\(512\) must be consistent"):
        LoRAModel.from_local_checkpoint(path, expected, helper, device="cpu", model_vocab_size=600)

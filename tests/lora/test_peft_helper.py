"""LoRAConfig validation, PEFTHelper (adapter_config.json -> rank, alpha,
scaling) and the LoRA name helpers, against upstream v0.28's rules and
messages."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from vllm.config.lora import LoRAConfig
from vllm.lora.peft_helper import PEFTHelper
from vllm.lora.utils import (
    get_adapter_absolute_path,
    get_captured_lora_counts,
    get_lora_id,
    is_base_embedding_weights,
    is_in_target_modules,
    is_supported_lora_module,
    parse_fine_tuned_lora_name,
)

# ---- LoRAConfig --------------------------------------------------------------


def test_lora_config_defaults_and_cpu_slots():
    import vllm.config

    assert vllm.config.LoRAConfig is LoRAConfig  # upstream's import path
    cfg = LoRAConfig()
    assert (cfg.max_lora_rank, cfg.max_loras, cfg.max_cpu_loras, cfg.lora_dtype) == (
        16,
        1,
        1,
        "auto",
    )
    assert LoRAConfig(max_loras=3).max_cpu_loras == 3
    assert LoRAConfig(max_loras=2, max_cpu_loras=5).max_cpu_loras == 5
    with pytest.raises(ValueError, match=r"max_cpu_loras \(1\) must be >= max_loras \(2\)."):
        LoRAConfig(max_loras=2, max_cpu_loras=1)
    with pytest.raises(ValueError, match="max_loras"):
        LoRAConfig(max_loras=0)


@pytest.mark.parametrize("rank", [0, 2, 24, 1024])
def test_lora_config_rank_must_be_listed(rank):
    with pytest.raises(ValueError, match=f"max_lora_rank \\({rank}\\) must be one of"):
        LoRAConfig(max_lora_rank=rank)  # type: ignore[arg-type]


def test_lora_config_dtype_resolution():
    class _Model:
        dtype = torch.float32

    cfg = LoRAConfig()
    cfg.verify_with_model_config(_Model())  # type: ignore[arg-type]
    assert cfg.lora_dtype is torch.float32
    cfg = LoRAConfig(lora_dtype="bfloat16")
    cfg.verify_with_model_config(_Model())  # type: ignore[arg-type]
    assert cfg.lora_dtype is torch.bfloat16
    assert LoRAConfig(lora_dtype=torch.float16).lora_dtype is torch.float16
    with pytest.raises(ValueError, match="lora_dtype"):
        LoRAConfig(lora_dtype="float32")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field,value",
    [
        ("default_mm_loras", {"image": "/a"}),
        ("enable_tower_connector_lora", True),
        ("enable_mixed_moe_lora_format", True),
        ("enable_moe_shared_loras", True),
    ],
)
def test_lora_config_unbuilt_fields_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"LoRAConfig.{field}"):
        LoRAConfig(**{field: value})


def test_lora_config_target_modules_and_hash():
    with pytest.raises(ValueError, match="target_modules"):
        LoRAConfig(target_modules="q_proj")  # type: ignore[arg-type]
    base = LoRAConfig().compute_hash()
    assert LoRAConfig(max_cpu_loras=4).compute_hash() == base  # CPU slots: same graph
    assert LoRAConfig(max_lora_rank=8).compute_hash() != base
    assert LoRAConfig(max_loras=2).compute_hash() != base
    a = LoRAConfig(target_modules=["o_proj", "qkv_proj"]).compute_hash()
    assert a == LoRAConfig(target_modules=["qkv_proj", "o_proj"]).compute_hash() != base


# ---- PEFTHelper --------------------------------------------------------------


@pytest.mark.parametrize("rslora", [False, True])
def test_peft_helper_scaling(rslora):
    h = PEFTHelper.from_dict(
        {"r": 16, "lora_alpha": 8, "target_modules": ["q_proj"], "use_rslora": rslora}
    )
    assert h.vllm_lora_scaling_factor == pytest.approx(8 / math.sqrt(16) if rslora else 8 / 16)


def test_peft_helper_reads_adapter_config(tmp_path):
    cfg = {
        "peft_type": "LORA",
        "base_model_name_or_path": "x",
        "r": 8,
        "lora_alpha": 32,
        "lora_dropout": 0.1,
        "target_modules": ["v_proj", "q_proj"],
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    (tmp_path / "adapter_config.json").write_text(json.dumps(cfg))
    h = PEFTHelper.from_local_dir(str(tmp_path), 4096)
    assert (h.r, h.lora_alpha, h.target_modules) == (8, 32, ["v_proj", "q_proj"])
    assert h.vllm_max_position_embeddings == 4096 and h.vllm_lora_scaling_factor == 4.0
    h.validate_legal(LoRAConfig(max_lora_rank=8))
    with pytest.raises(ValueError, match="tensorizer"):
        PEFTHelper.from_local_dir(str(tmp_path), 4096, {"tensorizer_dir": "/x"})
    (tmp_path / "adapter_config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        PEFTHelper.from_local_dir(str(tmp_path), 4096)


@pytest.mark.parametrize("r", [0, -4])
def test_peft_helper_rank_must_be_positive(r):
    with pytest.raises(ValueError, match=f"LoRA rank `r` must be a positive integer, got {r}."):
        PEFTHelper.from_dict({"r": r, "lora_alpha": 8, "target_modules": ["q_proj"]})


def test_peft_helper_missing_fields_named():
    with pytest.raises(ValueError, match="Missing required configuration fields") as e:
        PEFTHelper.from_dict({"r": 8})
    assert "lora_alpha" in str(e.value) and "target_modules" in str(e.value)


# ---- utils -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,module,is_a",
    [
        (
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
            "model.layers.0.self_attn.q_proj",
            True,
        ),
        (
            "base_model.model.model.layers.3.mlp.down_proj.lora_B.weight",
            "model.layers.3.mlp.down_proj",
            False,
        ),
        ("base_model.model.model.embed_tokens.lora_embedding_A", "model.embed_tokens", True),
        ("base_model.model.model.embed_tokens.lora_embedding_B", "model.embed_tokens", False),
        ("language_model.layers.1.o_proj.lora_A.weight", "language_model.layers.1.o_proj", True),
    ],
)
def test_parse_fine_tuned_lora_name(name, module, is_a):
    assert parse_fine_tuned_lora_name(name) == (module, is_a)


def test_parse_fine_tuned_lora_name_mapper_and_refusals():
    class Mapper:
        def _map_name(self, key: str) -> str | None:
            if key.startswith("drop."):
                return None
            return key.replace("model.", "language_model.model.", 1)

    name = "base_model.model.model.layers.0.q_proj.lora_B.weight"
    assert parse_fine_tuned_lora_name(name, Mapper()) == (
        "language_model.model.layers.0.q_proj",
        False,
    )
    with pytest.raises(ValueError, match="cannot be None"):
        parse_fine_tuned_lora_name("drop.x.lora_A.weight", Mapper())
    for bad in ("base_model.model.lm_head.weight", "base_model.model.q_proj.lora_A.bias"):
        with pytest.raises(ValueError, match="is unsupported LoRA weight"):
            parse_fine_tuned_lora_name(bad)


def test_module_filters():
    assert is_base_embedding_weights("base_model.model.model.embed_tokens.base_layer.weight")
    assert is_base_embedding_weights("base_model.model.lm_head.base_layer.weight")
    assert not is_base_embedding_weights("base_model.model.lm_head.lora_A.weight")
    assert is_supported_lora_module("model.layers.0.self_attn.o_proj", ["o_proj"])
    assert not is_supported_lora_module("model.layers.0.self_attn.xo_proj", ["o_proj"])
    assert is_supported_lora_module("lm_head", ["lm_head"])
    packed = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert is_in_target_modules("model.layers.0.self_attn.q_proj", None)
    assert is_in_target_modules("a.o_proj", ["o_proj"]) and not is_in_target_modules(
        "a.o_proj", ["q"]
    )
    assert is_in_target_modules("a.qkv_proj", ["k_proj"], packed)  # child lists the parent
    assert is_in_target_modules("a.v_proj", ["qkv_proj"], packed)  # parent lists the child
    assert not is_in_target_modules("a.qkv_proj", ["o_proj"], packed)


def test_ids_counts_and_paths(tmp_path, monkeypatch):
    a, b = get_lora_id(), get_lora_id()
    assert b == a + 1 and a >= 1
    assert get_captured_lora_counts(4, False) == [5]
    assert get_captured_lora_counts(4, True) == [1, 2, 4, 5]
    assert get_captured_lora_counts(6, True) == [1, 2, 4, 7]
    assert get_adapter_absolute_path("/abs/x") == "/abs/x"
    assert get_adapter_absolute_path("~/x") == os.path.expanduser("~/x")
    (tmp_path / "rel").mkdir()
    monkeypatch.chdir(tmp_path)
    assert get_adapter_absolute_path("rel") == str(tmp_path / "rel")
    assert get_adapter_absolute_path("org/not-here") == "org/not-here"

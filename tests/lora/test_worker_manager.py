"""LoRA worker manager: bad adapters are refused with a clear error naming
the problem, and a refused load changes nothing (issue 18, bad input).

Missing path or a directory without adapter_config.json:
LoRAAdapterNotFoundError (upstream's 404 message). The rest: ValueError —
rank above max_lora_rank, DoRA, modules_to_save, target modules the model
cannot adapt (MoE-style expert names included), an adapter of another base
model (other shapes, or modules the model does not have), added vocabulary,
invalid adapter_config.json."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.lora.manager_utils import build_adapters, lora_model_and_worker, request
from tests.lora.peft_utils import make_peft_adapter
from tests.utils import make_tiny_model
from vllm.exceptions import LoRAAdapterNotFoundError, VLLMNotFoundError

SAFETENSORS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    return make_tiny_model("llama", str(tmp_path_factory.mktemp("wm-base")))


@pytest.fixture(scope="module")
def good(base_dir, tmp_path_factory) -> str:
    return build_adapters(base_dir, str(tmp_path_factory.mktemp("wm-good")), {"good": (8, 1)})[
        "good"
    ]


@pytest.fixture(scope="module")
def setup(base_dir):
    return lora_model_and_worker(base_dir, max_loras=2, max_cpu_loras=2)


@pytest.fixture
def worker(setup, good):
    """The worker with one good adapter (id 1) active."""
    _, worker, _ = setup
    worker.remove_all_adapters()
    worker.set_active_adapters({request("good", 1, good)}, None)
    return worker


def _copy(src: str, dst: str, **config_changes) -> str:
    shutil.copytree(src, dst)
    path = os.path.join(dst, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(config_changes)
    with open(path, "w") as f:
        json.dump(config, f)
    return dst


def _refused(worker, path: str, exc: type[Exception], match: str) -> None:
    """Loading `path` (as id 7) raises `exc` matching `match`; nothing changes."""
    manager = worker._adapter_manager
    before = (worker.list_adapters(), list(manager.lora_index_to_id))
    with pytest.raises(exc, match=match):
        worker.add_adapter(request("bad", 7, path))
    with pytest.raises(exc, match=match):
        worker.set_active_adapters({request("bad", 7, path)}, None)
    assert (worker.list_adapters(), list(manager.lora_index_to_id)) == before


def test_missing_path_and_non_peft_dir_not_found(worker, tmp_path):
    missing = str(tmp_path / "nowhere")
    _refused(
        worker,
        missing,
        LoRAAdapterNotFoundError,
        f"Loading lora bad failed: No adapter found for {missing}",
    )
    not_peft = tmp_path / "not_peft"
    not_peft.mkdir()
    (not_peft / "config.json").write_text("{}")
    _refused(worker, str(not_peft), VLLMNotFoundError, "No adapter found for")


def test_invalid_config_json(worker, tmp_path):
    bad = tmp_path / "bad_json"
    bad.mkdir()
    (bad / "adapter_config.json").write_text("this is not json")
    _refused(worker, str(bad), ValueError, "adapter_config.json is not valid JSON")


@pytest.mark.parametrize(
    "changes,match",
    [
        ({"r": 32}, "LoRA rank 32 is greater than max_lora_rank 16"),
        ({"use_dora": True}, "vLLM does not yet support DoRA"),
        ({"modules_to_save": ["lm_head"]}, "vLLM only supports modules_to_save being None"),
        ({"bias": "all"}, "Adapter bias is not supported"),
    ],
    ids=["rank", "dora", "modules_to_save", "bias"],
)
def test_config_refusals(worker, good, tmp_path, changes, match):
    _refused(worker, _copy(good, str(tmp_path / "a"), **changes), ValueError, match)


def test_unsupported_target_modules_named(worker, good, tmp_path):
    """Tensors of modules the model cannot adapt (a MoE expert's w1, a
    made-up projection) are refused naming them."""
    path = _copy(good, str(tmp_path / "experts"))
    tensors = load_file(os.path.join(path, SAFETENSORS))
    renamed = {
        k.replace("mlp.down_proj", "mlp.experts.0.w1").replace(
            "self_attn.o_proj", "self_attn.foo"
        ): v
        for k, v in tensors.items()
    }
    save_file(renamed, os.path.join(path, SAFETENSORS))
    _refused(
        worker, path, ValueError, r"expected target modules in .* but received .*experts\.0\.w1"
    )


def test_adapter_of_another_base_model(worker, base_dir, tmp_path):
    """Same module names, other sizes (hidden 96, or a 640-token LM head) ->
    refused by shape; more layers than the model -> refused by module name."""
    wide = make_tiny_model("llama", str(tmp_path / "wide"), hidden_size=96)
    path = str(tmp_path / "wide_adapter")
    make_peft_adapter(wide, path, r=8, lora_alpha=16)
    _refused(worker, path, ValueError, r"do not fit the model's layer .* different base model")

    deep = make_tiny_model("llama", str(tmp_path / "deep"), num_hidden_layers=3)
    path = str(tmp_path / "deep_adapter")
    make_peft_adapter(deep, path, r=8, lora_alpha=16, target_modules=["o_proj"])
    _refused(worker, path, ValueError, r"targets module model\.layers\.2\.self_attn\.o_proj")

    big_vocab = make_tiny_model("llama", str(tmp_path / "vocab"), vocab_size=640)
    path = str(tmp_path / "vocab_adapter")
    make_peft_adapter(big_vocab, path, r=8, lora_alpha=16, target_modules=["lm_head"])
    _refused(worker, path, ValueError, r"LoRA module lm_head: .* \(input 64, output 512\)")


def test_added_vocabulary_refused(worker, good, tmp_path):
    path = _copy(good, str(tmp_path / "added"))
    with open(os.path.join(path, "added_tokens.json"), "w") as f:
        json.dump({"<new>": 512}, f)
    _refused(worker, path, ValueError, "adds tokens to the vocabulary")
    # Added tokens inside the base vocabulary are not extra vocabulary.
    inside = _copy(good, str(tmp_path / "inside"))
    with open(os.path.join(inside, "added_tokens.json"), "w") as f:
        json.dump({"<eot>": 3}, f)
    assert worker.add_adapter(request("inside", 8, inside))
    worker.remove_adapter(8)
    legacy = _copy(good, str(tmp_path / "legacy"))
    save_file(
        {"input_embeddings": torch.zeros(2, 64)}, os.path.join(legacy, "new_embeddings.safetensors")
    )
    _refused(worker, legacy, ValueError, "adds tokens to the vocabulary")


def test_load_inplace_replaces_weights(setup, base_dir, good, tmp_path):
    model, worker, _ = setup
    worker.remove_all_adapters()
    worker.set_active_adapters({request("good", 1, good)}, None)
    manager = worker._adapter_manager
    other = str(tmp_path / "other")
    make_peft_adapter(base_dir, other, r=8, lora_alpha=16, seed=5)
    old = manager.get_adapter(1)
    # Same id, not in place: already loaded, nothing reloaded.
    assert worker.add_adapter(request("good", 1, other)) is True
    assert manager.get_adapter(1) is old
    assert worker.add_adapter(request("good", 1, other, load_inplace=True)) is True
    new = manager.get_adapter(1)
    assert new is not old and 1 in manager.lora_index_to_id
    name = "model.layers.0.self_attn.o_proj"
    assert not torch.equal(new.get_lora(name).lora_a, old.get_lora(name).lora_a)


def test_mixtral_style_is_3d_flag_refused(worker, good):
    with pytest.raises(ValueError, match="is_3d_lora_weight"):
        worker.add_adapter(request("moe", 9, good, is_3d_lora_weight=True))
    assert 9 not in worker.list_adapters()

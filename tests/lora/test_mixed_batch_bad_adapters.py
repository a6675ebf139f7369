"""Bad adapters offline (issue 18, "what it must show", third point): a
missing path, a directory that is no peft adapter, a rank above
max_lora_rank, target modules the model cannot adapt, an adapter of another
base model. Each LLM.generate call naming one raises a typed error that
says what is wrong, loads nothing (list_loras unchanged), and the same
engine (engine core in its own process) then still serves a good adapter and
the base model with their exact tokens. LoRA with torch.compile (not built)
is refused at start-up on both runners."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tests.lora.lora_engine_utils import (
    PROMPTS,
    build_base_and_adapters,
    greedy_tokens,
    lora_llm,
    lora_request,
    merged_greedy,
)
from tests.lora.peft_utils import make_peft_adapter
from tests.utils import make_tiny_model
from vllm.exceptions import LoRAAdapterNotFoundError
from vllm.lora.request import LoRARequest

SAFETENSORS = "adapter_model.safetensors"


def _copy(src: str, dst: str, **config_changes) -> str:
    shutil.copytree(src, dst)
    path = os.path.join(dst, "adapter_config.json")
    with open(path) as f:
        config = json.load(f)
    config.update(config_changes)
    with open(path, "w") as f:
        json.dump(config, f)
    return dst


def _bad_adapters(root: str, good: str) -> dict[str, tuple[str, type[Exception], str]]:
    """name -> (path, the error type, a regex of its message)."""
    missing = os.path.join(root, "nowhere")
    not_peft = os.path.join(root, "not_peft")
    os.makedirs(not_peft)
    with open(os.path.join(not_peft, "config.json"), "w") as f:
        f.write("{}")
    rank32 = _copy(good, os.path.join(root, "rank32"), r=32)
    foreign = _copy(good, os.path.join(root, "foreign_targets"))
    tensors = load_file(os.path.join(foreign, SAFETENSORS))
    renamed = {k.replace("self_attn.o_proj", "self_attn.foo_proj"): v for k, v in tensors.items()}
    save_file(renamed, os.path.join(foreign, SAFETENSORS))
    wide = make_tiny_model("llama", os.path.join(root, "wide"), hidden_size=96)
    other_base = os.path.join(root, "other_base")
    make_peft_adapter(wide, other_base, r=8, lora_alpha=16)
    return {
        "missing": (missing, LoRAAdapterNotFoundError, f"No adapter found for {missing}"),
        "not_peft": (not_peft, LoRAAdapterNotFoundError, "No adapter found for"),
        "rank32": (rank32, ValueError, "LoRA rank 32 is greater than max_lora_rank 16"),
        "foreign": (foreign, ValueError, r"foo_proj"),
        "other_base": (other_base, ValueError, r"different base model"),
    }


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("lora-bad"))
    base, paths = build_base_and_adapters(root)
    bad = _bad_adapters(root, paths["r8"])
    expected = {
        "r8": merged_greedy(base, paths["r8"], PROMPTS[:1], 8),
        None: merged_greedy(base, None, PROMPTS[:1], 8),
    }
    return base, paths, bad, expected


@pytest.fixture(scope="module")
def llm(setup):
    base = setup[0]
    with lora_llm("v1", base, max_loras=2) as engine:
        yield engine


@pytest.mark.parametrize("kind", ["missing", "not_peft", "rank32", "foreign", "other_base"])
def test_bad_adapter_refused_engine_keeps_serving(llm, setup, kind):
    _, paths, bad, expected = setup
    path, exc, match = bad[kind]
    engine = llm.llm_engine
    assert greedy_tokens(llm, PROMPTS[:1], [lora_request("r8", paths)]) == expected["r8"]
    loaded = engine.list_loras()
    with pytest.raises(exc, match=match):
        greedy_tokens(llm, PROMPTS[:1], [LoRARequest(f"bad-{kind}", 50, path)])
    assert engine.list_loras() == loaded  # nothing loaded, nothing evicted
    # The same engine serves on: a good adapter next to the base model.
    r8 = lora_request("r8", paths)
    assert greedy_tokens(llm, PROMPTS[:1] * 2, [r8, None]) == expected["r8"] + expected[None]
    # add_lora refuses it the same way.
    with pytest.raises(exc, match=match):
        engine.add_lora(LoRARequest(f"bad-{kind}", 50, path))
    assert 50 not in engine.list_loras()


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_lora_with_torch_compile_refused(setup, runner):
    """torch.compile of the LoRA layers is not built: refused at start-up,
    naming the flag and the mode."""
    with (
        pytest.raises(NotImplementedError, match=r"--enable-lora.*compilation_config\.mode"),
        lora_llm(runner, setup[0], in_process=True, compilation_config={"mode": 3}),
    ):
        pass

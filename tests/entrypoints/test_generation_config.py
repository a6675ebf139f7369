"""generation_config="auto": the model's generation_config.json supplies the
default sampling parameters and extra EOS ids; "vllm" ignores it."""

from __future__ import annotations

import json
import shutil

import pytest

from vllm import LLM, SamplingParams

GEN_CONFIG = {
    "eos_token_id": [0, 77],
    "temperature": 0.0,
    "top_k": 7,
    "top_p": 0.9,
    "repetition_penalty": 1.25,
    "max_new_tokens": 5,
}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gen-config-llama")
    shutil.copytree(tiny_model_dir("llama"), out, dirs_exist_ok=True)
    with open(out / "generation_config.json", "w") as f:
        json.dump(GEN_CONFIG, f)
    return str(out)


def _llm(model_dir: str, monkeypatch, **kwargs) -> LLM:
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    return LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=64,
        kv_cache_memory_bytes=8 * 2**20,
        seed=0,
        **kwargs,
    )


def test_generation_config_defaults_and_eos_ids(model_dir, monkeypatch):
    llm = _llm(model_dir, monkeypatch)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.top_k, defaults.top_p) == (0.0, 0, 1.0)  # greedy
    assert defaults.repetition_penalty == 1.25 and defaults.max_tokens == 5
    prompt = {"prompt_token_ids": [9, 8, 7, 6]}
    (out,) = llm.generate(prompt, use_tqdm=False)  # no params: the defaults
    (explicit,) = llm.generate(
        prompt,
        SamplingParams(temperature=0.0, max_tokens=5, repetition_penalty=1.25),
        use_tqdm=False,
    )
    assert out.outputs[0].token_ids == explicit.outputs[0].token_ids
    assert len(out.outputs[0].token_ids) == 5
    # The extra EOS id of generation_config.json stops generation like a stop id.
    (stopped,) = llm.generate(
        prompt, SamplingParams(temperature=0.0, max_tokens=5, logit_bias={77: 50.0}), use_tqdm=False
    )
    completion = stopped.outputs[0]
    assert completion.token_ids == [77]
    assert completion.finish_reason == "stop" and completion.stop_reason == 77
    (ignored,) = llm.generate(
        prompt,
        SamplingParams(temperature=0.0, max_tokens=3, logit_bias={77: 50.0}, ignore_eos=True),
        use_tqdm=False,
    )
    assert ignored.outputs[0].token_ids == [77, 77, 77]


def test_generation_config_vllm_ignores_the_file(model_dir, monkeypatch):
    llm = _llm(model_dir, monkeypatch, generation_config="vllm")
    defaults = llm.get_default_sampling_params()
    assert defaults.temperature == 1.0 and defaults.max_tokens == 16
    assert defaults.repetition_penalty == 1.0

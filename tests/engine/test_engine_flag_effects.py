"""Engine flags whose effect no other test shows (rows of
tests/entrypoints/test_flag_audit.py): each test sets the flag and checks what
it changes in a real engine or in the loaded parts."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from tests.utils import TINY_VOCAB, make_tiny_tokenizer
from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.inputs import TokensPrompt
from vllm.transformers_utils.tokenizer import cached_tokenizer_from_config, get_tokenizer
from vllm.usage.usage_lib import UsageContext

PROMPT = [(5 * j) % 400 + 1 for j in range(70)]  # two blocks of 32, and 6 tokens


def _llm(model: str, **kwargs) -> LLM:
    """An in-process LLM (its scheduler is reachable) with a small KV cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return LLM(
            model=model,
            dtype="float32",
            max_model_len=128,
            kv_cache_memory_bytes=8 * 2**20,
            **kwargs,
        )


@pytest.fixture(scope="module")
def flagged_llm(tiny_model_dir) -> LLM:
    """One engine with several non-default flags; each test checks one of them."""
    return _llm(
        tiny_model_dir("llama"),
        skip_tokenizer_init=True,
        disable_log_stats=False,
        max_logprobs=2,
        block_size=32,
        prefix_caching_hash_algo="xxhash",
        seed=0,
    )


# ---- tokenizer / tokenizer_mode / trust_remote_code -------------------------------------
def test_tokenizer_flag_picks_the_tokenizer(tiny_model_dir, tmp_path):
    make_tiny_tokenizer(str(tmp_path), vocab_size=300)
    model = tiny_model_dir("llama")
    config = EngineArgs(model=model, tokenizer=str(tmp_path)).create_engine_config()
    assert config.model_config.tokenizer == str(tmp_path)
    assert len(cached_tokenizer_from_config(config.model_config)) == 300
    default = EngineArgs(model=model).create_engine_config()
    assert len(cached_tokenizer_from_config(default.model_config)) == TINY_VOCAB


def test_tokenizer_modes(tiny_model_dir):
    model = tiny_model_dir("llama")
    for mode in ("auto", "hf"):
        assert get_tokenizer(model, tokenizer_mode=mode).is_fast
    # A tokenizer.json-only folder has no slow tokenizer: refused, not ignored.
    with pytest.raises(ValueError, match="tokenizer_mode='slow'"):
        get_tokenizer(model, tokenizer_mode="slow")
    for mode in ("mistral", "custom", "fastest"):
        with pytest.raises(ValueError, match=f"tokenizer_mode='{mode}'"):
            EngineArgs(model=model, tokenizer_mode=mode).create_engine_config()


_REMOTE_CONFIG = """from transformers import LlamaConfig


class RemoteLlamaConfig(LlamaConfig):
    model_type = "remote_llama"
"""


def test_trust_remote_code(tiny_model_dir, tmp_path):
    """A config class shipped as code in the checkpoint loads only when trusted."""
    model = tmp_path / "remote"
    shutil.copytree(tiny_model_dir("llama"), model)
    (model / "configuration_remote.py").write_text(_REMOTE_CONFIG)
    config = json.loads((model / "config.json").read_text())
    config.update(
        model_type="remote_llama", auto_map={"AutoConfig": "configuration_remote.RemoteLlamaConfig"}
    )
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code"):
        EngineArgs(model=str(model)).create_engine_config()
    vllm_config = EngineArgs(model=str(model), trust_remote_code=True).create_engine_config()
    assert type(vllm_config.model_config.hf_config).__name__ == "RemoteLlamaConfig"


# ---- one engine, several flags -------------------------------------------------------------
def test_skip_tokenizer_init(flagged_llm):
    sp = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    out = flagged_llm.generate(TokensPrompt(prompt_token_ids=PROMPT[:8]), sp, use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4 and out[0].outputs[0].text == ""
    with pytest.raises(ValueError):
        flagged_llm.generate("a text prompt needs the tokenizer", sp, use_tqdm=False)


def test_log_stats_report_request_metrics(flagged_llm, seeded_llm):
    prompt = TokensPrompt(prompt_token_ids=PROMPT[:8])
    sp = SamplingParams(temperature=0.0, max_tokens=2)
    out = flagged_llm.generate(prompt, sp, use_tqdm=False)
    assert out[0].metrics is not None and out[0].metrics.arrival_time > 0
    # LLM's default (disable_log_stats=True) keeps no per-request stats.
    assert seeded_llm.generate(prompt, sp, use_tqdm=False)[0].metrics is None


def test_max_logprobs_caps_requests(flagged_llm):
    prompt = TokensPrompt(prompt_token_ids=PROMPT[:8])
    out = flagged_llm.generate(prompt, SamplingParams(max_tokens=2, logprobs=2), use_tqdm=False)
    assert all(len(lp) >= 2 for lp in out[0].outputs[0].logprobs)
    with pytest.raises(ValueError, match="greater than max allowed: 2"):
        flagged_llm.generate(prompt, SamplingParams(max_tokens=2, logprobs=3), use_tqdm=False)


def test_block_size_and_hash_algo_reach_the_kv_cache(flagged_llm, monkeypatch):
    core = flagged_llm.llm_engine.engine_core.engine_core
    assert core.scheduler.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size == 32
    added = []
    real_add = core.scheduler.add_request
    monkeypatch.setattr(
        core.scheduler, "add_request", lambda request: (added.append(request), real_add(request))[1]
    )
    sp = SamplingParams(temperature=0.0, max_tokens=1)
    flagged_llm.generate(TokensPrompt(prompt_token_ids=PROMPT), sp, use_tqdm=False)
    again = flagged_llm.generate(TokensPrompt(prompt_token_ids=PROMPT), sp, use_tqdm=False)
    # 70 prompt tokens: two full 32-token blocks, hashed with xxh3-128 (16 bytes;
    # sha256 would give 32), and the second request reuses both.
    hashes = added[0].block_hashes
    assert len(hashes) == 2 and all(len(bytes(h)) == 16 for h in hashes)
    assert again[0].num_cached_tokens == 64


@pytest.fixture(scope="module")
def seeded_llm(tiny_model_dir) -> LLM:
    return _llm(tiny_model_dir("llama"), seed=7)


def test_engine_seed_drives_unseeded_sampling(tiny_model_dir):
    """Requests without a seed draw from the engine's generator, seeded by --seed."""

    def sample(llm: LLM) -> list[int]:
        sp = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
        out = llm.generate(TokensPrompt(prompt_token_ids=PROMPT[:8]), sp, use_tqdm=False)
        return list(out[0].outputs[0].token_ids)

    model = tiny_model_dir("llama")
    first = sample(_llm(model, seed=7))  # fresh engines: nothing drawn before
    assert sample(_llm(model, seed=7)) == first
    assert sample(_llm(model, seed=8)) != first


# ---- device ---------------------------------------------------------------------------------
def test_device_flag(tiny_model_dir):
    model = tiny_model_dir("llama")
    config = EngineArgs(model=model, device="cpu").create_engine_config(UsageContext.LLM_CLASS)
    assert config.device_config.device_type == "cpu"
    # The CPU batch defaults follow the device asked for.
    assert config.scheduler_config.max_num_batched_tokens == 4096
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device='cuda'"):
            EngineArgs(model=model, device="cuda").create_engine_config()


# ---- structured_outputs_config.disable_additional_properties --------------------------
def test_disable_additional_properties(tmp_path):
    """Asked for, a JSON object gets no property the schema does not list (the
    only behaviour of the built xgrammar backend, as upstream's xgrammar): after
    '{"a": 1' only the closing brace (or space) may follow, not a comma; a schema
    that allows additionalProperties explicitly still gets its comma."""
    from vllm.config import StructuredOutputsConfig, VllmConfig
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions as Opt
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    tokenizer = make_tiny_tokenizer(str(tmp_path))
    config = VllmConfig(
        structured_outputs_config=StructuredOutputsConfig(disable_additional_properties=True)
    )
    backend = XgrammarBackend(config, tokenizer=tokenizer, vocab_size=TINY_VOCAB)
    comma = tokenizer.convert_tokens_to_ids(",")

    def comma_allowed(schema: dict) -> bool:
        grammar = backend.compile_grammar(Opt.JSON, json.dumps(schema))
        assert grammar.accept_tokens("r", tokenizer.encode('{"a": 1'))
        bitmask = torch.zeros(1, (TINY_VOCAB + 31) // 32, dtype=torch.int32)
        grammar.fill_bitmask(bitmask, 0)
        return bool((bitmask[0, comma // 32].item() >> (comma % 32)) & 1)

    props = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not comma_allowed(props)
    assert comma_allowed({**props, "additionalProperties": True})


def test_disable_fallback(tmp_path):
    """disable_fallback=True: a constraint the backend cannot take fails instead of
    moving to another backend. xgrammar is the only backend built, so there is no
    fallback to disable: such a constraint is refused with or without the flag."""
    from vllm.config import StructuredOutputsConfig, VllmConfig
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions as Opt
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    tokenizer = make_tiny_tokenizer(str(tmp_path))
    for disable_fallback in (True, False):
        config = VllmConfig(
            structured_outputs_config=StructuredOutputsConfig(
                backend="auto", disable_fallback=disable_fallback
            )
        )
        backend = XgrammarBackend(config, tokenizer=tokenizer, vocab_size=TINY_VOCAB)
        with pytest.raises(ValueError):
            backend.compile_grammar(Opt.REGEX, "(unclosed")


# ---- quantization ------------------------------------------------------------------------
def test_quantization_is_gguf_only(tiny_model_dir, embedded_model_path, tmp_path):
    """-q gguf names what a .gguf file is; any other method, and a checkpoint
    quantized with a method not built here, are refused before a weight is read."""
    config = EngineArgs(model=embedded_model_path, quantization="gguf").create_engine_config()
    assert config.model_config.quantization == "gguf"
    with pytest.raises(ValueError, match="-q/--quantization"):
        EngineArgs(model=tiny_model_dir("llama"), quantization="gguf").create_engine_config()
    # A method upstream knows but this build does not run (awq and gptq are built now).
    quantized = tmp_path / "bnb"
    shutil.copytree(tiny_model_dir("llama"), quantized)
    hf = json.loads((quantized / "config.json").read_text())
    hf["quantization_config"] = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    (quantized / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="quant_method='bitsandbytes'"):
        EngineArgs(model=str(quantized)).create_engine_config()

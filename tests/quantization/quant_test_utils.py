"""Helpers shared by the quantized-model tests: the engine's greedy tokens on
the parity prompts, transformers' (cached per reference dir, or from a
model object), a value read from each worker's model runner, a model's
weight bytes at load, and a TP=2 engine."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tests.models.test_greedy_parity import MAX_TOKENS, _prompts
from tests.utils import hf_greedy
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

_HF: dict[str, list[list[int]]] = {}


def generate(llm: LLM, max_tokens: int = MAX_TOKENS) -> list[list[int]]:
    """The engine's greedy tokens for the parity prompts (no EOS stop)."""
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in _prompts()], sp, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


def expected(ref_dir: str) -> list[list[int]]:
    """transformers' greedy tokens on a reference (dequantized) checkpoint,
    computed once per directory."""
    if ref_dir not in _HF:
        _HF[ref_dir] = hf_greedy(ref_dir, _prompts(), MAX_TOKENS)
    return _HF[ref_dir]


def runner_attr(llm: LLM, fn: Callable[[Any], Any]) -> list[Any]:
    """`fn(model_runner)` on every worker of an in-process engine."""
    return llm.llm_engine.engine_core.engine_core.model_executor.collective_rpc(
        lambda worker: fn(worker.model_runner)
    )


def weight_bytes(model_dir: str, monkeypatch: Any) -> int:
    """The bytes the model's weights take once loaded (bfloat16 model)."""
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    llm = LLM(model=model_dir, dtype="bfloat16", max_model_len=64, seed=0)
    (nbytes,) = runner_attr(llm, lambda r: r.model_memory_usage)
    return nbytes


def tp2_llm(model_dir: str) -> LLM:
    """A float32 engine over two tensor-parallel ranks."""
    llm = LLM(
        model=model_dir,
        dtype="float32",
        max_model_len=128,
        seed=0,
        tensor_parallel_size=2,
        max_num_seqs=8,
    )
    assert llm.llm_engine.vllm_config.parallel_config.tensor_parallel_size == 2
    return llm


def fused_gate_up(quant_config: Any, k: int, sizes: list[int]) -> Any:
    """A float32 gate_up-style fused linear (two parts, with a bias) that
    `quant_config` quantizes; the test loads each part through its loaders."""
    from vllm.model_executor.layers.linear import MergedColumnParallelLinear

    return MergedColumnParallelLinear(
        k,
        sizes,
        bias=True,
        quant_config=quant_config,
        params_dtype=torch.float32,
        prefix="m.gate_up_proj",
    )


def assert_truncated_refused(model_dir: str) -> None:
    """Cut the checkpoint's model.safetensors in half: the engine must refuse
    it at start-up, naming the file."""
    import pytest

    path = f"{model_dir}/model.safetensors"
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"model.safetensors'.*corrupt or truncated"):
        LLM(model=model_dir, dtype="float32", max_model_len=128)

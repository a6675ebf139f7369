"""Shared set-up of the engine-level LoRA tests (issue 18, "what it must show"):
a tiny random Llama, peft adapters on it, transformers' greedy reference of
each merged adapter, and an LLM on either model runner."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from tests.lora.peft_utils import LLAMA_TARGETS, make_peft_adapter
from tests.utils import make_tiny_model, model_greedy

# (name, lora_int_id, rank, alpha, rsLoRA, seed, target modules): random A and
# B (init_lora_weights=False); every attention and MLP projection targeted, the
# last adapter also the input embedding and the LM head.
ADAPTERS = [
    ("r8", 1, 8, 16, False, 11, LLAMA_TARGETS),
    ("r16", 2, 16, 32, False, 12, LLAMA_TARGETS),
    ("r16-rslora", 3, 16, 8, True, 13, LLAMA_TARGETS),
    ("r8-embed-head", 4, 8, 16, False, 14, [*LLAMA_TARGETS, "embed_tokens", "lm_head"]),
]
# Token-id prompts of several lengths; the longest is prefilled in chunks.
PROMPTS = [
    [5, 17, 301, 44, 9],
    [100, 200, 300, 400, 11, 12, 13, 14, 15, 16, 17],
    [i * 7 % 500 + 1 for i in range(40)],
]
MAX_TOKENS = 8


def build_base_and_adapters(root: str) -> tuple[str, dict[str, str]]:
    """The tiny Llama in `root`/base and the ADAPTERS next to it: (base dir,
    adapter name -> dir)."""
    base = make_tiny_model("llama", os.path.join(root, "base"))
    paths = {}
    for name, _, r, alpha, rslora, seed, targets in ADAPTERS:
        path = os.path.join(root, name)
        make_peft_adapter(
            base, path, r=r, lora_alpha=alpha, use_rslora=rslora, seed=seed, target_modules=targets
        )
        paths[name] = path
    return base, paths


def merged_model(base: str, adapter: str | None) -> Any:
    """PeftModel.from_pretrained(base, adapter).merge_and_unload() in float32
    (the base model itself for None)."""
    import transformers as tf
    from peft import PeftModel

    model: Any = tf.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
    return model


def merged_greedy(
    base: str, adapter: str | None, prompts: Sequence[list[int]], max_tokens: int
) -> list[list[int]]:
    """transformers' greedy tokens of `merged_model(base, adapter)`."""
    return model_greedy(merged_model(base, adapter), list(prompts), max_tokens)


def merged_prompt_logprobs(base: str, adapter: str | None, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1]: log p(prompt[i] | prompt[:i]) under the merged model."""
    model = merged_model(base, adapter)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, :-1].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return logprobs[torch.arange(len(prompt) - 1), torch.tensor(prompt[1:])]


@contextmanager
def lora_llm(runner: str, base: str, in_process: bool = False, **kwargs: Any) -> Iterator[Any]:
    """An LLM with LoRA on the V1 ("v1") or V2 ("v2") model runner, float32,
    greedy-friendly defaults; shut down on exit. `in_process`: the engine core
    runs in this process, so one LLMEngine.step() is exactly one engine step."""
    from vllm import LLM

    env = {
        "VLLM_USE_V2_MODEL_RUNNER": {"v1": "0", "v2": "1"}[runner],
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1",
    }
    old = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    args: dict[str, Any] = dict(
        model=base,
        dtype="float32",
        max_model_len=128,
        seed=0,
        enable_lora=True,
        max_loras=2,
        max_lora_rank=16,
        max_num_seqs=8,
        max_num_batched_tokens=32,
    )
    args.update(kwargs)
    try:
        llm = LLM(**args)
        try:
            assert llm.llm_engine.vllm_config.use_v2_model_runner == (runner == "v2")
            yield llm
        finally:
            llm.llm_engine.shutdown()
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def lora_request(name: str, paths: dict[str, str]) -> Any:
    from vllm.lora.request import LoRARequest

    lora_id = next(i for n, i, *_ in ADAPTERS if n == name)
    return LoRARequest(name, lora_id, paths[name])


def greedy_params(max_tokens: int = MAX_TOKENS) -> Any:
    from vllm import SamplingParams

    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def greedy_tokens(
    llm: Any, prompts: Sequence[list[int]], loras: Sequence[Any], max_tokens: int = MAX_TOKENS
) -> list[list[int]]:
    """One LLM.generate call over every (prompt, adapter) pair."""
    from vllm.inputs import TokensPrompt

    sp = greedy_params(max_tokens)
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts],
        sp,
        lora_request=list(loras),
        use_tqdm=False,
    )
    return [list(o.outputs[0].token_ids) for o in outs]

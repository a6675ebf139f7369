"""Builders shared by the scheduler tests: a real VllmConfig over a tiny local
Llama config (no weights), a one-layer fake KV cache config, and requests."""

from __future__ import annotations

import tempfile

import torch

from vllm.config import (
    CacheConfig,
    LoRAConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.config.speculative import SpeculativeConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

EOS_TOKEN_ID = 50
MAX_POSITION_EMBEDDINGS = 16384

_model_dir: tempfile.TemporaryDirectory | None = None


def tiny_model_dir() -> str:
    """A directory holding only the config.json of a tiny LlamaForCausalLM:
    ModelConfig reads it; the scheduler never loads weights."""
    global _model_dir
    if _model_dir is None:
        from transformers import LlamaConfig

        _model_dir = tempfile.TemporaryDirectory(prefix="tiny-llama-config-")
        LlamaConfig(
            vocab_size=256,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=MAX_POSITION_EMBEDDINGS,
            eos_token_id=EOS_TOKEN_ID,
            architectures=["LlamaForCausalLM"],
        ).save_pretrained(_model_dir.name)
    return _model_dir.name


def create_scheduler(
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 8192,
    enable_prefix_caching: bool = False,
    long_prefill_token_threshold: int = 0,
    num_blocks: int = 10000,
    block_size: int = 16,
    max_model_len: int | None = None,
    enable_chunked_prefill: bool = True,
    policy: str = "fcfs",
    async_scheduling: bool = False,
    include_finished_set: bool = False,
    log_stats: bool = False,
    lora_config: LoRAConfig | None = None,
    num_speculative_tokens: int | None = None,
    speculative_method: str = "ngram",
) -> Scheduler:
    """A Scheduler (AsyncScheduler with async_scheduling) over `num_blocks`
    KV blocks of `block_size` tokens; block 0 is the null block. With
    `num_speculative_tokens`, a `speculative_method` SpeculativeConfig (a
    draft model is the tiny config itself)."""
    model_config = ModelConfig(
        model=tiny_model_dir(),
        dtype="float32",
        max_model_len=max_model_len or max_num_batched_tokens,
    )
    speculative_config = None
    if num_speculative_tokens is not None:
        speculative_config = SpeculativeConfig(
            method=speculative_method,  # type: ignore[arg-type]
            model=tiny_model_dir() if speculative_method == "draft_model" else None,
            num_speculative_tokens=num_speculative_tokens,
            target_model_config=model_config,
            target_parallel_config=ParallelConfig(),
        )
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(
            block_size=block_size, enable_prefix_caching=enable_prefix_caching
        ),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            long_prefill_token_threshold=long_prefill_token_threshold,
            policy=policy,
            # With a speculative config the VllmConfig stays synchronous (ngram
            # refuses async scheduling, as upstream); the AsyncScheduler's
            # draft placeholders are tested by passing scheduler_cls.
            async_scheduling=async_scheduling and speculative_config is None,
        ),
        lora_config=lora_config,
        speculative_config=speculative_config,
    )
    vllm_config.cache_config.num_gpu_blocks = num_blocks
    kv_cache_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32
                ),
            )
        ],
    )
    scheduler_cls = AsyncScheduler if async_scheduling else Scheduler
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        include_finished_set=include_finished_set,
        log_stats=log_stats,
    )


def make_request(
    req_id: str,
    num_tokens: int = 10,
    max_tokens: int = 16,
    prompt: list[int] | None = None,
    block_size: int = 16,
    priority: int = 0,
    arrival_time: float = 0.0,
    client_index: int = 0,
    **sampling_kwargs,
) -> Request:
    """One request: `prompt`, or [int(req_id)] * num_tokens; EOS_TOKEN_ID as
    EOS; sha256 block hashes of `block_size` tokens."""
    init_none_hash(sha256)
    if prompt is None:
        prompt = [int(req_id)] * num_tokens
    return Request(
        request_id=req_id,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(max_tokens=max_tokens, **sampling_kwargs),
        eos_token_id=EOS_TOKEN_ID,
        priority=priority,
        arrival_time=arrival_time,
        client_index=client_index,
        block_hasher=get_request_block_hasher(block_size, sha256),
    )


def create_requests(
    num_requests: int,
    num_tokens: int = 10,
    max_tokens: int = 16,
    same_prompt: bool = False,
    block_size: int = 16,
    **sampling_kwargs,
) -> list[Request]:
    """Requests "0", "1", ... arriving in that order, with prompt
    [i] * num_tokens ([0] * num_tokens when same_prompt)."""
    return [
        make_request(
            str(i),
            max_tokens=max_tokens,
            block_size=block_size,
            prompt=[0 if same_prompt else i] * num_tokens,
            arrival_time=float(i),
            **sampling_kwargs,
        )
        for i in range(num_requests)
    ]


def make_model_runner_output(
    scheduler: Scheduler,
    scheduler_output: SchedulerOutput,
    sampled: dict[str, list[int]] | None = None,
    default_token: int = 1,
) -> ModelRunnerOutput:
    """What a model runner returns for `scheduler_output`: `sampled[req_id]`
    or [default_token] for each request whose step reached the end of its
    known tokens, [] for a request still mid-prefill.

    Call it right after the schedule() that produced `scheduler_output`: it
    reads the num_computed_tokens that schedule() advanced.
    """
    sampled = sampled or {}
    req_ids = list(scheduler_output.num_scheduled_tokens)
    tokens = []
    for req_id in req_ids:
        request = scheduler.requests[req_id]
        mid_prefill = request.num_computed_tokens < request.num_tokens
        tokens.append([] if mid_prefill else sampled.get(req_id, [default_token]))
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=tokens,
    )

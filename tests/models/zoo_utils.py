"""Tiny random checkpoints of the model-zoo architectures, built with
transformers (float32, no hub), and the engine-side probes the zoo tests use."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.utils import TINY_SHAPES, TINY_VOCAB, make_tiny_tokenizer

_IDS = dict(vocab_size=TINY_VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
_LLAMA_LIKE = dict(TINY_SHAPES, **_IDS)


@dataclass(frozen=True)
class ZooModel:
    """One architecture: how to build its HF config, and the runner the seed
    rule assigns it ("v1" or "v2")."""

    config_cls: str
    model_cls: str
    kwargs: dict[str, Any]
    runner: str
    # Extra perturbation of the random init (e.g. router weights), applied in place.
    perturb: Callable[[torch.nn.Module], None] | None = field(default=None)
    # State-space models hold one fixed slot per request, so a small cache
    # never forces preemption: the test preempts every running request itself.
    preempt_explicitly: bool = False


def _spread_routers(model: torch.nn.Module) -> None:
    """Routers start near zero (or exactly zero): give them real preferences so
    that top-k routing, not a tie, picks the experts."""
    for name, p in model.named_parameters():
        if name.endswith(
            (
                "mlp.gate.weight",
                "block_sparse_moe.gate.weight",
                "router.weight",
                "router.layer.weight",
                "shared_expert_gate.weight",
            )
        ):
            p.copy_(torch.randn_like(p) * 0.5)


def _scale(
    suffixes: tuple[str, ...], factor: float = 1.0, shift: float = 0.0
) -> Callable[[torch.nn.Module], None]:
    """A perturbation: parameters named with one of `suffixes` become p * factor + shift.

    With a head tied to the embeddings and a 0.02 init, a tiny random model's
    greedy token is just its input token repeated; scaling the blocks' weights
    up makes the layers (attention, positions, windows) decide the output."""

    def perturb(model: torch.nn.Module) -> None:
        for name, p in model.named_parameters():
            if name.endswith(suffixes):
                p.mul_(factor).add_(shift)

    return perturb


def _amplify_mixers(model: torch.nn.Module) -> None:
    """At init the mixers' outputs are tiny next to the residual stream, so the
    greedy token just repeats the input: scale them up so that the SSM state
    decides the output."""
    for name, p in model.named_parameters():
        if name.endswith(("mixer.out_proj.weight", "mixer.in_proj.weight")):
            p.mul_(6.0)


def _moe_kwargs(**extra: Any) -> dict[str, Any]:
    return dict(_LLAMA_LIKE, tie_word_embeddings=False, **extra)


ZOO: dict[str, ZooModel] = {
    "opt": ZooModel(
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            _IDS,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
            word_embed_proj_dim=64,
        ),
        "v2",
        perturb=_scale(("proj.weight", "fc1.weight", "fc2.weight"), 6.0),
    ),
    "opt-proj": ZooModel(
        "OPTConfig",
        "OPTForCausalLM",
        dict(
            _IDS,
            hidden_size=64,
            ffn_dim=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            max_position_embeddings=512,
            word_embed_proj_dim=32,
            do_layer_norm_before=False,
        ),
        "v2",
    ),
    "gpt2": ZooModel(
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(_IDS, n_embd=64, n_layer=2, n_head=4, n_positions=512),
        "v2",
        perturb=_scale(("c_attn.weight", "c_proj.weight", "c_fc.weight"), 6.0),
    ),
    "phi3": ZooModel(
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(_LLAMA_LIKE, partial_rotary_factor=0.5, tie_word_embeddings=False),
        "v2",
    ),
    "gemma2": ZooModel(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            _LLAMA_LIKE,
            head_dim=16,
            query_pre_attn_scalar=16,
            sliding_window=12,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
        ),
        "v2",
        perturb=_scale(
            ("post_attention_layernorm.weight", "post_feedforward_layernorm.weight"), shift=3.0
        ),
    ),
    "mixtral": ZooModel(
        "MixtralConfig",
        "MixtralForCausalLM",
        _moe_kwargs(num_local_experts=4, num_experts_per_tok=2),
        "v1",
        perturb=_spread_routers,
    ),
    "qwen2_moe": ZooModel(
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        _moe_kwargs(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            norm_topk_prob=False,
            decoder_sparse_step=1,
            mlp_only_layers=[1],
        ),
        "v2",
        perturb=_spread_routers,
    ),
    "granitemoe": ZooModel(
        "GraniteMoeConfig",
        "GraniteMoeForCausalLM",
        _moe_kwargs(
            num_local_experts=4,
            num_experts_per_tok=2,
            embedding_multiplier=2.0,
            attention_multiplier=0.2,
            residual_multiplier=0.5,
            logits_scaling=2.0,
        ),
        "v2",
        perturb=_spread_routers,
    ),
    # q_lora_rank set and group-limited routing: 8 experts in 4 groups, 2 eligible.
    "deepseek_v2": ZooModel(
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        _moe_kwargs(
            n_routed_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=1,
            first_k_dense_replace=1,
            kv_lora_rank=32,
            q_lora_rank=48,
            qk_rope_head_dim=8,
            qk_nope_head_dim=16,
            v_head_dim=16,
            head_dim=8,
            topk_method="group_limited_greedy",
            n_group=4,
            topk_group=2,
            routed_scaling_factor=1.5,
            num_key_value_heads=4,
        ),
        "v2",
        perturb=_spread_routers,
    ),
    # No query compression, plain greedy top-k, all layers MoE.
    "deepseek_v2-lite": ZooModel(
        "DeepseekV2Config",
        "DeepseekV2ForCausalLM",
        _moe_kwargs(
            n_routed_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            n_shared_experts=2,
            first_k_dense_replace=0,
            kv_lora_rank=16,
            q_lora_rank=None,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            head_dim=8,
            topk_method="greedy",
            num_key_value_heads=4,
        ),
        "v2",
        perturb=_spread_routers,
    ),
    "mamba": ZooModel(
        "MambaConfig",
        "MambaForCausalLM",
        dict(
            _IDS,
            hidden_size=64,
            state_size=8,
            num_hidden_layers=2,
            intermediate_size=96,
            conv_kernel=4,
            time_step_rank=8,
            use_conv_bias=True,
            use_bias=False,
            tie_word_embeddings=False,
        ),
        "v1",
        perturb=_amplify_mixers,
        preempt_explicitly=True,
    ),
    # Layers 0-2 Gated DeltaNet, layer 3 gated full attention (two KV cache groups).
    "qwen3_5": ZooModel(
        "Qwen3_5TextConfig",
        "Qwen3_5ForCausalLM",
        dict(
            _IDS,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            max_position_embeddings=512,
            tie_word_embeddings=False,
        ),
        "v1",
        preempt_explicitly=True,
    ),
}
# Not in the parity sweep: every layer sliding, for the block-freeing test.
ZOO_EXTRA: dict[str, ZooModel] = {
    "gemma2-sliding": ZooModel(
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(ZOO["gemma2"].kwargs, layer_types=["sliding_attention"] * 2),
        "v2",
    ),
}


def build_zoo_model(kind: str, out_dir: str, seed: int = 0) -> str:
    """Save a tiny random `kind` checkpoint (float32) plus a tokenizer."""
    import transformers as tf

    spec = ZOO[kind] if kind in ZOO else ZOO_EXTRA[kind]
    config = getattr(tf, spec.config_cls)(**spec.kwargs)
    torch.manual_seed(seed)
    model = getattr(tf, spec.model_cls)(config).eval().to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "ln" in name:  # ones/zeros at init: make norm bugs show
                p.add_(torch.randn_like(p) * 0.1)
        if spec.perturb is not None:
            spec.perturb(model)
    model.config.dtype = torch.float32
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    make_tiny_tokenizer(out_dir)
    return out_dir


def runner_of(llm: Any) -> str:
    """ "v1" or "v2": read from the model runner the running engine's worker built
    (needs VLLM_ENABLE_V1_MULTIPROCESSING=0, so the worker is in this process)."""
    executor = llm.llm_engine.engine_core.engine_core.model_executor
    module = type(executor.driver_worker.worker.model_runner).__module__
    if module == "vllm.v1.worker.gpu.model_runner":
        return "v2"
    if module == "vllm.v1.worker.gpu_model_runner":
        return "v1"
    raise AssertionError(f"unknown model runner module {module}")


def preempt_all_at_steps(llm: Any, steps: set[int]) -> None:
    """After each engine-core step numbered in `steps` (1-based), preempt every
    running request through the scheduler (as a reset of the prefix cache with
    running requests does): they resume later by recomputing from scratch."""
    core = llm.llm_engine.engine_core.engine_core
    real_step = core.step_fn
    count = 0

    def step():
        nonlocal count
        result = real_step()
        count += 1
        if count in steps:
            core.scheduler.reset_prefix_cache(reset_running_requests=True)
        return result

    core.step_fn = step


def spy_preemptions(llm: Any) -> list[str]:
    """Record the ids the in-process scheduler preempts (behaviour unchanged)."""
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    preempted: list[str] = []
    real = scheduler._preempt_request

    def spy(request, *args, **kwargs):
        preempted.append(request.request_id)
        return real(request, *args, **kwargs)

    scheduler._preempt_request = spy
    return preempted
